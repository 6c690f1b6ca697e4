/**
 * The durable task engine (design §6), one per task runner in every worker process. It claims due
 * rows in batches with the shared leased-task helper, runs one short step of each under a lease
 * kept by heartbeat (aborted when the lease is lost or the engine stops; a call the upstream may
 * have accepted, only when the lease is lost: see stop()), and then does what the step asked:
 * nothing (the task was settled), reschedule its next step, or — when the step threw — retry it
 * later per the runner's retry policy, or give up. It never sleeps while holding a lease.
 * A crashed worker's rows are claimed again once their lease expires, so nothing is lost.
 */
import { randomBytes } from 'node:crypto';
import { isDatabaseUnavailable } from '../db/database.ts';
import { sentence } from '../errors.ts';
import { ProviderError } from '../providers/provider-error.ts';
import { StorageError } from '../storage/storage-error.ts';
import type { Logger } from '../logger.ts';
import { fenceOf, type Fence } from '../repositories/leased-tasks.ts';
import { keepLease } from '../services/tasks/lease.ts';
import { retryDelay } from '../services/tasks/retry-policy.ts';
import { LeaseLost, type LeasedRow, type TaskRunner } from '../services/tasks/task-runner.ts';

export interface TaskEngineOptions {
  leaseMs: number;
  /** Periodic claim when nothing woke the engine. */
  pollMs: number;
  /** Steps this engine runs at once. */
  concurrency: number;
  random?: () => number;
  /** Called once per step with what came of it (metrics). */
  onStep?: (outcome: StepOutcome) => void;
}

/** done: settled; next: rescheduled; retry: transient failure, retried later; gave_up: failed after the last retry; lost: lease lost. */
export type StepOutcome = 'done' | 'next' | 'retry' | 'gave_up' | 'lost';

export class TaskEngine<Row extends LeasedRow> {
  readonly workerId = `w_${process.pid}_${randomBytes(4).toString('hex')}`;
  private readonly running = new Map<string, Promise<void>>();
  /** Reschedules handed to the repository and not yet written. */
  private readonly landing = new Set<Promise<void>>();
  private readonly stopping = new AbortController();
  private wakeUp: (() => void) | undefined;
  /** Re-arms the wait when a step reschedules a row sooner than the wait would end. */
  private rearm: (() => void) | undefined;
  private woken = false;
  /** When the rows this engine rescheduled become due, so a drained engine claims them on time. */
  private readonly due = new DueTimes();
  /** The last claim found fewer due rows than it asked for: nothing more is due right now. */
  private drained = false;
  private loopDone: Promise<void> | undefined;
  /** Claims that failed in a row (the database is away): the next one waits longer, up to CLAIM_BACKOFF.maxMs. */
  private claimFailures = 0;

  constructor(
    private readonly runner: TaskRunner<Row>,
    private readonly log: Logger,
    private readonly options: TaskEngineOptions,
  ) {}

  start(): void {
    if (this.options.concurrency <= 0) return;
    this.loopDone = this.loop();
  }

  /** Claims work now instead of at the next periodic claim. */
  wake(): void {
    this.woken = true;
    this.wakeUp?.();
  }

  /**
   * Stops claiming and aborts running steps; their rows are claimed again after their lease. A call
   * a step makes under the lease-lost signal alone is not aborted: this waits for it and for the step
   * to save what it learned, the lease kept by its heartbeat meanwhile. That is a video submit (the
   * upstream may have accepted the job, and without its id saved the next attempt would submit it
   * again, a second billed job on an upstream without idempotency keys), bounded by its upstream
   * timeout (UPSTREAM_TIMEOUT_MS, 60 s a call), and a background image's upstream call whose job is
   * not recorded (an OpenAI-style call has none: cut, it may still be billed upstream, and the next
   * step calls again), whose images the step then stores and settles (ImageRunner's
   * UpstreamCallDrain), bounded by its adapter's timeout (minutes for some upstreams). What a
   * process stop does with a longer wait is in workers/index.ts: its forced exit cuts the call as a
   * crash would, and the task's next step counts the cut call as a retry.
   */
  async stop(): Promise<void> {
    this.stopping.abort(new Error('worker stopping'));
    this.wake();
    await this.loopDone;
    await Promise.allSettled(this.running.values());
    await Promise.allSettled(this.landing);
  }

