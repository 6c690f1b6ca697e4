/**
 * Image generation and editing (product spec §2.3, §2.4, §4.3–§4.5, §6.1). Every request creates an
 * image task: the request is validated and priced, n × price is held together with the task insert,
 * and the task runs (image-runner.ts) inside the request, or in the background with
 * `Prefer: respond-async`. Exactly what was delivered is captured and the rest released.
 */
import type { components } from '../../../generated/api.d.ts';
import { accountSuspended, ApiError, apiKeyInactive, badRequest, inputFilesGone, notFound, paymentRequired, unavailable } from '../../errors.ts';
import { newId } from '../../lib/ids.ts';
import { Base64Bytes, Base64Source, type WithBase64 } from '../../lib/base64-json.ts';
import { inspectImage } from '../../lib/image-inspect.ts';
import { toCredits } from '../../lib/money.ts';
import { toAdminPricing } from '../admin/admin-mappers.ts';
import type { Logger } from '../../logger.ts';
import type { ImageInputShape, ImageInputSize, ImageParams } from '../../providers/types.ts';
import type { FileRow } from '../../repositories/file.repository.ts';
import type { ImageTaskRepository, ImageTaskRow, ListedImageTaskRow, PolledImageTaskRow } from '../../repositories/image-task.repository.ts';
import { fenceOf } from '../../repositories/leased-tasks.ts';
import type { LedgerRepository } from '../../repositories/ledger.repository.ts';
import type { ImageCatalogRow, ModelRepository } from '../../repositories/model.repository.ts';
import { TtlCache } from '../../lib/ttl-cache.ts';
import { accountPage, invalidAfter, listPage, type ListPage, type TaskListQuery } from '../account-lists.ts';
import type { AuthContext, AuthService } from '../auth.service.ts';
import { inFlightCapsOf, inFlightRefusal } from '../limits/client-limits.ts';
import type { FileService } from '../file.service.ts';
import { keepLease } from '../tasks/lease.ts';
import type { TaskNotifier } from '../tasks/task-notifier.ts';
import { STAGED_INPUT_TTL_MS, type InputStaging } from '../media/input-staging.ts';
import type { LargeBodyBudget } from '../media/large-body-budget.ts';
import type { MediaInputs } from '../media/media-inputs.ts';
import type { ExecuteOptions, ExecuteResult, ImageOperation, ImageRunner, ImageSink, InputBytes } from './image-runner.ts';
import { normalizeImageRequest, type ImageRequestFields } from './image-request.ts';

type Schemas = components['schemas'];

/**
 * An input image of an edit: uploaded bytes (multipart), or a media value of a JSON edit (a data
 * URL the body reader staged, a file id of this account or an https URL; see MediaInputs).
 */
export type EditInput = { data: Buffer; mimeType: string; param: string } | { value: string; param: string };

/** The input images of an edit, and where the request staged those its body carried. */
export interface ImageEdit {
  images: EditInput[];
  mask?: EditInput;
  staging: InputStaging;
}

export interface PreparedImageRequest {
  operation: ImageOperation;
  model: string;
  prompt: string;
  n: number;
  unitPrice: number;
  params: ImageParams;
  /** `orientation`: the EXIF orientation of bytes read here (1 when none), recorded with the file they are stored as. */
  inputs: { fileId?: string; data?: Buffer; mimeType: string; width: number; height: number; orientation?: number }[];
  mask: { fileId?: string; data?: Buffer; mimeType: string; width: number; height: number; orientation?: number } | undefined;
}

/** An edit's inputs as the adapters judge them (ImageProvider.checkInputs): their sizes as inspected. */
function inputShapeOf(inputs: readonly ImageInputSize[], mask: ImageInputSize | undefined): ImageInputShape {
  const size = ({ width, height }: ImageInputSize) => ({ width, height });
  return { images: inputs.map(size), ...(mask && { mask: size(mask) }) };
}

/**
 * A task as `start` inserted it, with the routing order drawn for it when it is synchronous: `runSync`
 * routes it in that order, so the one draw that named its first member decides it.
 */
export type StartedImageTask = ImageTaskRow & {
  readonly routeOrder?: readonly string[];
  /** A synchronous edit's input bytes, read once to check them (`prepare`): `runSync` sends these. */
  readonly inputBytes?: InputBytes;
};

