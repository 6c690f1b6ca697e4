/**
 * Runs video tasks as a sequence of short steps (design §6), each claimed under a lease and fenced
 * by attempt; no step sleeps:
 *
 *   submit    the pool picks a member with a free slot whose upstream can express the task (its
 *             adapter's `check`, while some member's can; mark the submit as started, naming the
 *             member: its slot from now to a terminal state), send the job (with the task id as the
 *             upstream's idempotency key where it takes one), failing over to the next member when
 *             one cannot take it; save the upstream job id and member (the commit point: a retried
 *             step polls that job instead of submitting again), schedule the first poll. With every
 *             member full or cooling down the task stays queued. A submit whose answer never
 *             came (a crash between sending and saving, a timeout after the body was sent, an
 *             edge's 5xx: `submitTo`) is seen by the next attempt (submit_started_at set, no job
 *             id): it resubmits to the same member with the same idempotency key and logs a
 *             warning. Where the upstream cannot tell a resubmit from a new job (no idempotency
 *             key, no lookup: Ark, MiniMax, DashScope, Veo, Sora, fal, Replicate) the earlier job
 *             may run there too, billed: so once two submits are unanswered the task fails and is
 *             refunded rather than sent a third time (at most two jobs the gateway never collects,
 *             one when the resubmit is answered; the client is charged once either way). Resending
 *             once is the better bet for both sides: the client gets its video, and the operator's
 *             loss is the same one job as when failing at once, unless the resubmit's answer is
 *             lost too.
 *   poll      one status call on the member that accepted the job; running: reschedule at the
 *             provider's interval (or its Retry-After), with jitter; failed: fail and release
 *   finalize  (right after a poll that saw success, which records where the output is: the job is
 *             never polled again) stream the output into the media store under a byte limit,
 *             then complete the task and capture the hold in one statement; a failed download is
 *             retried alone, with its own budget (DOWNLOAD_RETRY) and the upstream's Retry-After
 *
 * Transient failures (connection errors, timeouts, 5xx, 429) are retried with backoff (or the
 * upstream's Retry-After) until the task's deadline; a task past its deadline fails and is refunded
 * at its next step.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { apiErrorOf, ended, sentence, taskErrorCodeOf } from '../../errors.ts';
import type { Logger } from '../../logger.ts';
import { NoCapacity, upstreamModelOf, type Pool } from '../../pool/pool.ts';
import { ProviderError, asProviderError } from '../../providers/provider-error.ts';
import type { ProviderRegistry } from '../../providers/registry.ts';
import { shapeOf, type UpstreamAccount, type VideoContent, type VideoJob, type VideoOutputRef, type VideoProvider, type VideoStatus } from '../../providers/types.ts';
import { fenceOf } from '../../repositories/leased-tasks.ts';
import type { TaskAttemptRepository } from '../../repositories/task-attempt.repository.ts';
import { type VideoTaskRepository, type VideoTaskRow } from '../../repositories/video-task.repository.ts';
import { MediaTooLarge, StorageError } from '../../storage/media-store.ts';
import type { FileService } from '../file.service.ts';
import { AttemptLog } from '../tasks/attempt-log.ts';
import { retryDelay, spread, type RetryPolicy } from '../tasks/retry-policy.ts';
import type { Settlement } from '../tasks/settlement.ts';
import { DONE, LeaseLost, later, type StepResult, type TaskRunner } from '../tasks/task-runner.ts';

export const VIDEO_RETRY: RetryPolicy = { maxRetries: Number.POSITIVE_INFINITY, baseDelayMs: 1000, maxDelayMs: 60_000 };
/**
 * Submits of one task whose answers never came, past which it is failed rather than submitted again
 * to an upstream that cannot tell a resubmit from a new job (`VideoProvider.findsEarlierSubmit`).
 */
export const MAX_UNANSWERED_SUBMITS = 2;

/**
 * Downloads of a finished job: up to 10 retries (about 20 minutes of backoff, or the upstream's
 * Retry-After each time), and never past the task's deadline.
 */
