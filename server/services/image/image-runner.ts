/**
 * Runs image tasks: the synchronous ones inside the request that created them (its lease held by
 * the request), and, as a task runner for the engine, `Prefer: respond-async` tasks and
 * synchronous tasks whose request died with its process.
 *
 * `execute` picks the member, asks the provider for the task's images, stores each one and hands
 * it to a sink (the JSON response, the event stream, or nothing), then settles: completed with
 * exactly the delivered images captured and the rest released. A `url` answer's links are made as
 * each image is stored, before anything is charged. When the media store is full or failing (a
 * StorageError: the gateway's own fault, a link it cannot sign included), the images not delivered
 * are released at once and the client gets 507/503 (a stream that delivered some keeps them charged
 * and gets its error event): the task fails, or completes with what was delivered. An image that
 * was produced but could not be recorded for another reason leaves the task `needs_attention` with
 * its credits held for an operator.
 *
 * The one exception is an answer that carries the images' bytes (a synchronous JSON response with
 * `b64_json`): it does not need their stored copies, so each is written while the answer's head goes
 * out, and the settlement follows once they have landed (a completed task never names an image whose
 * bytes a crash lost). Should a copy fail to be written, the client still gets the image and pays
 * for it, and the task's `data` leaves it out.
 */
import sharp from 'sharp';
import { isDatabaseUnavailable } from '../../db/database.ts';
import { ApiError, CutByStop, apiErrorOf, apiErrorOfStorage, databaseUnavailable, noUpstreamCapacity, sentence } from '../../errors.ts';
import type { Logger } from '../../logger.ts';
import { NoCapacity, isFailover, upstreamModelOf, type Pool, type Preselection } from '../../pool/pool.ts';
import { imageMeta } from '../../providers/image-output.ts';
import { ProviderError, asProviderError } from '../../providers/provider-error.ts';
import type { ProviderKind, ProviderRegistry } from '../../providers/registry.ts';
import type { GeneratedImage, ImageEvents, ImageInputRefusal, ImageInputShape, ImageInputSize, ImageJob, ImageParams, UpstreamAccount } from '../../providers/types.ts';
import type { FileRow } from '../../repositories/file.repository.ts';
import type { ImageTaskRepository, ImageTaskRow } from '../../repositories/image-task.repository.ts';
import type { TaskAttemptRepository } from '../../repositories/task-attempt.repository.ts';
import { fenceOf, type Fence } from '../../repositories/leased-tasks.ts';
import { StorageError, type FileService, type StoreFileInput } from '../file.service.ts';
import type { RetryPolicy } from '../tasks/retry-policy.ts';
import { AttemptLog } from '../tasks/attempt-log.ts';
import type { Settlement } from '../tasks/settlement.ts';
import { DONE, LeaseLost, later, type StepResult, type TaskRunner } from '../tasks/task-runner.ts';

export const IMAGE_RETRY: RetryPolicy = { maxRetries: 2, baseDelayMs: 2000, maxDelayMs: 10_000 };

/** The last error of a task whose step stopped during its upstream call (ImageRunner.step). */
const CUT_CALL = 'The worker running this task stopped during its upstream call; the call is made again, counted as a retry.';

/**
 * The signal a background task's step runs under (ImageRunner.step): it aborts when the lease is
 * lost, and when the engine stops (TaskEngine.stop), except while an upstream call is in flight
 * without a job the task recorded. Cut short, such a call (a synchronous upstream such as OpenAI's
 * has no job to record) may still be made and billed upstream, and the next step would make it
 * again: so the stop waits for its answer (the engine's heartbeat keeps the lease meanwhile), and
 * the step then settles what it got. Bounded by the adapter's own timeout and by the process's
 * forced exit (SHUTDOWN_GRACE_MS + 5 s), which cuts it as a crash would (the next step counts it as
 * a retry). A call whose job is recorded (or a resumed one) is cut at once: the next step collects
 * that job. Once stopping, no call starts (nor a failover to another member).
 */
export class UpstreamCallDrain {
  private readonly controller = new AbortController();
  readonly signal = this.controller.signal;
  /** `before`: no call has gone out yet; `calling`: one is in flight; `after`: one ended, the step settles what it gave. */
  private phase: 'before' | 'calling' | 'after' = 'before';
  private readonly onLost = () => this.controller.abort(this.lost.reason);
  private readonly onStop = () => this.cutIfStopping();

  constructor(
    private readonly stopping: AbortSignal,
    private readonly lost: AbortSignal,
    /** The call collects a job the task recorded already (`ExecuteOptions.resume`): a stop cuts it. */
    private recorded = false,
  ) {
    if (lost.aborted) this.onLost();
    else lost.addEventListener('abort', this.onLost, { once: true });
    if (stopping.aborted) this.onStop();
    else stopping.addEventListener('abort', this.onStop, { once: true });
  }

  /** The engine is stopping: no call may start, nor fail over to another member. */
  get stopped(): boolean {
    return this.stopping.aborted;
  }

  /** An upstream call is about to go out; throws, and cuts the step, when the engine is stopping. */
  start(): void {
    if (this.stopping.aborted) {
      this.controller.abort(this.stopping.reason);
      throw this.signal.reason;
    }
    this.phase = 'calling';
  }

