/**
 * A counting semaphore: holders take `weight` units (default 1) of `limit`; the rest wait in order
 * (first in, first served, so a heavy waiter is not starved by light ones).
 */
export class Semaphore {
  private active = 0;
  private readonly waiting: { weight: number; grant: () => void }[] = [];

  constructor(private readonly limit: number) {}

  /** Waits for `weight` units (capped at the limit); rejects (and leaves the queue) when `signal` aborts first. */
  acquire(signal?: AbortSignal, weight = 1): Promise<() => void> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    const units = Math.min(Math.max(weight, 0), this.limit);
    if (this.waiting.length === 0 && this.active + units <= this.limit) {
      this.active += units;
      return Promise.resolve(this.releaser(units));
    }
    return new Promise((resolve, reject) => {
      const entry = {
        weight: units,
        grant: () => {
          signal?.removeEventListener('abort', onAbort);
          this.active += units;
          resolve(this.releaser(units));
        },
      };
      const onAbort = () => {
        const i = this.waiting.indexOf(entry);
        if (i >= 0) this.waiting.splice(i, 1);
        reject(signal!.reason);
        this.drain();
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(entry);
    });
  }

  /**
   * Takes `weight` units now, or nothing: undefined when they are not free (or others wait). For a
   * cap that refuses rather than queues (a request that waited would hold its connection as long).
   */
  tryAcquire(weight = 1): (() => void) | undefined {
    const units = Math.min(Math.max(weight, 0), this.limit);
    if (this.waiting.length > 0 || this.active + units > this.limit) return undefined;
    this.active += units;
    return this.releaser(units);
  }

  /** Units held right now. */
  get inUse(): number {
    return this.active;
  }

  /** Callers waiting for their units right now. */
  get queued(): number {
    return this.waiting.length;
  }

  private drain(): void {
    while (this.waiting.length > 0 && this.active + this.waiting[0]!.weight <= this.limit) this.waiting.shift()!.grant();
  }

  private releaser(units: number): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.active -= units;
      this.drain();
    };
  }
}