export interface ImageServiceDeps {
  tasks: ImageTaskRepository;
  models: ModelRepository;
  ledger: LedgerRepository;
  files: FileService;
  media: MediaInputs;
  runner: ImageRunner;
  notifier: TaskNotifier;
  /** Reads a request's limits again before its hold (`AuthService.current`). */
  auth: Pick<AuthService, 'current'>;
  log: Logger;
  /** Lease owner of the synchronous tasks this process's requests run. */
  instanceId: string;
  /** Request media held in memory at once: a JSON edit takes its named inputs' bytes before reading them. */
  largeBodies?: LargeBodyBudget;
  /** capacityWaitMs: how long a synchronous request waits for a free upstream member before 503 no_upstream_capacity. */
  options: {
    sizeParam: 'accept' | 'reject';
    leaseMs: number;
    maxEditImages: number;
    capacityWaitMs: number;
    /** JSON edits: byte limits of one input and of all together (data URLs and fetched URLs). */
    maxEditFileBytes: number;
    maxEditBodyBytes: number;
    /** How long a file a task uses stays at least (uploads outlive the tasks using them). */
    inputPinSeconds: number;
    /** Days inputs are kept after that (INPUT_RETENTION_DAYS; an account may have its own). */
    inputRetentionDays: number;
    /** How long a model lookup is reused (0: read every time). */
    modelCacheTtlMs?: number;
  };
}

/** What the lookup shape may read: the columns the poll selects (PolledImageTaskRow), so it can read no other. */
type ImageLookupFields = Omit<PolledImageTaskRow, 'mediaExpiresAt'> & { mediaExpiresAt?: Date | null };

/**
 * The price a task was created at and what it was charged (ImageBilling). Only a settled task
 * (completed or failed) has charged anything: a needs_attention task's row already counts the images
 * a stream recorded as sent, but until an operator settles it nothing is captured.
 */
function billingOf(row: ImageLookupFields): Schemas['ImageBilling'] {
  const settled = row.status === 'completed' || row.status === 'failed';
  return {
    mode: 'per_item',
    unit: 'image',
    unitPrice: toCredits(row.unitPrice),
    images: row.n,
    quotedCredits: toCredits(row.quotedCredits),
    actualCredits: settled ? toCredits(row.actualCredits) : 0,
    delivered: settled ? row.delivered : 0,
  };
}

/** The lookup shape of a task, without its results (`data`). */
function taskShape<M>(row: ImageLookupFields): WithBase64<Schemas['ImageTask'], M> {
  const task: WithBase64<Schemas['ImageTask'], M> = {
    id: row.id,
    object: 'image.task',
    status: row.status as Schemas['ImageTask']['status'],
    model: row.model,
    created: Math.floor(row.createdAt.getTime() / 1000),
    created_at: row.createdAt.toISOString(),
    billing: billingOf(row),
  };
  if (row.completedAt && (row.status === 'completed' || row.status === 'failed')) {
    task.completed = Math.floor(row.completedAt.getTime() / 1000);
    task.completed_at = row.completedAt.toISOString();
  }
  if (row.status === 'failed') task.error = { message: row.errorMessage ?? 'The task failed.', code: row.errorCode };
  if (row.status === 'completed' && row.mediaExpiresAt && !mediaExpired(row)) task.media_expires_at = row.mediaExpiresAt.toISOString();
  return task;
}

/** Whether a completed task's stored images passed their retention (the sweeper deletes them within a minute). */
function mediaExpired(row: { mediaExpiresAt?: Date | null }): boolean {
  return !!row.mediaExpiresAt && row.mediaExpiresAt.getTime() <= Date.now();
}

/** The quality tiers a model may price apart, in order. */
const QUALITY_TIERS = ['low', 'medium', 'high'] as const;

export class ImageService {
  /** Model lookups per group, model and switch: configuration, read on every request otherwise. */
  private readonly modelCache: TtlCache<ImageCatalogRow | undefined>;
  /**
   * This process's synchronous requests from their hold to their settlement (`start`'s hold, then
   * `runSync`): a stop waits for them (`settleRunning`) before it closes the database pool.
   */
  private readonly unsettled = new Set<Promise<unknown>>();

