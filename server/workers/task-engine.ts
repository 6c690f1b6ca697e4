/**
 * The durable task engine (design §6), generic over task kinds. Every server process runs one per
 * kind. It claims due tasks with short `FOR UPDATE SKIP LOCKED` transactions that set a lease,
 * renews the lease by heartbeat while a task runs, and aborts the work when the lease is lost.
 * The kind fences every write with the attempt number, so a worker whose lease expired cannot
 * overwrite the one that took over. A crashed worker's tasks are claimed again once their lease
 * expires, so nothing is lost.
 */
import { randomBytes } from 'node:crypto';
import type { Logger } from '../logger.ts';

export interface Fence {
  id: string;
  attempt: number;
}

export interface TaskKind<T extends Fence> {
  readonly name: string;
  claimDue(workerId: string, limit: number, leaseMs: number): Promise<T[]>;
  heartbeat(fence: Fence, workerId: string, leaseMs: number): Promise<boolean>;
  /** Runs one claimed attempt to its end (completed or failed). Throws on a transient failure. */
  run(task: T, signal: AbortSignal, log: Logger): Promise<void>;
  /** A transient failure of an attempt: schedule a retry or give up. */
  onError(task: T, err: unknown, log: Logger): Promise<void>;
}

export interface TaskEngineOptions {
  leaseMs: number;
  pollMs: number;
  concurrency: number;
}

export class LeaseLost extends Error {}

/** Sleeps `ms`, ending early on abort; leaves no listener behind either way. */
export function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

export class TaskEngine<T extends Fence> {
  readonly workerId = `w_${process.pid}_${randomBytes(4).toString('hex')}`;
  private readonly running = new Map<string, Promise<void>>();
  private readonly stopping = new AbortController();
  private wakeUp: (() => void) | undefined;
  private loopDone: Promise<void> | undefined;

  constructor(
    private readonly kind: TaskKind<T>,
    private readonly log: Logger,
    private readonly options: TaskEngineOptions,
  ) {}

  start(): void {
    if (this.options.concurrency <= 0) return;
    this.loopDone = this.loop();
  }

  /** Claims work now instead of at the next poll (called after a task is created here). */
  wake(): void {
    this.wakeUp?.();
  }

  /** Stops claiming and aborts running work; unfinished tasks are picked up again after their lease. */
  async stop(): Promise<void> {
    this.stopping.abort(new Error('worker stopping'));
    this.wake();
    await this.loopDone;
    await Promise.allSettled(this.running.values());
  }

  private async loop(): Promise<void> {
    const { concurrency, pollMs, leaseMs } = this.options;
    while (!this.stopping.signal.aborted) {
      const free = concurrency - this.running.size;
      let claimed: T[] = [];
      if (free > 0) {
        try {
          claimed = await this.kind.claimDue(this.workerId, free, leaseMs);
        } catch (err) {
          this.log.error({ err, kind: this.kind.name }, 'task engine: claim failed');
        }
      }
      for (const task of claimed) {
        const run = this.run(task).finally(() => {
          this.running.delete(task.id);
          this.wake();
        });
        this.running.set(task.id, run);
      }
      if (claimed.length === 0 || this.running.size >= concurrency) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, pollMs);
          this.wakeUp = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.wakeUp = undefined;
      }
    }
  }

  private async run(task: T): Promise<void> {
    const fence: Fence = { id: task.id, attempt: task.attempt };
    const log = this.log.child({ taskId: task.id, attempt: task.attempt });
    const work = new AbortController();
    const onStop = () => work.abort(this.stopping.signal.reason);
    this.stopping.signal.addEventListener('abort', onStop, { once: true });
    const heartbeat = setInterval(() => {
      this.kind
        .heartbeat(fence, this.workerId, this.options.leaseMs)
        .then((ok) => {
          if (!ok) work.abort(new LeaseLost('lease lost'));
        })
        .catch((err: unknown) => log.warn({ err }, 'heartbeat failed'));
    }, Math.max(100, Math.floor(this.options.leaseMs / 3)));
    try {
      await this.kind.run(task, work.signal, log);
    } catch (err) {
      if (work.signal.aborted || err instanceof LeaseLost) {
        log.info({ reason: String(work.signal.reason ?? err) }, 'task attempt stopped; it resumes after its lease expires');
      } else {
        await this.kind.onError(task, err, log).catch((e: unknown) => log.error({ err: e }, 'task error handling failed'));
      }
    } finally {
      clearInterval(heartbeat);
      this.stopping.signal.removeEventListener('abort', onStop);
    }
  }
}