  /** The call's job is recorded (`ImageEvents.submitted`): a stop may cut it now, the next step collects that job. */
  jobRecorded(): void {
    this.recorded = true;
    this.cutIfStopping();
  }

  /** No upstream call of this step went out, and it collects no recorded job: a stop leaves nothing upstream to count. */
  get untouched(): boolean {
    return this.phase === 'before' && !this.recorded;
  }

  /** The call ended, answered or failed: a stop no longer cuts the step, which only settles what the call gave. */
  end(): void {
    this.phase = 'after';
  }

  close(): void {
    this.lost.removeEventListener('abort', this.onLost);
    this.stopping.removeEventListener('abort', this.onStop);
  }

  private cutIfStopping(): void {
    if (!this.stopping.aborted) return;
    if (this.phase === 'before' || (this.phase === 'calling' && this.recorded)) this.controller.abort(this.stopping.reason);
  }
}

export type ImageOperation = 'generation' | 'edit';

/** An image as a sink receives it. */
export interface SinkImage {
  bytes: Buffer;
  /** Its stored file (its row written already when the sink publishes files). */
  file: FileRow;
  /** The link to its file, for a `url` answer (made before the sink sees it). */
  url?: string;
  /** Its token usage as the upstream reported it (a stream's `completed` event carries it). */
  usage?: GeneratedImage['usage'];
}

/** An ImageSink's rejection when its client went away: the image was not delivered. Any other rejection is a failure of its own. */
export class ClientGone extends Error {
  override readonly name = 'ClientGone';
}

/** Where finished images go. `image` resolves once the client has the image (stream) or at once. */
export interface ImageSink {
  /**
   * The sink hands images to its client while the task runs (a stream): each file's row is written,
   * fenced by the task's attempt, before the sink sees it, so that a task whose request stops
   * records exactly the images sent. Otherwise the rows are written when the task completes, by the
   * statement that settles it.
   */
  readonly publishesFiles?: boolean;
  /** Rejects with ClientGone when the client went away. */
  partial(imageIndex: number, partialIndex: number, image: Buffer): Promise<void>;
  /** Rejects with ClientGone when the client went away. */
  image(imageIndex: number, image: SinkImage): Promise<void>;
  /**
   * A member was found and its upstream call starts: a stream sends its status line now, so that
   * what fails before (no member, no capacity after the wait) is still answered with its status.
   */
  calling?(): void;
}

export const NULL_SINK: ImageSink = { partial: async () => undefined, image: async () => undefined };

/** What a synchronous answer carries: the delivered images, their files and (a `url` answer) their links. */
export interface DeliveredImages {
  files: FileRow[];
  images: Buffer[];
  /** The links to `files`, in their order, for a `url` answer; empty otherwise. */
  links: string[];
  /** The upstream's revised prompt, when it gives one. */
  revisedPrompt?: string;
}

export interface ExecuteResult extends DeliveredImages {
  status: 'completed' | 'failed' | 'needs_attention';
  /** Set when the provider failed after some images were delivered (streams report it as `event: error`). */
  error?: ApiError;
  /** Micro-credits the settlement captured (0 when nothing was delivered). */
  captured: number;
}

/** The bytes of a task's inputs, in `inputFileIds` order, and of its mask. */
export interface InputBytes {
  images: Buffer[];
  mask?: Buffer;
  /** Their sizes as the request measured them (ImageService.prepare): not read from the bytes again. */
  shape?: ImageInputShape;
}

export interface ExecuteOptions {
  /**
   * A JSON response: nothing reaches the client until it is written, so an abort delivers nothing.
   * With `b64_json` the answer carries the images' bytes, not links to their stored copies, so each
   * image is stored while the answer's head goes out, before the task settles (storeWhileSettling).
   */
  deliveredOnlyIfAllSent?: boolean;
  /** How long to wait for a free upstream member before answering 503 no_upstream_capacity (synchronous requests). */
  capacityWaitMs?: number;
  /** Throw NoCapacity instead of failing the task when every member is busy (background tasks). */
  requeueWhenBusy?: boolean;
  /** The routing order drawn as the task was inserted (`preselect`): the pool follows it. */
  routeOrder?: readonly string[];
  /** The inputs' bytes when the caller holds them already (a synchronous edit read them to check them): not read again. */
  inputBytes?: InputBytes;
  /**
   * An upstream job an earlier attempt of this background task recorded (`ImageEvents.submitted`):
   * collected on its member, with the slots the row holds there, without routing (no failover).
   */
  resume?: { account: UpstreamAccount; ref: unknown };
  /**
   * A JSON answer written while the task settles: called with what was delivered as the settlement
   * starts. The caller writes all of the answer but its last bytes, which wait until `execute` has
   * returned, i.e. until the settlement has committed: an answer is never complete before its charge
   * is durable, and a crash before the commit leaves a truncated, uncharged answer.
   */
  whileSettling?: (delivered: DeliveredImages) => Promise<void>;
  /**
   * A background task's step (`step`): its upstream calls report to it, so that an engine's stop
   * waits for a call in flight whose job is not recorded, and no call (no failover) starts once
   * stopping. `signal` is its signal.
   */
  drain?: UpstreamCallDrain;
}