export const DOWNLOAD_RETRY: RetryPolicy = { maxRetries: 10, baseDelayMs: 2000, maxDelayMs: 5 * 60_000 };
/**
 * The cancel of a job past its task's deadline: asked this many times through passing failures,
 * each wait at most CANCEL_WAIT_MAX_MS, all of it within CANCEL_TOTAL_MS (the refund waits for it,
 * and the task sweeper claims overdue tasks by it: as many as its lease can see cancelled).
 */
const CANCEL_ATTEMPTS = 3;
const CANCEL_WAIT_MAX_MS = 5000;
export const CANCEL_TOTAL_MS = 15_000;

export interface VideoRunnerDeps {
  tasks: VideoTaskRepository;
  pool: Pool;
  providers: ProviderRegistry;
  files: FileService;
  settlement: Settlement;
  /** Where each step's calls upstream are recorded (the task's story for operators). */
  attempts: TaskAttemptRepository;
  /** Largest video output stored; a larger one fails the task. */
  maxOutputBytes: number;
  retry?: RetryPolicy;
  downloadRetry?: RetryPolicy;
}

export class VideoRunner implements TaskRunner<VideoTaskRow> {
  readonly name = 'video';
  readonly leases;
  readonly retry: RetryPolicy;
  private readonly downloadRetry: RetryPolicy;

  constructor(private readonly deps: VideoRunnerDeps) {
    this.leases = deps.tasks.leases;
    this.retry = deps.retry ?? VIDEO_RETRY;
    this.downloadRetry = deps.downloadRetry ?? DOWNLOAD_RETRY;
  }

  /** `leaseLost`: what alone may cut a submit short (TaskRunner.step); without one, the step's signal. */
  async step(task: VideoTaskRow, signal: AbortSignal, log: Logger, leaseLost: AbortSignal = signal): Promise<StepResult> {
    const attempts = new AttemptLog(task.id);
    try {
      return await this.run(task, attempts, signal, leaseLost, log);
    } finally {
      await attempts.write(this.deps.attempts, log);
    }
  }

  /**
   * Fails a task past its deadline and refunds it, then cancels its upstream job where the adapter
   * can: what a step does with such a task, and what the task sweeper does with one no worker
   * claimed (services/tasks/task-sweeper.ts). False: the fence no longer holds (nothing changed).
   * Throws when `signal` (a stop) cut the cancel short: the task is left to its lease, unchanged.
   */
  async expire(task: VideoTaskRow, signal: AbortSignal, log: Logger): Promise<boolean> {
    const attempts = new AttemptLog(task.id);
    try {
      return await this.failPastDeadline(task, attempts, signal, log);
    } finally {
      await attempts.write(this.deps.attempts, log);
    }
  }

  /**
   * The job is cancelled upstream first, while this step still holds the task's lease (once the task
   * has ended, the lease is gone and with it the step's signal: a cancel asked again after a 429
   * would be cut short), then the task is failed and refunded. The cancel is best effort: whatever
   * fails in it (the member's credentials that no longer decrypt, the database) is logged and the
   * refund goes ahead; a task left in progress would keep its hold, its failure retried forever.
   * Only `signal` ending the cancel (a stop, a lost lease) leaves the task as it is: the refund
   * without the cancel would leave the job running upstream, so the next claim does both.
   */
  private async failPastDeadline(task: VideoTaskRow, attempts: AttemptLog, signal: AbortSignal, log: Logger): Promise<boolean> {
    try {
      await this.cancelUpstream(task, attempts, signal, log);
    } catch (err) {
      if (signal.aborted) throw err;
      log.warn({ memberId: task.memberId, upstreamJobId: task.upstreamJobId, err }, 'could not cancel the upstream job of a task past its deadline; the task is failed and refunded all the same');
    }
    return (await this.deps.settlement.failVideo(task, 'timeout', 'The task exceeded its maximum lifetime and was refunded.')) !== undefined;
  }