  private async loop(): Promise<void> {
    const { concurrency, pollMs, leaseMs } = this.options;
    while (!this.stopping.signal.aborted) {
      this.woken = false;
      const free = concurrency - this.running.size;
      let claimed: Row[] = [];
      if (free > 0) {
        try {
          claimed = (await this.runner.leases.claimDue(this.workerId, free, leaseMs)) as unknown as Row[];
          if (this.claimFailures > 0) this.log.info({ failedClaims: this.claimFailures }, 'task engine: claiming works again');
          this.claimFailures = 0;
        } catch (err) {
          this.claimFailures++;
          await this.claimFailed(err);
          continue;
        }
      }
      if (free > 0) {
        this.drained = claimed.length < free;
        // The claim took every row due by now (or a full batch, and the loop claims again at once).
        this.due.dropUntil(Date.now());
      }
      for (const task of claimed) {
        const run = this.run(task).finally(() => {
          this.running.delete(task.id);
          // Refill in batches (one claim for a quarter of the slots) while rows are due; once a claim
          // came back short, the next periodic claim or a notification picks up what becomes due.
          if (!this.drained && this.running.size <= concurrency - Math.max(1, concurrency >> 2)) this.wake();
        });
        this.running.set(task.id, run);
      }
      // Claim again at once after a full batch; otherwise wait for a wake-up, the moment a step this
      // engine rescheduled becomes due, or the next period (which also finds rows of crashed workers).
      if (this.woken || (claimed.length === free && free > 0)) continue;
      await new Promise<void>((resolve) => {
        let timer: NodeJS.Timeout | undefined;
        this.rearm = () => {
          clearTimeout(timer);
          // A little after the earliest due time, so that steps due together are claimed together.
          const untilDue = this.due.earliest() - Date.now() + DUE_SLACK_MS;
          timer = setTimeout(resolve, Math.max(0, Math.min(pollMs, untilDue)));
        };
        this.rearm();
        this.wakeUp = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wakeUp = undefined;
      this.rearm = undefined;
    }
  }

  /**
   * After a failed claim: one line for the first failure of a row of them (the database is away,
   * or something is wrong with it), then a wait that doubles with every further failure, so an
   * outage costs a few attempts a minute, and the first claim after it succeeds within seconds.
   */
  private async claimFailed(err: unknown): Promise<void> {
    const waitMs = Math.min(CLAIM_BACKOFF.maxMs, CLAIM_BACKOFF.baseMs * 2 ** (this.claimFailures - 1));
    if (this.claimFailures === 1) {
      if (isDatabaseUnavailable(err)) this.log.warn({ kind: this.runner.name, err: (err as Error).message, retryInMs: waitMs }, 'task engine: the database is unavailable; claiming again with backoff');
      else this.log.error({ err, kind: this.runner.name, retryInMs: waitMs }, 'task engine: claim failed; claiming again with backoff');
    }
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, waitMs);
      this.wakeUp = () => {
        // Only a stop cuts the wait short: a wake-up meanwhile would claim against the same failure.
        if (!this.stopping.signal.aborted) return;
        clearTimeout(timer);
        resolve();
      };
    });
    this.wakeUp = undefined;
  }

  /**
   * Hands a row back for its next step in `delayMs`. The slot frees at once: the reschedule goes
   * out with the others of the same few milliseconds in one statement, and until it lands the row
   * stays leased to this worker, so no claim takes it. Should it never land (a database error, a
   * crash), the row is claimed again when its lease expires.
   */
  private handBack(fence: Fence, delayMs: number, failed: boolean, log: Logger, error?: string): void {
    const landed: Promise<void> = this.runner.leases
      .reschedule(fence, delayMs, { failed, error })
      .then(
        (ok) => {
          if (ok) this.dueIn(delayMs);
          else log.info('task was taken over before its next step was scheduled');
        },
        (err: unknown) =>
          isDatabaseUnavailable(err)
            ? log.warn({ err: (err as Error).message }, 'rescheduling a task failed: the database is unavailable; it resumes when its lease expires')
            : log.error({ err }, 'rescheduling a task failed; it resumes when its lease expires'),
      )
      .finally(() => this.landing.delete(landed));
    this.landing.add(landed);
  }

  private dueIn(ms: number): void {
    const at = Date.now() + Math.max(0, ms);
    const sooner = at < this.due.earliest();
    this.due.add(at);
    if (sooner) this.rearm?.();
  }

  private async run(task: Row): Promise<void> {
    const fence = fenceOf(task);
    const log = this.log.child({ taskId: task.id, attempt: task.attempt });
    const lease = keepLease(this.runner.leases, fence, this.workerId, this.options.leaseMs, log, this.stopping.signal);
    const outcome = (o: StepOutcome) => this.options.onStep?.(o);
    try {
      const result = await this.runner.step(task, lease.signal, log, lease.lost);
      if (!result.done) this.handBack(fence, result.nextInMs, result.failed ?? false, log, result.error);
      outcome(result.done ? 'done' : result.failed ? 'retry' : 'next');
    } catch (err) {
      if (lease.signal.aborted || err instanceof LeaseLost) {
        outcome('lost');
        log.info({ reason: String(lease.signal.reason ?? err) }, 'task step stopped; it resumes after its lease expires');
        return;
      }
      // Not the task's failure: it keeps its retries and resumes on any instance once its lease runs out.
      if (isDatabaseUnavailable(err)) {
        outcome('lost');
        log.warn({ err: (err as Error).message }, 'task step stopped: the database is unavailable; it resumes after its lease expires');
        return;
      }
      const delay = retryDelay(this.runner.retry, task.retries, this.options.random, err);
      try {
        if (delay === undefined) {
          outcome('gave_up');
          await this.runner.giveUp(task, err, log);
        } else {
          outcome('retry');
          log.warn({ err, retries: task.retries + 1, retryInMs: delay }, `${this.runner.name} task step failed; retrying`);
          this.handBack(fence, delay, true, log, lastErrorOf(err));
        }
      } catch (e) {
        log.error({ err: e }, 'task error handling failed');
      }
    } finally {
      lease.release();
    }
  }
}