/** What a client is told when no member can take its image now: the gateway's side (503), never the client's limits (429). */
function noCapacityError(err: NoCapacity, model: string): ApiError {
  if (err.reason === 'none') return new ApiError(503, 'no_reachable_member', `No backend member can take work for model '${model}' now: every member that serves it is disabled or out of rotation (rejected credentials, a disabled upstream account, or the model refused upstream); the operator sees which in the group's member list.`);
  return noUpstreamCapacity(model, err.retryAfterMs, err.reason === 'full' ? 'every one is at its concurrency limit' : 'every one is cooling down after failures or rate limits');
}

const MIME: Record<string, string> = { png: 'image/png', jpeg: 'image/jpeg', webp: 'image/webp' };

/** The pixel size of an upstream's image returned at its native size (the header, else sharp; fitImage has decoded it). */
async function nativeSize(image: Buffer): Promise<{ width: number; height: number }> {
  const meta = await imageMeta(image);
  if (!meta.width || !meta.height) throw new ProviderError('retryable', 'the upstream answered an image without a pixel size', { maybeAccepted: true });
  return { width: meta.width, height: meta.height };
}

/**
 * The inputs' sizes as inspectImage measured them before the task was created (upright: the EXIF
 * orientation applied), read again from their headers: the task keeps only their files.
 */
async function measureInputs(inputs: Buffer[], mask: Buffer | undefined): Promise<ImageInputShape> {
  const size = async (image: Buffer): Promise<ImageInputSize> => {
    const meta = await sharp(image, { limitInputPixels: false }).metadata();
    return { width: meta.autoOrient?.width ?? meta.width, height: meta.autoOrient?.height ?? meta.height };
  };
  return { images: await Promise.all(inputs.map(size)), ...(mask && { mask: await size(mask) }) };
}

/** The upstream no longer has a job or its outputs (a resumed job collected too late). */
const jobGone = (err: ProviderError) => err.kind === 'failed' && [403, 404, 410].includes(err.upstreamStatus ?? 0);

/** An image the provider produced could not be stored: the outcome is unknown. */
class NotStored extends Error {}
/** The sink could not deliver an image: the client went away. */
class NotDelivered extends Error {}

export interface ImageRunnerDeps {
  tasks: ImageTaskRepository;
  pool: Pool;
  providers: ProviderRegistry;
  files: FileService;
  settlement: Settlement;
  /** Where a step's calls upstream are recorded when no settlement statement carries them (a step retried later). */
  attempts: TaskAttemptRepository;
}

export class ImageRunner implements TaskRunner<ImageTaskRow> {
  readonly name = 'image';
  readonly leases;
  readonly retry = IMAGE_RETRY;

  constructor(private readonly deps: ImageRunnerDeps) {
    this.leases = deps.tasks.leases;
  }

  /**
   * The routing order of a synchronous task, drawn before its row is inserted (Pool.preselect): its
   * `first` member is named on the row as it is inserted (else the member is taken after the
   * insert), and `execute` follows its `order` (`ExecuteOptions.routeOrder`).
   */
  preselect(task: { groupId: string; model: string; operation: ImageOperation; prompt: string; n: number; params: ImageParams; inputs?: ImageInputShape }): Promise<Preselection> {
    const job: ImageJob = { ...task, inputs: [] };
    const { inputs } = task;
    return this.deps.pool.preselect({
      groupId: task.groupId,
      model: task.model,
      capability: 'image',
      slots: (provider) => this.slotsFor(provider, job),
      // Drawn among the members `execute` routes the edit to.
      ...(inputs && { accepts: (account: UpstreamAccount) => this.refusal(account, task.model, inputs) === undefined }),
    });
  }

  /**
   * Why the upstreams serving the model cannot take an edit's inputs, before anything is held: the
   * first member's refusal when every member's upstream refuses (each with its own upstream model),
   * else undefined, and the task goes only to members whose upstream takes them (`execute`).
   */
  async inputRefusal(task: { groupId: string; model: string }, inputs: ImageInputShape): Promise<ImageInputRefusal | undefined> {
    const accounts = await this.deps.pool.serving({ groupId: task.groupId, model: task.model, capability: 'image' });
    const refusals = accounts.map((account) => this.refusal(account, task.model, inputs));
    if (refusals.length === 0 || refusals.some((r) => r === undefined)) return undefined;
    return refusals[0];
  }

  /** Why the member's adapter cannot take the inputs on its upstream model (ImageProvider.checkInputs), or undefined. */
  private refusal(account: UpstreamAccount, model: string, inputs: ImageInputShape): ImageInputRefusal | undefined {
    return this.deps.providers.image(account.provider)?.checkInputs?.(inputs, upstreamModelOf(account, model));
  }

  /** Upstream calls the provider's adapter would run at once for the job (one member slot each). */
  private slotsFor(provider: ProviderKind, job: ImageJob): number {
    return this.deps.providers.image(provider)?.parallelCalls?.(job) ?? 1;
  }