  private async run(task: VideoTaskRow, attempts: AttemptLog, signal: AbortSignal, leaseLost: AbortSignal, log: Logger): Promise<StepResult> {
    if (task.deadlineAt.getTime() <= Date.now()) {
      await this.failPastDeadline(task, attempts, signal, log);
      return DONE;
    }
    if (!task.upstreamJobId) return this.submit(task, attempts, leaseLost, log, signal);

    const account = task.memberId ? await this.deps.pool.account(task.memberId) : undefined;
    const provider = account && this.deps.providers.video(account.provider);
    if (!account || !provider) {
      await this.deps.settlement.failVideo(task, 'no_reachable_member', 'The backend member running this task was removed; the credits were refunded.');
      return DONE;
    }
    // A poll already said the job is done: only the download is left (never poll a finished job again).
    if (task.upstreamOutput) return this.finalize(task, account, provider, task.upstreamOutput as VideoOutputRef, attempts, signal, log);
    let status: VideoStatus;
    const pollStartedAt = performance.now();
    try {
      const job = await this.jobOf(task, account, false);
      // A status check that says "still running" is not recorded: one every few seconds for minutes.
      status = await attempts.run('poll', account, task.upstreamJobId, () => this.deps.pool.health.observeAccepted(account, () => provider.poll(account, task.upstreamJobId!, job, signal), signal), {
        keep: (s) => s.state !== 'running',
        signal,
      });
    } catch (err) {
      return this.failOrRetry(task, statusCallFailure(err));
    }
    if (status.state === 'running') return later(status.retryAfterMs ?? spread(provider.pollIntervalMs));
    if (status.state === 'failed') {
      // A job failed by the member's configuration (an aggregator's mapping the upstream refused):
      // the operator reads why in member health; the task gets the generic message (fail()).
      if (memberFault(status.error)) await this.deps.pool.health.failed(account, status.error, pollStartedAt);
      return this.fail(task, status.error);
    }
    if (!(await this.deps.tasks.recordUpstreamOutput(fenceOf(task), status.output))) throw new LeaseLost('lease lost before the finished job was recorded');
    log.info({ memberId: account.memberId, upstreamJobId: task.upstreamJobId }, 'video job finished upstream');
    return this.finalize(task, account, provider, status.output, attempts, signal, log);
  }

  /**
   * A job still running upstream when its task failed by its deadline is cancelled there, where the
   * adapter can (it would spend the account's quota on a result nobody collects). A cancel answered
   * with a passing failure (429, 5xx, a timeout: the likeliest answers exactly when the upstream is
   * so congested that tasks reach their deadline) is asked again, CANCEL_ATTEMPTS in all, waiting
   * its Retry-After (at most CANCEL_WAIT_MAX_MS). Best effort beyond that: the failure is logged, and
   * the task is failed and refunded either way (an adapter whose upstream takes a job lifetime also
   * sent what was left of the deadline: VideoJob.deadline).
   */
  private async cancelUpstream(task: VideoTaskRow, attempts: AttemptLog, signal: AbortSignal, log: Logger): Promise<void> {
    if (!task.upstreamJobId || task.upstreamOutput || !task.memberId) return;
    const account = await this.deps.pool.account(task.memberId);
    const provider = account && this.deps.providers.video(account.provider);
    if (!account || !provider?.cancel) return;
    const bounded = AbortSignal.any([signal, AbortSignal.timeout(CANCEL_TOTAL_MS)]);
    for (let attempt = 1; ; attempt++) {
      try {
        signal.throwIfAborted();
        await attempts.run('cancel', account, task.upstreamJobId, () => this.deps.pool.health.observeAccepted(account, () => provider.cancel!(account, task.upstreamJobId!, bounded), bounded), { signal: bounded });
        log.info({ memberId: account.memberId, upstreamJobId: task.upstreamJobId, attempt }, 'upstream job of a task past its deadline cancelled');
        return;
      } catch (err) {
        // Cut short by the caller (a stop, a lost lease), not by the cancel's own time limit: the caller decides.
        if (signal.aborted) throw err;
        const passing = err instanceof ProviderError && (err.kind === 'retryable' || err.kind === 'rate_limited');
        if (!passing || attempt >= CANCEL_ATTEMPTS || bounded.aborted) {
          log.warn({ memberId: account.memberId, upstreamJobId: task.upstreamJobId, attempt, err: err instanceof Error ? err.message : String(err) }, 'could not cancel the upstream job of a task past its deadline');
          return;
        }
        await sleep(Math.min(err.retryAfterMs ?? 1000 * attempt, CANCEL_WAIT_MAX_MS), undefined, { signal: bounded }).catch(() => undefined);
      }
    }
  }

