/**
 * Group commit for the statements of the hot path (the credit hold and the settlement of a
 * synchronous image). Each request's statement costs PostgreSQL a fixed amount of work however few
 * rows it writes (executor start, WAL records, the commit, its flush, two socket wake-ups): a
 * statement that writes the rows of 16 requests costs the backend about a quarter of 16 statements
 * (`npm run bench -- hold`). So while a batch is in flight, the requests that arrive queue and go out
 * together as the next batch: one statement, one commit.
 *
 * - Nobody waits for a batch to fill: with fewer than `maxInFlight` batches in flight, what is
 *   queued goes at the end of the current turn of the event loop (every request that reached this
 *   point in the same turn joins it). One request alone runs the single-request statement, so at
 *   concurrency 1 nothing changes.
 * - A batch statement is all or nothing (one statement): when it fails for any reason (a guard
 *   refused one of its requests, a unique violation, a lost connection), nothing of it was written
 *   and each of its requests runs its single-request statement, which gives that request its own
 *   answer or error. A batch therefore never answers differently from the requests run one by one
 *   after each other. The one exception is a connection lost after the commit: the batch was
 *   written but its answer was not heard. The single statements then find their work done, and a
 *   runner's `one` must recognize that (ImageTaskRepository reads the task back; a hold's rerun
 *   meets its own rows on their primary keys and goes on with its task, LedgerRepository.holdAlone).
 * - A request its caller knows a batch would refuse goes `alone`, never into a batch.
 */
import { setImmediate } from 'node:timers';

export interface BatchRunner<I, O> {
  /** The single-request statement (also the fallback when a batch fails). */
  one(item: I): Promise<O>;
  /** One statement for all `items` (at least 2); answers in their order. Throws to fall back. */
  many(items: readonly I[]): Promise<O[]>;
}

export interface BatcherOptions {
  /** Batches in flight at once (connections the batcher uses); at least 1. */
  maxInFlight: number;
  /** Most requests in one batch. */
  maxBatch: number;
}

/** What a batcher did: batch statements, the requests they carried, requests run alone, batches that fell back. */
export interface BatchStats {
  batches: number;
  batched: number;
  singles: number;
  fallbacks: number;
}

interface Waiting<I, O> {
  item: I;
  resolve: (out: O) => void;
  reject: (err: unknown) => void;
}

export class StatementBatcher<I, O> {
  private queue: Waiting<I, O>[] = [];
  private inFlight = 0;
  private scheduled = false;

  /** Counters for /metrics, the bench and the tests. */
  readonly stats: BatchStats = { batches: 0, batched: 0, singles: 0, fallbacks: 0 };

  constructor(
    private readonly runner: BatchRunner<I, O>,
    private readonly opts: BatcherOptions,
  ) {}

  run(item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.queue.push({ item, resolve, reject });
      this.schedule();
    });
  }

  /**
   * Runs `item`'s single statement at once, outside any batch: for a request the caller expects to
   * be refused (its key's quota just was), which would make any batch it joined fall back.
   */
  alone(item: I): Promise<O> {
    this.stats.singles++;
    return this.runner.one(item);
  }

  private schedule(): void {
    if (this.scheduled || this.inFlight >= this.opts.maxInFlight || this.queue.length === 0) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      while (this.inFlight < this.opts.maxInFlight && this.queue.length > 0) {
        const batch = this.queue.splice(0, this.opts.maxBatch);
        this.inFlight++;
        void this.send(batch).finally(() => {
          this.inFlight--;
          this.schedule();
        });
      }
    });
  }

  private async send(batch: Waiting<I, O>[]): Promise<void> {
    if (batch.length > 1) {
      let outs: O[] | undefined;
      try {
        outs = await this.runner.many(batch.map((w) => w.item));
      } catch {
        // Nothing of the batch was written: each request gets its own statement's answer.
        this.stats.fallbacks++;
      }
      if (outs) {
        this.stats.batches++;
        this.stats.batched += batch.length;
        batch.forEach((w, i) => w.resolve(outs[i]!));
        return;
      }
    }
    this.stats.singles += batch.length;
    await Promise.all(
      batch.map((w) =>
        this.runner.one(w.item).then(
          (out) => w.resolve(out),
          (err: unknown) => w.reject(err),
        ),
      ),
    );
  }
}