  /**
   * One step of a background task. `leaseLost` (TaskRunner.step): what alone may cut short an
   * upstream call in flight whose job is not recorded (UpstreamCallDrain): a stop waits for it.
   */
  async step(task: ImageTaskRow, signal: AbortSignal, log: Logger, leaseLost: AbortSignal = signal): Promise<StepResult> {
    if (!task.runAsync) {
      await this.endInterrupted(task, log);
      return DONE;
    }
    // A task whose step stopped while an upstream job it recorded ran collects that job on its member
    // (still holding the member's slots: the job runs there) instead of paying for another.
    const resume = await this.resumable(task, log);
    // Otherwise a row that still names a member is a step that stopped during its upstream call (its
    // worker died, or a stop's forced exit cut it): that call may have made, and billed, the images.
    // It counts as a try (a retry, in the statement that gives back the member's slots, which would
    // otherwise keep the task itself off a full member); past the retry policy it is not made again.
    if (!resume && task.memberId !== null) {
      if (task.retries >= this.retry.maxRetries) {
        const tries = task.retries + 1;
        log.error({ memberId: task.memberId, retries: task.retries }, 'image task failed: its upstream call was cut short by its worker stopping and its retries are used up; the upstream may have made the images');
        const failed = await this.deps.settlement.failImage(
          fenceOf(task),
          'upstream_error',
          `The upstream call of this task was made ${tries} times, the last one cut short when the worker running it stopped; it is not made again (the upstream may have produced the images already). Nothing was charged; the credits were released.`,
        );
        if (!failed) throw new LeaseLost(`task ${task.id} was taken over by another worker`);
        return DONE;
      }
      if (!(await this.deps.tasks.releaseMember(fenceOf(task), CUT_CALL))) throw new LeaseLost(`task ${task.id} was taken over by another worker`);
      log.warn({ memberId: task.memberId, retries: task.retries + 1 }, 'calling the upstream again: the previous step of this image task stopped during its upstream call (counted as a retry)');
      // The engine decides the retry after a failure of this step by the row's count (TaskEngine.run).
      task.retries += 1;
    }
    const drain = new UpstreamCallDrain(signal, leaseLost, resume !== undefined);
    try {
      await this.execute(task, NULL_SINK, drain.signal, log, { requeueWhenBusy: true, drain, ...(resume && { resume }) });
    } catch (err) {
      // Every member is busy: the task waits its turn (no retry counted, the count kept, nothing charged).
      if (err instanceof NoCapacity) return later(Math.max(250, Math.min(err.retryAfterMs, 60_000)));
      // execute() settled the task (failed, or needs_attention) before raising an ApiError.
      if (!(err instanceof ApiError)) throw err;
    } finally {
      drain.close();
    }
    return DONE;
  }

  /**
   * Stops, where its upstream can, the job a background task recorded and nobody will collect now
   * (the task ended without it: the task sweeper failed it past its lifetime). Best effort: logged;
   * `signal` (the sweeper stopping) cuts it short.
   */
  async cancelRecorded(task: ImageTaskRow, signal: AbortSignal, log: Logger): Promise<void> {
    if (task.upstreamJob === null || task.memberId === null) return;
    try {
      const account = await this.deps.pool.account(task.memberId);
      const provider = account && this.deps.providers.image(account.provider);
      if (!account || !provider?.cancel) return;
      await provider.cancel(account, task.upstreamJob, AbortSignal.any([signal, AbortSignal.timeout(10_000)]));
      log.info({ memberId: task.memberId }, 'cancelled the upstream image job of a task that ended without it');
    } catch (err) {
      log.warn({ err, memberId: task.memberId }, 'could not cancel the upstream image job of a task that ended without it');
    }
  }

  /** The upstream job a background task recorded and can still collect: its member's account and the job's reference. */
  private async resumable(task: ImageTaskRow, log: Logger): Promise<ExecuteOptions['resume']> {
    if (task.upstreamJob === null || task.memberId === null) return undefined;
    const account = await this.deps.pool.account(task.memberId);
    // The member was deleted (or is no longer the provider of the job): the job cannot be reached.
    if (!account) {
      log.warn({ memberId: task.memberId }, 'the member that runs the image task\'s upstream job is gone; submitting a new job');
      return undefined;
    }
    log.info({ memberId: task.memberId }, 'resuming the upstream image job an earlier attempt submitted');
    return { account, ref: task.upstreamJob };
  }

  /**
   * Ends a synchronous task whose request is gone (its process stopped, or its settlement failed):
   * what an engine's step and the task sweeper do with one. False: the fence no longer holds.
   */
  async endInterrupted(task: ImageTaskRow, log: Logger): Promise<boolean> {
    // A streamed request may have delivered images before it could be charged for them: each one's
    // row was written before its event went out, so one that recorded none delivered none and is
    // failed and released; one that recorded some waits for an operator (imageStreamInterrupted).
    if ((task.params as unknown as ImageParams).stream) {
      return (await this.deps.settlement.imageStreamInterrupted(fenceOf(task))) !== undefined;
    }
    // A JSON answer is never complete before its settlement commits, so its client got a broken or
    // cut-short answer: nothing is delivered and nothing is charged.
    const ended = await this.deps.settlement.failImage(fenceOf(task), 'interrupted', 'The request was interrupted before its images were delivered; the credits were released.');
    if (ended) log.warn('interrupted synchronous image task failed and released');
    return ended !== undefined;
  }