  async giveUp(task: VideoTaskRow, err: unknown, log: Logger): Promise<void> {
    log.error({ err }, 'video task failed after its last retry');
    await this.deps.settlement.failVideo(task, 'upstream_error', 'Video generation failed repeatedly; the credits were refunded.');
  }

  /**
   * Sends the job to a member the pool picks (failing over to the next one when a member cannot
   * take it), then saves the job id: the commit point. With every member busy the task stays
   * queued (no retry counted, nothing charged) and looks again shortly.
   *
   * `signal` is the lease-lost signal alone, not the step's: a submit that reached the upstream may
   * have created the job (billed), and only its saved id keeps the next attempt from submitting it
   * again — on an upstream without idempotency keys (Ark, MiniMax, DashScope) a second, billed job.
   * So a stopping worker waits for the answer and saves it (TaskEngine.stop), within the call's own
   * upstream timeout; a lost lease still cuts it short (the row is another worker's by then).
   * `stopping` (the step's signal) keeps a stopping worker from starting a submit at all, first or
   * on another member after a failure: one the stop's deadline could cut, to be submitted again by
   * the next worker (a second, billed job where the upstream has no idempotency key). The step ends
   * as stopped and the task resumes after its lease.
   */
  private async submit(task: VideoTaskRow, attempts: AttemptLog, signal: AbortSignal, log: Logger, stopping: AbortSignal): Promise<StepResult> {
    const fence = fenceOf(task);
    notStopping(stopping);
    if (task.submitStartedAt && task.memberId) return this.resubmit(task, attempts, signal, log, stopping);
    let submitted: { account: UpstreamAccount; jobId: string };
    try {
      const job = await this.jobOf(task, undefined, true);
      // The shape creation checked (video.service.ts), now against each member's own upstream model.
      const shape = shapeOf(job);
      submitted = await this.deps.pool.route(
        {
          groupId: task.groupId,
          model: task.model,
          capability: 'video',
          // A member whose upstream cannot express the task is skipped while another one can (one
          // catalog model served through several provider kinds); creation let it in for that one.
          accepts: (account) => this.deps.providers.video(account.provider)?.check?.(shape, upstreamModelOf(account, task.model)) === undefined,
          take: async (memberId, db) => {
            notStopping(stopping);
            if (!(await this.deps.tasks.markSubmitting(fence, memberId, db))) throw new LeaseLost('lease lost before submit');
          },
          release: async () => void (await this.deps.tasks.clearSubmitting(fence)),
          // A submit that may have reached its member (a timeout) is never sent to another one: the
          // upstream may run it, and a second account would run it again. It is retried on the
          // same member with the same idempotency key (resubmit).
          canFailover: (err) => !err.maybeAccepted && !stopping.aborted,
          signal,
          log,
        },
        async (account) => ({
          account,
          jobId: await attempts.run(
            'submit',
            account,
            (id) => id,
            async () => submitTo(this.videoProvider(account), account, { ...job, model: upstreamModelOf(account, task.model), mapping: await this.deps.pool.mappingFor(account, task.model) }, signal),
            { signal },
          ),
        }),
      );
    } catch (err) {
      if (err instanceof NoCapacity) {
        if (err.reason === 'none') {
          await this.deps.settlement.failVideo(task, 'no_reachable_member', `No backend member can take work for model '${task.model}': every member that serves it is disabled or out of rotation (rejected credentials, a disabled upstream account, or the model refused upstream); the credits were refunded.`);
          return DONE;
        }
        log.debug({ reason: err.reason, retryInMs: err.retryAfterMs }, 'no upstream member free; the task stays queued');
        const why = err.reason === 'full' ? 'every upstream member that serves the model is at its concurrency limit' : 'every upstream member that serves the model is cooling down';
        return later(Math.max(250, spread(Math.min(err.retryAfterMs, 60_000) + 1000)), `Waiting: ${why}.`);
      }
      // The last member's answer came back (it did not take the job): its slot is free again. Without
      // an answer the job may be running there: the mark stays, and the retry resubmits to it.
      if (neverReachedUpstream(err)) await this.deps.tasks.clearSubmitting(fence);
      return this.failOrRetry(task, err);
    }
    return this.saveJob(task, submitted.account, submitted.jobId, log);
  }