/**
 * What a failed step leaves as its task's last error: an upstream's reason is sanitized already
 * (ProviderError); anything else may hold internal details and is named only by its kind.
 */
function lastErrorOf(err: unknown): string {
  if (err instanceof ProviderError) return `${sentence(err.message)} (${err.kind}${err.upstreamStatus ? `, HTTP ${err.upstreamStatus}` : ''})`;
  if (err instanceof StorageError) return `The media store ${err.condition === 'full' ? 'is full' : 'cannot be written'}.`;
  return 'An internal error; the server log has its details.';
}

const DUE_SLACK_MS = 25;
/** Waits between failed claims: 200 ms, doubling up to 5 s. */
const CLAIM_BACKOFF = { baseMs: 200, maxMs: 5000 };

/** A min-heap of due times (ms since the epoch). */
class DueTimes {
  private readonly heap: number[] = [];

  earliest(): number {
    return this.heap[0] ?? Infinity;
  }

  add(at: number): void {
    const h = this.heap;
    h.push(at);
    for (let i = h.length - 1; i > 0; ) {
      const parent = (i - 1) >> 1;
      if (h[parent]! <= h[i]!) break;
      [h[parent], h[i]] = [h[i]!, h[parent]!];
      i = parent;
    }
  }

  /** Forgets the times up to `now`: the claim that just ran has taken those rows. */
  dropUntil(now: number): void {
    while (this.heap.length > 0 && this.heap[0]! <= now) this.pop();
  }

  private pop(): void {
    const h = this.heap;
    const last = h.pop()!;
    if (h.length === 0) return;
    h[0] = last;
    for (let i = 0; ; ) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < h.length && h[l]! < h[m]!) m = l;
      if (r < h.length && h[r]! < h[m]!) m = r;
      if (m === i) break;
      [h[m], h[i]] = [h[i]!, h[m]!];
      i = m;
    }
  }
}