  /** After the last retry: the task fails with the code of whoever's fault the last failure was. */
  async giveUp(task: ImageTaskRow, err: unknown, log: Logger): Promise<void> {
    log.error({ err }, 'image task failed after its last retry');
    const api = err instanceof ProviderError ? apiErrorOf(err, task.model) : err instanceof StorageError ? apiErrorOfStorage(err) : undefined;
    const reason =
      err instanceof ProviderError
        ? err.kind === 'rate_limited'
          ? 'The upstream kept rate-limiting the request'
          : `The upstream failed ${task.retries + 1} times in a row (last: ${sentence(err.message)})`
        : err instanceof StorageError
          ? `The gateway's media storage ${err.condition === 'full' ? 'is full' : 'could not be read or written'} (not a fault of the request)`
          : 'An internal error stopped the task (the server log has its details)';
    await this.deps.settlement.failImage(fenceOf(task), api?.code ?? 'internal_error', `${reason}; the credits were released.`);
  }

  /**
   * Writes the row of an image a stream is about to send, in one statement fenced by the task's
   * attempt (ImageTaskRepository.recordStreamed), so that a task whose request stops counts exactly
   * the images sent. Refused, the task was taken over: its new owner settles it with the images
   * recorded so far, and nothing more goes to the client (LeaseLost).
   */
  private async recordStreamed(fence: Fence, file: FileRow): Promise<void> {
    let recorded: boolean;
    try {
      recorded = await this.deps.tasks.recordStreamed(fence, file);
    } catch (err) {
      await this.deps.files.discardUnrecorded(file);
      throw new NotStored('the image could not be recorded', { cause: err });
    }
    if (!recorded) {
      await this.deps.files.discardUnrecorded(file);
      throw new LeaseLost(`task ${fence.id} was taken over by another worker`);
    }
  }