  /**
   * An earlier attempt marked the submit as started and never saved a job id (its process died in
   * between, or its call got no answer: a timeout): the job goes to the same member with the same
   * idempotency key, so an upstream that honours it runs the job once; the warning says what happened.
   * The mark stays until a job id is saved or the task ends (at its deadline at the latest): an
   * answer to this resubmit says nothing of whether the earlier one created a job there (a 429, a
   * 5xx, refused credentials or quota), so it is asked again of this member, never routed afresh to
   * another one (design §8: failover only before the upstream accepted the work). An adapter that
   * can tell reports what it found (Kling looks the task up by its idempotency key: the task's id,
   * or maybe accepted when the lookup failed); a refusal of the job itself fails the task, which
   * keeps naming the member (an upstream without idempotency keys may still run the earlier submit).
   * `signal`: the lease-lost signal alone, as for `submit`.
   */
  private async resubmit(task: VideoTaskRow, attempts: AttemptLog, signal: AbortSignal, log: Logger, stopping: AbortSignal): Promise<StepResult> {
    const fence = fenceOf(task);
    const account = await this.deps.pool.account(task.memberId!);
    if (!account || !this.deps.providers.video(account.provider)) {
      await this.deps.tasks.clearSubmitting(fence);
      return later(0);
    }
    notStopping(stopping);
    const provider = this.videoProvider(account);
    if (!provider.findsEarlierSubmit && task.unansweredSubmits >= MAX_UNANSWERED_SUBMITS) {
      // Each unanswered submit may be a job running there, billed to the member's account, that
      // no poll will ever collect: a third is not risked. The operator learns which member and when.
      log.error({ memberId: task.memberId, submitStartedAt: task.submitStartedAt, unansweredSubmits: task.unansweredSubmits }, 'video task failed: its upstream answered none of its submits and cannot be asked about them; a job may be running there that the gateway will never collect');
      await this.deps.settlement.failVideo(task, 'upstream_error', `None of the ${task.unansweredSubmits} submits of this job got an answer saying whether the upstream started it (a timeout, a lost connection, an edge's 5xx), so it is not sent again (a job may have been started there); the credits were refunded.`);
      return DONE;
    }
    log.warn({ memberId: task.memberId, submitStartedAt: task.submitStartedAt, unansweredSubmits: task.unansweredSubmits }, 'resubmitting: an earlier submit of this task may have reached the upstream before its job id was saved; the same idempotency key is sent');
    let job: VideoJob;
    try {
      job = await this.jobOf(task, account, true);
    } catch (err) {
      return this.failOrRetry(task, err);
    }
    // Making the job can take a while (inputs turned upright): a stop meanwhile sends nothing.
    notStopping(stopping);
    if (!(await this.deps.tasks.countResubmit(fence))) throw new LeaseLost('lease lost before resubmit');
    let jobId: string;
    try {
      jobId = await attempts.run('submit', account, (id) => id, () => this.deps.pool.health.observe(account, () => submitTo(provider, account, { ...job, resubmit: true }, signal), undefined, signal), { signal });
    } catch (err) {
      // Answered (not taken): this resubmit started nothing there. The mark stays all the same (the
      // earlier submit may be running there): the retry asks this member again.
      if (neverReachedUpstream(err)) await this.deps.tasks.uncountResubmit(fence);
      return this.failOrRetry(task, err);
    }
    return this.saveJob(task, account, jobId, log);
  }

