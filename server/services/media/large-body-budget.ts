/**
 * The bytes of request media held in memory at once, per process (LARGE_BODY_BUDGET_BYTES): a large
 * multipart edit takes its Content-Length before it is read (`largeBodySlots`, http/request-guards.ts);
 * a JSON edit that names stored files or URLs takes their bytes before they are read into memory
 * (`ImageService`), until its request is over.
 */
import { ApiError } from '../../errors.ts';
import { Semaphore } from '../../lib/semaphore.ts';

export interface LargeBodyOptions {
  /** Bodies above this many bytes (or of unknown length) are large. */
  largeBodyBytes: number;
  /** Bytes of large bodies handled at once: each takes its Content-Length (the whole budget when the length is unknown). */
  budgetBytes: number;
  /** How long a large body waits for a slot before 503 server_busy. */
  waitMs: number;
}

export class LargeBodyBudget {
  private readonly budget: Semaphore;

  constructor(readonly opts: LargeBodyOptions) {
    this.budget = new Semaphore(opts.budgetBytes);
  }

  /** Bytes of the budget held right now. */
  get inUse(): number {
    return this.budget.inUse;
  }

  /**
   * Waits up to LARGE_BODY_WAIT_MS for `bytes` (the whole budget at most); 503 server_busy after that,
   * or as soon as `signal` aborts (at once when it already has).
   */
  async acquire(bytes: number, signal?: AbortSignal): Promise<() => void> {
    const gone = new AbortController();
    const timer = setTimeout(() => gone.abort(new Error('timeout')), this.opts.waitMs);
    const onAbort = () => gone.abort(signal?.reason);
    // An 'abort' listener added to a signal already aborted never runs: that would grant the budget
    // to a caller that is gone, and nothing would give it back.
    if (signal?.aborted) onAbort();
    else signal?.addEventListener('abort', onAbort, { once: true });
    try {
      return await this.budget.acquire(gone.signal, bytes);
    } catch {
      const retryAfter = String(Math.max(1, Math.ceil(this.opts.waitMs / 1000)));
      throw new ApiError(503, 'server_busy', `Too many large requests are being processed; retry in ${retryAfter} s.`, null, {}, { 'Retry-After': retryAfter });
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    }
  }
}