  constructor(private readonly deps: ImageServiceDeps) {
    this.modelCache = new TtlCache(deps.options.modelCacheTtlMs ?? 0);
  }

  /** Forgets cached model lookups (an admin changed the catalog, a switch or a group). */
  invalidateCaches(): void {
    this.modelCache.clear();
  }

  /** `work`, counted among the unsettled until it ends. */
  private track<T>(work: Promise<T>): Promise<T> {
    this.unsettled.add(work);
    const done = () => void this.unsettled.delete(work);
    work.then(done, done);
    return work;
  }

  /**
   * Resolves once no synchronous request of this process holds credits it has not settled, or after
   * `ms`: how many still do. For a stop, once the HTTP server has cut its connections: each cut
   * request's client is gone, so its run settles what it delivered and releases the rest
   * (ImageRunner.execute), which takes the database, still open until this resolves.
   */
  async settleRunning(ms: number): Promise<number> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), ms)));
    try {
      while (this.unsettled.size > 0) {
        if ((await Promise.race([Promise.allSettled(this.unsettled), timeout])) === 'timeout') break;
        // A hold that committed starts its run within the microtasks that follow (the handler's
        // next call, `runSync`): one turn of the event loop later, nothing tracked is nothing left.
        await new Promise((resolve) => setImmediate(resolve));
      }
    } finally {
      clearTimeout(timer);
    }
    return this.unsettled.size;
  }

  /**
   * A request from its fields to its started task: validated and priced (`prepare`), then held and
   * inserted (`start`). The handler's one call before the task runs.
   */
  async create(
    auth: AuthContext,
    operation: ImageOperation,
    fields: ImageRequestFields,
    edit: ImageEdit | undefined,
    mode: { async: boolean; stream?: boolean },
  ): Promise<StartedImageTask> {
    return this.start(auth, await this.prepare(auth, operation, fields, edit), mode);
  }

  /** Validates and prices a request; nothing is written but URL inputs staged in `staging`. */
  async prepare(
    auth: AuthContext,
    operation: ImageOperation,
    fields: ImageRequestFields,
    edit?: ImageEdit,
  ): Promise<PreparedImageRequest> {
    const switchName = operation === 'generation' ? 'image_generation' : 'image_edit';
    const model = await this.modelCache.get(`${auth.groupId}\n${fields.model}\n${switchName}`, () => this.deps.models.findImageModel(auth.groupId, fields.model, switchName));
    // The switch first, as for videos: an unknown model is 503 too while the operation is off.
    if (!(model ? model.switchedOn : await this.deps.models.isSwitchedOn(switchName))) {
      throw unavailable('capability_disabled', `Image ${operation === 'generation' ? 'generation' : 'editing'} is switched off by the operator.`);
    }
    if (!model) {
      if (await this.deps.models.visibleAs(auth.groupId, fields.model, 'video')) {
        throw new ApiError(404, 'model_not_found', `'${fields.model}' is a video model, not an image model: make videos with POST /v1/videos/generations.`, 'model');
      }
      throw new ApiError(404, 'model_not_found', `Image model '${fields.model}' does not exist or is not available to this key.`, 'model');
    }
    if (!model.reachable) throw unavailable('no_reachable_member', `No enabled backend member serves model '${fields.model}' for this key.`);
    // A prompt-only model would make a picture from the prompt alone (or its adapter refuse it
    // after the hold): refused before the inputs are read and anything is held.
    if (operation === 'edit' && model.capabilities.edits === false) {
      throw badRequest('edits_not_supported', `Model '${fields.model}' generates from a prompt only and does not edit images; use POST /v1/images/generations, or a model that edits.`, 'model');
    }

    const inputs: PreparedImageRequest['inputs'] = [];
    let mask: PreparedImageRequest['mask'];
    if (operation === 'edit') {
      const images = edit?.images ?? [];
      if (images.length === 0) throw badRequest('invalid_request', 'An edit needs at least one input image.', 'image');
      if (images.length > this.deps.options.maxEditImages) throw badRequest('too_many_images', `At most ${this.deps.options.maxEditImages} input images are accepted; got ${images.length}.`, 'image');
      // A model's own limit counts the mask too: upstreams without a mask parameter take it as one more image.
      const modelLimit = model.capabilities.maxInputImages;
      const sent = images.length + (edit?.mask ? 1 : 0);
      if (modelLimit !== undefined && sent > modelLimit) {
        throw badRequest('too_many_images', `Model '${fields.model}' accepts at most ${modelLimit} input images (a mask counts as one); got ${sent}.`, 'image');
      }
      const loaded = await this.loadInputs(edit!.staging, edit?.mask ? [...images, edit.mask] : images);
      inputs.push(...loaded.slice(0, images.length));
      if (edit?.mask) {
        const m = loaded.at(-1)!;
        if (!m.hasAlpha) throw badRequest('invalid_image', 'The mask needs an alpha channel: its transparent area marks the region to edit.', 'mask');
        const first = inputs[0]!;
        if (m.width !== first.width || m.height !== first.height) {
          throw badRequest('mask_size_mismatch', `The mask is ${m.width}x${m.height} but the first image is ${first.width}x${first.height}; they must match.`, 'mask');
        }
        mask = m;
      }
      // An input no upstream serving the model can take (a Seedream ratio past 16:1) is the
      // client's 400 now, not a task failed by its upstream after the hold.
      const refusal = await this.deps.runner.inputRefusal({ groupId: auth.groupId, model: model.id }, inputShapeOf(inputs, mask));
      if (refusal) {
        const { param } = refusal.input === 'mask' ? edit!.mask! : images[refusal.input]!;
        const { width, height } = refusal.input === 'mask' ? mask! : inputs[refusal.input]!;
        throw badRequest('invalid_image', `'${param}' is ${width}x${height} pixels; model '${model.id}' runs on an upstream that takes only ${refusal.reason}.`, param);
      }
    }

    // One pass: every rule, the size (an edit with no size keeps its first input's) and its price.
    const first = inputs[0];
    const priced = normalizeImageRequest(fields, model.capabilities, model.prices, {
      sizeParam: this.deps.options.sizeParam,
      ...(first && { inputSize: { width: first.width, height: first.height } }),
    });
    return { operation, model: model.id, prompt: fields.prompt, n: priced.n, unitPrice: priced.unitPrice, params: priced.params, inputs, mask };
  }

  /** Each input checked as an image, with its bytes (for the upstream) and, when stored already, its file. */
  private async loadInputs(staging: InputStaging, inputs: EditInput[]) {
    const refs = inputs.filter((i): i is Extract<EditInput, { value: string }> => 'value' in i);
    const { maxEditFileBytes, maxEditBodyBytes } = this.deps.options;
    const resolved = await this.deps.media.resolveAll(staging, refs, { maxBytes: maxEditBodyBytes, maxItemBytes: maxEditFileBytes });
    // Inputs named by file id or URL are read into memory here, whatever the request's own size:
    // they take their bytes of the large-body budget first (503 server_busy when it stays taken),
    // until the request is over, as a multipart edit of that size would.
    const named = resolved.reduce((sum, r) => sum + r.file.bytes, 0);
    const budget = this.deps.largeBodies;
    if (budget && named > budget.opts.largeBodyBytes) staging.holdUntilDone(await budget.acquire(named));
    const byParam = new Map(resolved.map((r) => [r.param, r]));
    const loaded = [];
    for (const input of inputs) {
      if ('value' in input) {
        const { file, image } = byParam.get(input.param)!;
        loaded.push({ fileId: file.id, data: await this.deps.files.readAll(file.id), mimeType: image.mimeType, width: image.width, height: image.height, hasAlpha: image.hasAlpha });
      } else {
        const image = await inspectImage(input.data, input.param);
        loaded.push({ data: input.data, mimeType: image.mimeType, width: image.width, height: image.height, hasAlpha: image.hasAlpha, orientation: image.orientation ?? 1 });
      }
    }
    return loaded;
  }

  /**
   * Stores the inputs, holds n × price and inserts the task in one statement. A synchronous task
   * starts with this process holding its lease; an async one is left to the task engines.
   */
  async start(auth: AuthContext, req: PreparedImageRequest, mode: { async: boolean; stream?: boolean }): Promise<StartedImageTask> {
    const quoted = req.unitPrice * req.n;
    // An edit's inputs as measured when they were checked: for the routing draw and the run alike.
    const shape = req.inputs.length > 0 ? inputShapeOf(req.inputs, req.mask) : undefined;
    // `partial_images` is for streams only (ignored without streaming, ImageGenerationRequest): cleared
    // here, no adapter asks its upstream for partials nobody sees (OpenAI would make the images one
    // streamed call at a time).
    const params: ImageParams = mode.stream ? { ...req.params, stream: true } : { ...req.params, partialImages: 0 };
    // A synchronous task's routing order is drawn now: it names its first member as it is inserted
    // (one statement fewer on the way to the upstream), and runSync follows the same order. Drawn
    // before any input is stored, so that a draw that throws leaves nothing behind.
    const route = mode.async
      ? undefined
      : await this.deps.runner.preselect({
          groupId: auth.groupId,
          model: req.model,
          operation: req.operation,
          prompt: req.prompt,
          n: req.n,
          params,
          ...(shape && { inputs: shape }),
        });
    const taskId = newId('img');
    const saved: FileRow[] = [];
    // Uploaded bytes (multipart) are stored as a JSON edit's data URLs are staged: with no task and
    // the staging TTL, so that the hold adopts them like any other input (their task and retention
    // are set there, in one place) and a request that dies before the hold leaves them to expire.
    const store = async (input: { fileId?: string; data?: Buffer; mimeType: string; width?: number; height?: number; orientation?: number }) => {
      if (input.fileId) return input.fileId;
      const file = await this.deps.files.save(
        {
          accountId: auth.accountId,
          purpose: 'input',
          contentType: input.mimeType,
          expiresAt: new Date(Date.now() + STAGED_INPUT_TTL_MS),
          ...(input.width && { width: input.width }),
          ...(input.height && { height: input.height }),
          ...(input.orientation && { orientation: input.orientation }),
        },
        input.data!,
      );
      saved.push(file);
      return file.id;
    };
    const inputFileIds: string[] = [];
    let maskFileId: string | null;
    try {
      for (const input of req.inputs) inputFileIds.push(await store(input));
      maskFileId = req.mask ? await store(req.mask) : null;
    } catch (err) {
      // A store that fails part-way (full, failing: 507/503) keeps nothing of this request.
      for (const file of saved) await this.deps.files.discard(file).catch(() => undefined);
      throw err;
    }
    // Every input is adopted with the task: those stored just now, those the request staged before
    // (JSON edits) and the files it names.
    const adopted = maskFileId ? [...inputFileIds, maskFileId] : inputFileIds;
    // The caps on generations in flight as they are now (the body may have streamed for minutes;
    // a generation's took milliseconds, and its check is still fresh: `current` returns it as it is).
    const limited = await this.deps.auth.current(auth);
    const inFlightCaps = inFlightCapsOf(limited);
    const first = route?.first;
    const holding = this.deps.ledger
      .holdAndInsertTask(
        { holdId: newId('hold'), accountId: auth.accountId, apiKeyId: auth.apiKeyId, taskId, amount: quoted, inFlightCaps },
        {
          table: 'imageTasks',
          row: {
            id: taskId,
            accountId: auth.accountId,
            apiKeyId: auth.apiKeyId,
            groupId: auth.groupId,
            operation: req.operation,
            model: req.model,
            prompt: req.prompt,
            params: JSON.stringify(params),
            inputFileIds,
            maskFileId,
            n: req.n,
            unitPrice: req.unitPrice,
            quotedCredits: quoted,
            runAsync: mode.async,
            attempt: mode.async ? 0 : 1,
            leaseOwner: mode.async ? null : this.deps.instanceId,
            memberId: first?.memberId ?? null,
            memberSlots: first?.slots ?? 1,
          },
          // A synchronous task is this process's, leased from the database's clock.
          ...(!mode.async && { leaseMs: this.deps.options.leaseMs }),
        },
        { fileIds: adopted, pinSeconds: this.deps.options.inputPinSeconds, retentionDays: this.deps.options.inputRetentionDays },
        // A synchronous image lives and dies with its request: its hold need not wait for the disk (HoldCommit).
        mode.async ? 'flushed' : 'unflushed',
      )
      .catch(async (err: unknown) => {
        for (const file of saved) await this.deps.files.discard(file);
        throw err;
      });
    // A synchronous hold is settled by this process's request (`runSync`): a stop waits for it from here.
    const { outcome, task } = await (mode.async ? holding : this.track(holding));
    // Inputs stored for a task that was not created are removed.
    if (outcome !== 'ok') for (const file of saved) await this.deps.files.discard(file);
    // Deactivated or suspended since the request was authenticated: what authentication would answer now.
    if (outcome === 'api_key_inactive') throw apiKeyInactive();
    if (outcome === 'account_suspended') throw accountSuspended();
    if (outcome === 'key_quota_exceeded') throw paymentRequired('key_quota_exceeded', `This API key's credit limit cannot cover ${req.n} image(s) (${toCredits(quoted)} credits).`);
    if (outcome === 'insufficient_balance') throw paymentRequired('insufficient_balance', `The account balance cannot cover ${req.n} image(s) (${toCredits(quoted)} credits).`);
    if (outcome === 'key_too_many_in_flight' || outcome === 'account_too_many_in_flight') throw inFlightRefusal(outcome, limited, adopted.length > 0);
    if (outcome === 'input_files_gone') throw inputFilesGone();
    // A synchronous task's request line carries this (http/images.handlers.ts): one line, not three.
    if (mode.async) {
      this.deps.log.info({ taskId, model: req.model, n: req.n, quotedMicroCredits: quoted }, 'image task created');
      this.deps.notifier.notify('image');
    }
    if (!route) return task!;
    const images = req.inputs.flatMap((i) => (i.data ? [i.data] : []));
    const held = images.length === req.inputs.length && (!req.mask || req.mask.data) && images.length > 0;
    return { ...task!, routeOrder: route.order, ...(held && { inputBytes: { images, ...(req.mask && { mask: req.mask.data! }), ...(shape && { shape }) } }) };
  }

  /**
   * Runs a synchronous task inside its request, keeping the task's lease while it renders; `signal`
   * aborts when the client goes away. Tracked until it has settled (`settleRunning`), from this call on.
   */
  runSync(task: StartedImageTask, sink: ImageSink, signal: AbortSignal, log: Logger, opts: Pick<ExecuteOptions, 'deliveredOnlyIfAllSent' | 'whileSettling'> = {}): Promise<ExecuteResult> {
    return this.track(this.run(task, sink, signal, log, opts));
  }

  private async run(task: StartedImageTask, sink: ImageSink, signal: AbortSignal, log: Logger, opts: Pick<ExecuteOptions, 'deliveredOnlyIfAllSent' | 'whileSettling'>): Promise<ExecuteResult> {
    const lease = keepLease(this.deps.tasks.leases, fenceOf(task), this.deps.instanceId, this.deps.options.leaseMs, log, signal);
    try {
      return await this.deps.runner.execute(task, sink, lease.signal, log, {
        ...opts,
        capacityWaitMs: this.deps.options.capacityWaitMs,
        ...(task.routeOrder && { routeOrder: task.routeOrder }),
        ...(task.inputBytes && { inputBytes: task.inputBytes }),
      });
    } finally {
      lease.release();
    }
  }

  /** GET /v1/images/capabilities: the image models the key can see, what they take and their prices now. */
  async capabilities(auth: AuthContext): Promise<Schemas['ImageCapabilities']> {
    const rows = await this.deps.models.listImageCatalog(auth.groupId);
    return {
      items: rows.map((row) => {
        const caps = row.capabilities;
        const edits = caps.edits !== false;
        // In capability order (resolution, then quality), as the admin API lists them; a quality row
        // of a model without quality tiers, or of a tier the model lacks, is not offered.
        const pricing = toAdminPricing(row.prices.map((p) => ({ ...p, modelId: row.id, mode: 'per_item' })), caps.resolutions);
        const qualities = caps.supportsQuality ? QUALITY_TIERS.filter((q) => pricing.some((p) => p.quality === q)) : [];
        return {
          model: row.id,
          displayName: row.displayName,
          operations: [...(row.generationOn ? (['generation'] as const) : []), ...(row.editOn && edits ? (['edit'] as const) : [])],
          resolutions: caps.resolutions,
          aspectRatios: caps.aspectRatios,
          outputFormats: caps.outputFormats,
          qualities,
          transparentBackground: caps.supportsTransparentBackground,
          maxN: caps.maxN,
          maxInputImages: edits ? Math.min(caps.maxInputImages ?? this.deps.options.maxEditImages, this.deps.options.maxEditImages) : 0,
          billing: pricing
            .filter((p) => caps.resolutions.includes(p.resolution) && (p.quality === null || qualities.includes(p.quality)))
            .map((p) => ({ resolution: p.resolution, quality: p.quality, mode: 'per_item' as const, unit: 'image' as const, unitPrice: p.unit_price })),
          configuredReachable: row.reachable,
        };
      }),
    };
  }

  /** GET /v1/images/{task_id}: the owner's task only. */
  async get(auth: AuthContext, id: string): Promise<WithBase64<Schemas['ImageTask']>> {
    const row = await this.deps.tasks.findForAccount(id, auth.accountId);
    if (!row) throw notFound('task_not_found', `No image task '${id}' exists for this account.`);
    return this.toImageTask(row);
  }

  async toImageTask(row: ImageLookupFields): Promise<WithBase64<Schemas['ImageTask']>> {
    const task = taskShape<Base64Bytes>(row);
    if (row.status === 'completed') task.data = mediaExpired(row) ? [] : await this.resultData(row);
    return task;
  }

  /**
   * One page of the account's tasks, each as `get` shows it (GET /v1/images). The images of
   * `b64_json` tasks are Base64Sources, read from the store while the answer is written (a page
   * may hold hundreds of them). An `after` that matched nothing and names no task of the account
   * is 400 invalid_cursor.
   */
  async list(auth: AuthContext, query: TaskListQuery<Schemas['ImageTask']['status']>): Promise<ListPage<WithBase64<Schemas['ImageTask'], Base64Source>>> {
    const { page, size } = accountPage(auth.accountId, query);
    const rows = await this.deps.tasks.listForAccount(page, { status: query.status, model: query.model });
    if (rows.length === 0 && page.after !== undefined && !(await this.deps.tasks.isAccountTask(page.after, auth.accountId))) throw invalidAfter('image task');
    return listPage(rows, size, (row) => this.listedTask(row));
  }

  private async listedTask(row: ListedImageTaskRow): Promise<WithBase64<Schemas['ImageTask'], Base64Source>> {
    const task = taskShape<Base64Source>(row);
    if (row.status !== 'completed') return task;
    if (mediaExpired(row)) return { ...task, data: [] };
    const params = row.params as unknown as ImageParams;
    const items: WithBase64<Schemas['ImageData'], Base64Source>[] =
      params.responseFormat === 'url'
        ? await Promise.all(row.resultFileIds.map(async (id) => ({ url: await this.deps.files.downloadUrl(id, 'image_output', 0, row.mediaExpiresAt) })))
        : (row.storedResults ?? []).map((file) => ({ b64_json: new Base64Source(() => this.deps.files.read(file), file.bytes) }));
    task.data = row.revisedPrompt ? items.map((item) => ({ ...item, revised_prompt: row.revisedPrompt! })) : items;
    return task;
  }

  /** `data[]` of a task's stored results in its response format. */
  async resultData(row: Pick<ImageLookupFields, 'params' | 'resultFileIds' | 'revisedPrompt' | 'mediaExpiresAt'>): Promise<WithBase64<Schemas['ImageData']>[]> {
    const params = row.params as unknown as ImageParams;
    return Promise.all(
      row.resultFileIds.map(async (id) => {
        const item: WithBase64<Schemas['ImageData']> =
          params.responseFormat === 'url' ? { url: await this.deps.files.downloadUrl(id, 'image_output', 0, row.mediaExpiresAt) } : { b64_json: new Base64Bytes(await this.deps.files.readAll(id)) };
        if (row.revisedPrompt) item.revised_prompt = row.revisedPrompt;
        return item;
      }),
    );
  }
}