  private async saveJob(task: VideoTaskRow, account: UpstreamAccount, jobId: string, log: Logger): Promise<StepResult> {
    if (!(await this.deps.tasks.setUpstreamJob(fenceOf(task), account.memberId, jobId))) throw new LeaseLost('lease lost before the job id was saved');
    log.info({ memberId: account.memberId, upstreamJobId: jobId }, 'video job submitted');
    return later(spread(this.videoProvider(account).pollIntervalMs, 0.5));
  }

  private videoProvider(account: UpstreamAccount): VideoProvider {
    const provider = this.deps.providers.video(account.provider);
    if (!provider) throw new Error(`no video adapter for provider '${account.provider}'`);
    return provider;
  }

  /**
   * Downloads the output of a finished job into the media store and completes the task. A
   * download that fails for a reason that may pass (the upstream busy or rate-limiting, a dropped
   * connection, a body cut short or that is not a video, credentials or quota an operator can fix)
   * is retried alone, after the upstream's Retry-After or a backoff, within DOWNLOAD_RETRY (counted
   * in the task's `download_retries`); then, or at once for a permanent failure, the task fails and
   * is refunded. An output the media store cannot take (the gateway's own fault) is retried by the
   * engine and never uses that budget.
   */
  private async finalize(
    task: VideoTaskRow,
    account: UpstreamAccount,
    provider: VideoProvider,
    output: VideoOutputRef,
    attempts: AttemptLog,
    signal: AbortSignal,
    log: Logger,
  ): Promise<StepResult> {
    // Before the download opens anything that would have to be closed if this failed.
    await this.discardLeftovers(task, log);
    let content: VideoContent;
    try {
      const job = await this.jobOf(task, account, true);
      content = await attempts.run('download', account, task.upstreamJobId, () => this.deps.pool.health.observeAccepted(account, () => provider.download(account, task.upstreamJobId!, output, job, signal), signal), { signal });
    } catch (err) {
      // The lease was lost or the worker is stopping: nothing to record; the next claim downloads again.
      if (signal.aborted || (err instanceof Error && err.name === 'AbortError')) throw err;
      return this.downloadFailed(task, asProviderError(err, 'The video download failed.'), log);
    }
    // Whether the body itself failed (cut off, not a video), as opposed to the store or the database.
    let bodyFailed = false;
    content.stream.on('error', () => (bodyFailed = true));
    let file;
    try {
      file = await this.deps.files.save({ accountId: task.accountId, purpose: 'video_output', contentType: content.contentType, taskId: task.id }, content.stream, {
        maxBytes: this.deps.maxOutputBytes,
      });
    } catch (err) {
      content.stream.destroy();
      if (err instanceof MediaTooLarge) return this.fail(task, new ProviderError('failed', `the video is larger than the ${this.deps.maxOutputBytes}-byte limit of this gateway`));
      // The gateway's own storage is full or failing: not the upstream's fault, no reason to fail
      // the task. The engine retries the step with backoff (hold kept) until the video is stored.
      if (err instanceof StorageError) {
        log.error({ err }, 'the video output could not be stored (media store full or failing); the step is retried');
        throw err;
      }
      // Anything but the body's own failure (the database, a stop) is the engine's to retry.
      if (!bodyFailed || signal.aborted) throw err;
      return this.downloadFailed(task, asProviderError(err, 'the upstream video download broke off before the video was complete'), log);
    }
    if (file.bytes === 0 || (content.bytes !== undefined && file.bytes !== content.bytes)) {
      await this.deps.files.discard(file);
      const why = file.bytes === 0 ? 'answered no bytes' : `ended after ${file.bytes} of the ${content.bytes} bytes it announced`;
      return this.downloadFailed(task, new ProviderError('retryable', `the upstream video download ${why}`), log);
    }
    const done = await this.deps.settlement.completeVideo(task, file);
    if (!done) {
      log.warn('task was taken over before it completed here; discarding this output');
      await this.deps.files.discard(file);
    }
    return DONE;
  }