  /**
   * Produces the task's images into `sink`, then settles. Stops early when `signal` aborts (the
   * client went away). With `deliveredOnlyIfAllSent` (a JSON response: nothing reaches the client
   * until it is written) an aborted request delivers nothing. Fenced by the task's attempt.
   */
  async execute(task: ImageTaskRow, sink: ImageSink, signal: AbortSignal, log: Logger, opts: ExecuteOptions = {}): Promise<ExecuteResult> {
    const fence = fenceOf(task);
    const params = task.params as unknown as ImageParams;
    const inputs = opts.inputBytes?.images ?? (await Promise.all(task.inputFileIds.map((id) => this.deps.files.readAll(id))));
    const mask = opts.inputBytes ? opts.inputBytes.mask : task.maskFileId ? await this.deps.files.readAll(task.maskFileId) : undefined;
    // The task's id goes with every call made for it: an upstream that keys its jobs by it (Kling)
    // knows a resubmit of the task (after a stopped try, or a failover) for the job it already has.
    const job = { taskId: task.id, operation: task.operation as ImageOperation, model: task.model, prompt: task.prompt, n: task.n, params, inputs, ...(mask && { mask }) };
    // An edit's inputs as the adapters judge them: a routed task goes only to members that take them.
    const shape = opts.resume || inputs.length === 0 ? undefined : (opts.inputBytes?.shape ?? (await measureInputs(inputs, mask)));
    /** Something reached the sink (a partial or an image): from then on there is no failover. */
    let reachedSink = false;
    /** Each member's generate call, written by the statement that settles the task. */
    const attempts = new AttemptLog(task.id);

    const files: FileRow[] = [];
    /** Files whose rows are written by the statement that finishes the task (all of them unless the sink publishes files). */
    const unrecorded: FileRow[] = [];
    const discard = (file: FileRow) => (sink.publishesFiles ? this.deps.files.discard(file) : this.deps.files.discardUnrecorded(file));
    const images: Buffer[] = [];
    /**
     * A synchronous `url` answer's links (`links`, in `files` order), each made as its image is
     * stored, before anything is charged: a store that cannot sign one fails the request as a store
     * that cannot write does, never after the charge. A background task's are made when it is polled.
     */
    const linked = params.responseFormat === 'url' && !task.runAsync;
    const links: string[] = [];
    /** An upstream job this attempt recorded (`events.submitted`), or the recorded one it resumed: a later step can collect it. */
    let jobRecorded = opts.resume !== undefined;
    // The answer carries the bytes (see the class comment): files are written while its head goes out, before the task settles.
    const storeWhileSettling = opts.deliveredOnlyIfAllSent === true && !sink.publishesFiles && params.responseFormat !== 'url';
    /**
     * storeWhileSettling: the copies to write while the answer's head goes out, before the
     * settlement (their writes never reject), and the files whose copies failed.
     */
    const copies: (() => Promise<void>)[] = [];
    const lost: FileRow[] = [];
    const storeLater = (meta: StoreFileInput, image: Buffer): FileRow => {
      const { file, write } = this.deps.files.deferredPut(meta, image);
      copies.push(() =>
        write().catch((err: unknown) => {
          lost.push(file);
          log.error({ err, fileId: file.id }, 'image delivered in the answer but its stored copy could not be written');
        }),
      );
      return file;
    };
    // Set inside the event callbacks; an object so TypeScript does not narrow it to null.
    const upstream: { revisedPrompt: string | null } = { revisedPrompt: null };
    const events: ImageEvents = {
      partial: async (imageIndex, partialIndex, image) => {
        reachedSink = true;
        try {
          await sink.partial(imageIndex, partialIndex, image);
        } catch (err) {
          throw err instanceof ClientGone ? new NotDelivered() : err;
        }
      },
      image: async (imageIndex, generated) => {
        if (signal.aborted) throw new NotDelivered();
        reachedSink = true;
        upstream.revisedPrompt ??= generated.revisedPrompt ?? null;
        // `resize: native`: the upstream's image kept its own size, which is what its file records.
        const { width, height } = params.resize === 'native' ? await nativeSize(generated.image) : params;
        let file: FileRow;
        try {
          const meta = { accountId: task.accountId, purpose: 'image_output' as const, contentType: MIME[params.outputFormat]!, taskId: task.id, width, height };
          file = storeWhileSettling ? storeLater(meta, generated.image) : await this.deps.files.put(meta, generated.image);
        } catch (err) {
          // A full or failing store is known and the gateway's own: not an unknown outcome.
          if (err instanceof StorageError) throw err;
          throw new NotStored('the image could not be stored', { cause: err });
        }
        let url: string | undefined;
        if (linked) {
          try {
            url = await this.deps.files.downloadUrl(file.id, 'image_output');
          } catch (err) {
            await this.deps.files.discardUnrecorded(file);
            // A link that could not be made is the store's failure (FileService: StorageUnavailable).
            throw err;
          }
        }
        if (sink.publishesFiles) await this.recordStreamed(fence, file);
        try {
          await sink.image(imageIndex, { bytes: generated.image, file, ...(url !== undefined && { url }), ...(generated.usage && { usage: generated.usage }) });
        } catch (err) {
          // Not delivered: not counted (the client went away while it was being sent, or the sink failed).
          await discard(file);
          throw err instanceof ClientGone ? new NotDelivered() : err;
        }
        files.push(file);
        if (url !== undefined) links.push(url);
        if (!sink.publishesFiles) unrecorded.push(file);
        images.push(generated.image);
      },
      // A background task records each upstream job as it is accepted: a later step collects it.
      ...(task.runAsync && {
        submitted: async (ref: unknown) => {
          let recorded: boolean;
          try {
            recorded = await this.deps.tasks.recordUpstreamJob(fence, ref);
          } catch (err) {
            // The upstream has the job (billed) and no later step can find it: never submitted again.
            throw new ProviderError('retryable', 'the upstream accepted the image job, but it could not be recorded', { cause: err, maybeAccepted: true });
          }
          if (!recorded) throw new LeaseLost(`task ${task.id} was taken over by another worker`);
          jobRecorded = true;
          opts.drain?.jobRecorded();
        },
      }),
    };
    /** The provider's call on `account` (`resume`: the recorded job to collect there). */
    const generate = async (account: UpstreamAccount, slots: number, resume?: unknown) => {
      // An aggregator runs the model through its mapping, and may take the inputs by URL.
      const mapping = await this.deps.pool.mappingFor(account, task.model);
      const viaMapping = mapping && { mapping, inputFiles: await this.deps.files.mediaInputs([...task.inputFileIds, ...(task.maskFileId ? [task.maskFileId] : [])]) };
      const upstreamJob = { ...job, model: upstreamModelOf(account, task.model), slots, ...viaMapping, ...(resume !== undefined && { resume }) };
      opts.drain?.start();
      sink.calling?.();
      try {
        return await attempts.run('generate', account, null, () => this.deps.providers.image(account.provider)!.generate(account, upstreamJob, signal, events), { signal });
      } finally {
        opts.drain?.end();
      }
    };

    let failure: ApiError | undefined;
    try {
      if (opts.resume) {
        const { account, ref } = opts.resume;
        await this.deps.pool.health.observeAccepted(account, () => generate(account, task.memberSlots, ref), signal);
      } else await this.deps.pool.route(
        {
          groupId: task.groupId,
          model: task.model,
          capability: 'image',
          // An adapter that splits the job into parallel calls takes a member slot for each.
          slots: (provider) => this.slotsFor(provider, job),
          // An edit goes only to members whose upstream takes its inputs, never to one that would
          // refuse them after the hold (creation refused it when none takes them: ImageService.prepare).
          ...(shape && { accepts: (account: UpstreamAccount) => this.refusal(account, task.model, shape) === undefined }),
          // A synchronous task was inserted with its routing order drawn, naming its first member (preselect).
          ...(opts.routeOrder && { order: opts.routeOrder }),
          ...(!task.runAsync && task.memberId !== null && { first: { memberId: task.memberId, slots: task.memberSlots } }),
          take: async (memberId, db, slots) => {
            if (!(await this.deps.tasks.assignMember(fence, memberId, slots, db))) throw new LeaseLost('lease lost before the upstream call');
          },
          release: async () => void (await this.deps.tasks.releaseMember(fence)),
          // Neither once the client has something, nor after a call the upstream may have taken or
          // did take (its job billed: another member would run, and bill, a second one; design §8).
          // Nor once the engine is stopping: a call started now would be cut by the stop's deadline.
          canFailover: (err) => !reachedSink && !err.maybeAccepted && !err.jobKept && !opts.drain?.stopped,
          waitMs: opts.capacityWaitMs ?? 0,
          signal,
          log,
        },
        generate,
      );
    } catch (err) {
      // Another worker owns the task now (a stream's image row was refused, the member could not be
      // taken): it settles the task, with the images this request recorded; nothing more is sent.
      if (err instanceof LeaseLost) {
        for (const file of unrecorded) await this.deps.files.discardUnrecorded(file);
        // The calls it made upstream (paid for) stay on record for whoever settles the task.
        await attempts.write(this.deps.attempts, log);
        throw err;
      }
      if (err instanceof NoCapacity) {
        if (opts.requeueWhenBusy && err.reason !== 'none') throw err;
        const api = noCapacityError(err, task.model);
        await this.deps.settlement.failImage(fence, api.code, api.message, attempts.take());
        throw new ApiError(api.status, api.code, `${api.message} Task ${task.id} failed; nothing was charged.`, null, {}, api.headers);
      }
      if (err instanceof StorageError) {
        const api = apiErrorOfStorage(err);
        const what = err.condition === 'full' ? 'is full' : 'is unavailable';
        log.error({ err, delivered: files.length, n: task.n }, `an image could not be stored: the media store ${what}; the images not delivered are released`);
        // Nothing reached the client yet (or, in a JSON answer, nothing will): the task fails, every credit released.
        if (files.length === 0 || opts.deliveredOnlyIfAllSent) {
          for (const file of files) await discard(file);
          await this.deps.settlement.failImage(fence, api.code, `The gateway's media storage ${what}, so the images could not be delivered; the credits were released.`, attempts.take());
          throw new ApiError(api.status, api.code, `${api.message} Task ${task.id} failed; nothing was charged.`, null, {}, api.headers);
        }
        failure = new ApiError(api.status, api.code, `The gateway's media storage ${what}: ${files.length} of ${task.n} images were delivered and only those are charged.`, null, {}, api.headers);
      } else if (err instanceof NotStored) {
        log.error({ err: err.cause, stored: files.length }, 'image produced but not stored: task needs attention');
        // Only a stream has handed images to its client before the task completes (a JSON answer
        // is never written now, a background task shows its images once it completes): a refund
        // charges for those alone.
        const delivered = opts.deliveredOnlyIfAllSent || sink === NULL_SINK ? 0 : files.length;
        await this.deps.settlement.imageNeedsAttention(fence, 'The image was generated but could not be stored; an operator will settle this task.', { files, unrecorded, delivered }, attempts.take());
        throw new ApiError(500, 'internal_error', `The image was generated but could not be stored; task ${task.id} needs attention and its credits stay held until an operator settles it.`);
      } else if (!(err instanceof NotDelivered) && !signal.aborted) {
        // The upstream's failures reach here as ProviderErrors (the adapters and providers/upstream-http.ts
        // classify every answer, network error and undecodable image); anything else is the gateway's
        // own (its database, a bug) and is blamed on it, never on the upstream. A background task
        // still tries it again later, as a passing failure.
        const ours = !(err instanceof ProviderError);
        const error = asProviderError(err, 'The image provider failed to generate the image; the credits were released.');
        if (ours) log.error({ err, delivered: files.length }, 'image generation failed inside the gateway');
        else log.warn({ err, delivered: files.length }, 'image provider failed');
        const blamed = () => (ours ? gatewayFailure(err) : apiErrorOf(error, task.model));
        if (files.length === 0) {
          // A background task tries a passing failure again later (IMAGE_RETRY, or the upstream's
          // Retry-After): the engine retries it; nothing is settled now. So does a resumed job's
          // member that cannot take work any more (its credentials, its account), or a job (or its
          // output links) the upstream no longer has (404/410, an expired link's 403): the next try
          // is routed afresh and submits a new job, as a first try would have failed over.
          // Not so a call the upstream may have taken without a job this task recorded, or whose
          // recorded job is not kept for the next try (done and paid for, its output unusable): a
          // new submit would pay for the images twice; the task fails and is released (a kept job
          // is collected by the next step instead: `resumable`).
          const unfindable = error.maybeAccepted && !(jobRecorded && error.jobKept);
          if (opts.requeueWhenBusy && !unfindable && (error.transient || (opts.resume && (isFailover(error) || jobGone(error))))) {
            await attempts.write(this.deps.attempts, log);
            // A recorded job the upstream still has (not cancelled: it runs, or it is done and billed,
            // its output not fetched; Kling cannot cancel at all) stays on the row with its member:
            // the next try collects it there (`resumable`). Any other was given up on (cancelled) or
            // is gone: forgotten, and the next try starts afresh.
            const kept = error.transient && error.jobKept && jobRecorded;
            if (!kept && !(await this.deps.tasks.releaseMember(fence))) throw new LeaseLost(`task ${task.id} was taken over by another worker`);
            throw error;
          }
          const api = blamed();
          await this.deps.settlement.failImage(fence, api.code, api.message, attempts.take());
          throw new ApiError(api.status, api.code, `${api.message} Task ${task.id} failed; nothing was charged.`, api.param, api.extra, api.headers);
        }
        // Blamed as the zero-image case is (a refusal of the client's prompt stays a 400
        // content_policy_violation, a rate limit keeps its code and Retry-After), plus what was charged.
        const api = blamed();
        failure = new ApiError(api.status, api.code, `${api.message} ${files.length} of ${task.n} images were delivered and only those are charged.`, api.param, api.extra, api.headers);
      }
    }

    // An abort that is not the client's: the lease was lost (another worker owns the task now), or
    // the engine is stopping (a respond-async task has no client). Nothing is settled here: the
    // task's next owner settles it (an engine's step resumes after the lease runs out).
    if (signal.aborted && (task.runAsync || signal.reason instanceof LeaseLost)) {
      for (const file of unrecorded) await this.deps.files.discardUnrecorded(file);
      // Stopped before its upstream call went out: the member it took is given back, so that the
      // next step does not count a call that was never made (`step`). Best effort: fenced.
      if (opts.drain?.untouched && !(signal.reason instanceof LeaseLost)) await this.deps.tasks.releaseMember(fence).catch(() => false);
      throw signal.reason instanceof LeaseLost ? signal.reason : new LeaseLost(`stopped: ${String(signal.reason)}`);
    }
    if (opts.deliveredOnlyIfAllSent && signal.aborted) {
      for (const file of files) await discard(file);
      files.length = 0;
      unrecorded.length = 0;
      links.length = 0;
    }
    // Nothing reached the client (it left, or the stop cut it off): the task fails, every credit released.
    const undelivered = async (what: string): Promise<ExecuteResult> => {
      const [code, who] = cutOff(signal);
      const failed = await this.deps.settlement.failImage(fence, code, `${who} before ${what} delivered; the credits were released.`, attempts.take());
      // The fence did not hold: another worker owns the task, and this request answers nothing as if it had.
      if (!failed) throw new LeaseLost(`task ${task.id} was taken over by another worker`);
      return { status: 'failed', files: [], images, links: [], captured: 0 };
    };
    if (files.length === 0) return undelivered('any image was');
    const { revisedPrompt } = upstream;
    // The answer's head goes out (whileSettling; its writes never fail the task) while the copies
    // (storeWhileSettling) are written; the settlement waits for the copies, so a completed task
    // names only images whose bytes have landed: a process that dies after the commit, its answer
    // cut, leaves a charged client images it can still fetch (GET /v1/images/{id}), never rows
    // without bytes. A copy that failed is left out of the task's files and still charged: its
    // image is in the answer.
    const answering = opts.whileSettling?.({ files, images, links, ...(revisedPrompt !== null && { revisedPrompt }) }).catch((err: unknown) => log.debug({ err }, 'the answer could not be written while the task settled'));
    if (copies.length > 0) await Promise.all(copies.map((write) => write()));
    // A JSON answer whose client left while the copies were written (an S3 PUT of several large
    // images takes seconds) can no longer be complete: its last byte waits for the commit. Nothing is
    // captured, as when it left before; the window left is the commit's own round trip.
    if (opts.deliveredOnlyIfAllSent && signal.aborted && !(signal.reason instanceof LeaseLost)) {
      await answering;
      for (const file of files) {
        if (lost.includes(file)) await this.deps.files.discardUnrecorded(file).catch(() => undefined);
        else await discard(file);
      }
      return undelivered('its images were');
    }
    const landed = lost.length === 0 ? { files, unrecorded } : { files: files.filter((f) => !lost.includes(f)), unrecorded: unrecorded.filter((f) => !lost.includes(f)) };
    const captured = await this.deps.settlement.completeImage(task, { ...landed, delivered: files.length, revisedPrompt }, attempts.take());
    // Bytes a failed write may have left behind belong to no row.
    for (const file of lost) await this.deps.files.discardUnrecorded(file).catch(() => undefined);
    if (captured === undefined) {
      // Taken over by another worker: the files this attempt stored are not its to publish.
      for (const file of landed.unrecorded) await this.deps.files.discardUnrecorded(file);
      throw new ApiError(500, 'internal_error', `Task ${task.id} was taken over by another worker.`);
    }
    await answering;
    return { status: 'completed', files, images, links, captured, ...(revisedPrompt !== null && { revisedPrompt }), ...(failure && { error: failure }) };
  }
}

/**
 * The answer to a generation that failed inside the gateway (not a ProviderError): the database
 * away is `503 database_unavailable` with its Retry-After, anything else `500 internal_error`.
 */
function gatewayFailure(err: unknown): ApiError {
  if (isDatabaseUnavailable(err)) return databaseUnavailable();
  return new ApiError(500, 'internal_error', 'An internal error of the gateway stopped the generation; the credits were released.');
}

/**
 * Who ended a synchronous request's connection before its images were delivered, as its task's
 * error code and the opening of its message: the server's stop (after its grace period) or the client.
 */
function cutOff(signal: AbortSignal): [code: 'interrupted' | 'client_disconnected', who: string] {
  return signal.reason instanceof CutByStop ? ['interrupted', 'The gateway stopped (a restart)'] : ['client_disconnected', 'The client disconnected'];
}