  /**
   * Removes the output an earlier attempt stored and never published (it died between storing it
   * and completing the task) before this attempt downloads again, so that a task whose download
   * then fails for good keeps no output. Only while the task is still this attempt's and unfinished:
   * the output of a completed task is a file of the task too.
   */
  private async discardLeftovers(task: VideoTaskRow, log: Logger): Promise<void> {
    const leftovers = await this.deps.tasks.deleteUnpublishedOutputs(fenceOf(task));
    if (leftovers === undefined) throw new LeaseLost('lease lost before the output of an earlier attempt was discarded');
    if (leftovers.length === 0) return;
    await this.deps.files.discardStored(leftovers);
    log.info({ leftovers: leftovers.length }, 'discarded the output an earlier attempt stored but never completed');
  }

  /** A failed download: retried alone within DOWNLOAD_RETRY when it may pass, else the task fails. */
  private async downloadFailed(task: VideoTaskRow, error: ProviderError, log: Logger): Promise<StepResult> {
    if (!operatorCanFix(error)) return this.fail(task, error);
    const downloadRetries = task.downloadRetries;
    const delay = retryDelay(this.downloadRetry, downloadRetries, Math.random, error);
    if (delay === undefined) {
      log.error({ err: error.message, downloads: downloadRetries + 1 }, 'video download failed repeatedly; the task fails');
      return this.fail(task, new ProviderError('failed', `the video was generated, but its download failed ${downloadRetries + 1} times (last: ${error.message})`));
    }
    if (!(await this.deps.tasks.countDownloadFailure(fenceOf(task)))) throw new LeaseLost('lease lost before the failed download was counted');
    log.warn({ err: error.message, kind: error.kind, retries: downloadRetries + 1, retryInMs: delay }, 'video download failed; retrying the download');
    return later(delay, `The download of the finished video failed: ${ended(error.message)} (${error.kind}${error.upstreamStatus ? `, HTTP ${error.upstreamStatus}` : ''})`);
  }

  /**
   * After a failed upstream call: transient errors (and what an operator can fix: credentials,
   * quota, a member's configuration) are thrown for the engine to retry until the deadline; a
   * rejection fails the task and releases its hold. Anything but the upstream's answer (an abort,
   * a lost lease, the media store, the database, a bug) is thrown as it is, for the engine to tell
   * apart: a stop or an unreachable database is not the task's failure, the media store's fault is
   * named as the gateway's.
   */
  private failOrRetry(task: VideoTaskRow, err: unknown): Promise<StepResult> {
    if (!(err instanceof ProviderError) || operatorCanFix(err)) throw err;
    return this.fail(task, err);
  }

  /** Fails the task with the upstream's (sanitized) reason, as a sentence, as its error.message. */
  private async fail(task: VideoTaskRow, error: ProviderError): Promise<StepResult> {
    // The member's own fault is the operator's to read (member health), not the client's.
    await this.deps.settlement.failVideo(task, taskErrorCodeOf(error), memberFault(error) ? apiErrorOf(error).message : sentence(error.message));
    return DONE;
  }

  /**
   * The job as adapters see it, with the account's model id (none yet: the catalog's). Media inputs
   * only for the steps that send them (submit; download, where the local renderer paints the
   * frame), as streams the adapter opens: no step holds them in memory.
   */
  private async jobOf(task: VideoTaskRow, account: UpstreamAccount | undefined, withMedia: boolean): Promise<VideoJob> {
    const inputs = withMedia ? await this.deps.files.mediaInputs(task.inputFileIds) : [];
    const job: VideoJob = {
      taskId: task.id,
      model: account ? upstreamModelOf(account, task.model) : task.model,
      mapping: account && (await this.deps.pool.mappingFor(account, task.model)),
      prompt: task.prompt,
      negativePrompt: task.negativePrompt,
      durationSeconds: task.durationSeconds,
      aspectRatio: task.aspectRatio,
      resolution: task.resolution,
      generateAudio: task.generateAudio,
      referenceImages: [],
      referenceVideos: task.referenceVideos,
      referenceAudios: task.referenceAudios,
      // Read again at every step: a resubmit sends what is left of the task's lifetime then.
      deadline: task.deadlineAt,
    };
    if (task.inputMode === 'reference_images') job.referenceImages = inputs;
    else {
      if (inputs[0]) job.firstFrame = inputs[0];
      if (inputs[1]) job.lastFrame = inputs[1];
    }
    return job;
  }
}

/** A failure that may pass by itself or by an operator's hand (not the job's own): worth retrying until the deadline. */
/** The member's configuration, credentials or account, not the request nor a passing fault. */
function memberFault(error: ProviderError): boolean {
  return ['auth', 'quota_exhausted', 'misconfigured', 'model_not_open', 'account_disabled'].includes(error.kind);
}

/**
 * A poll's thrown failure is its status call's, never the job's (a job that failed comes back as
 * `{ state: 'failed' }`): a status call carries nothing of the client's, so a refusal of it (an
 * error answer the adapter read as the request's or as policy) is a passing failure, asked again
 * until the task's deadline, never a running, billed job failed as the client's fault. One rule for
 * every adapter (Ark and DashScope also say so themselves, with the kind their upstream's answer means).
 */
function statusCallFailure(err: unknown): unknown {
  return err instanceof ProviderError && (err.kind === 'invalid_request' || err.kind === 'policy') ? err.with({ kind: 'retryable' }) : err;
}

function operatorCanFix(error: ProviderError): boolean {
  return error.transient || ['auth', 'quota_exhausted', 'misconfigured', 'model_not_open', 'account_disabled'].includes(error.kind);
}

/**
 * Answers to a submit that say nothing of whether the job was created: a gateway timeout (504,
 * Cloudflare's 524) whatever its body (Kling's `5002 timeout`, Veo's `DEADLINE_EXCEEDED`: the
 * origin may still be making it), and a 500 or 502 without the upstream's own error code (an edge's
 * page, not the API's envelope: MiniMax's `500 server_error (1000)` is the API refusing). 503 (the
 * upstream takes no work now) and 4xx answers are the upstream's own refusals.
 */
function unknownOutcome(err: ProviderError): boolean {
  const status = err.upstreamStatus;
  if (status === 504 || status === 524) return true;
  return (status === 500 || status === 502) && err.upstreamCode === undefined;
}

/**
 * Sends a video submit. An answer of unknown outcome (`unknownOutcome`) is maybe accepted (as a
 * timeout is): no failover to another member (Pool.route's `canFailover`), counted as an unanswered
 * submit, resubmitted to the same member under MAX_UNANSWERED_SUBMITS. Image calls keep failing
 * over on 5xx: an image is cheap, and the request waits for it. A status the adapter read as a
 * refusal of the job itself (its kind not `retryable`) stays one.
 */
async function submitTo(provider: VideoProvider, account: UpstreamAccount, job: VideoJob, signal: AbortSignal): Promise<string> {
  try {
    return await provider.submit(account, job, signal);
  } catch (err) {
    const edge = err instanceof ProviderError && err.kind === 'retryable' && !err.maybeAccepted && unknownOutcome(err);
    throw edge ? err.with({ maybeAccepted: true }) : err;
  }
}

/**
 * A submit's failure that proves the upstream has no job from it: it answered (a ProviderError not
 * maybe accepted), or the gateway's media store failed while the body was made or sent (the
 * upstream never had all of it: upstreamFetch throws the body's own failure as it is).
 */
function neverReachedUpstream(err: unknown): boolean {
  return (err instanceof ProviderError && !err.maybeAccepted) || err instanceof StorageError;
}

/**
 * Throws when the worker is stopping, before a submit goes out: as an abort (rethrown by
 * failOrRetry), so the engine ends the step as stopped and the task resumes after its lease.
 */
function notStopping(stopping: AbortSignal): void {
  if (!stopping.aborted) return;
  const err = new Error(`not submitting: ${String((stopping.reason as Error | undefined)?.message ?? 'the worker is stopping')}`);
  err.name = 'AbortError';
  throw err;
}
