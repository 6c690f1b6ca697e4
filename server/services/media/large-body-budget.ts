/**
 * The bytes of request media held in memory at once, per process (LARGE_BODY_BUDGET_BYTES): a large
 * multipart edit takes its Content-Length before it is read (`largeBodySlots`, http/request-guards.ts);
 * a JSON edit that names stored files or URLs takes their bytes before they are read into memory
 * (`ImageService`), until its request is over.
 *
 * One account holds at most half the budget (`accountShare`): a body is read for as long as its
 * client keeps it moving (BODY_TIMEOUT_MS, 15 min by default), so one account trickling a large body
 * would otherwise keep every other account's large edits waiting, then 503. A request of an account
 * that would pass its share is refused at once, `429 too_many_in_flight` naming the account; the
 * other half stays for the other accounts.
 */
import { ApiError, returningRateToken } from '../../errors.ts';
import { Semaphore } from '../../lib/semaphore.ts';
import { IN_FLIGHT_RETRY_AFTER_SECONDS } from '../limits/client-limits.ts';

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
  /** Bytes each account holds or waits for (accounts with none are not kept). */
  private readonly perAccount = new Map<string, number>();
  /** The most one account holds of the budget, its requests waiting for their turn included: half of it. */
  readonly accountShare: number;

  constructor(readonly opts: LargeBodyOptions) {
    this.budget = new Semaphore(opts.budgetBytes);
    this.accountShare = Math.max(1, Math.floor(opts.budgetBytes / 2));
  }

  /** Bytes of the budget held right now. */
  get inUse(): number {
    return this.budget.inUse;
  }

  /** Bytes `accountId` holds or waits for right now. */
  heldBy(accountId: string): number {
    return this.perAccount.get(accountId) ?? 0;
  }

  /**
   * Waits up to LARGE_BODY_WAIT_MS for `bytes` (the whole budget at most: a budget in memory, never
   * overcommitted); 503 server_busy after that, or as soon as `signal` aborts (at once when it
   * already has).
   *
   * With `accountId`, a request is `429 too_many_in_flight` at once, waiting for nothing, when what
   * the account already holds or waits for and this (counted up to the share) would pass its share:
   * an account with nothing held may start one body of any size; a body of unknown length is given
   * the share (largeBodySlots), so one trickled leaves the other half to other accounts.
   */
  async acquire(bytes: number, signal?: AbortSignal, accountId?: string): Promise<() => void> {
    if (accountId === undefined) return this.take(bytes, signal);
    const share = this.accountShare;
    const units = Math.min(Math.max(bytes, 0), this.opts.budgetBytes);
    const held = this.heldBy(accountId);
    if (held > 0 && held + Math.min(units, share) > share) throw accountShareUsed(held, Math.min(units, share), share);
    this.perAccount.set(accountId, held + units);
    let given = false;
    const giveBack = () => {
      if (given) return;
      given = true;
      const left = this.heldBy(accountId) - units;
      if (left > 0) this.perAccount.set(accountId, left);
      else this.perAccount.delete(accountId);
    };
    try {
      const release = await this.take(units, signal);
      return () => {
        release();
        giveBack();
      };
    } catch (err) {
      giveBack();
      throw err;
    }
  }

  private async take(bytes: number, signal?: AbortSignal): Promise<() => void> {
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

/** Bytes as MiB for a message: whole, or to a tenth (a small budget's share). */
function mib(bytes: number): string {
  const value = bytes / 2 ** 20;
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}

/** `429 too_many_in_flight` of an account whose large bodies would pass its share of the budget. */
function accountShareUsed(held: number, bytes: number, share: number): ApiError {
  // Refused before the body is read: its request-per-minute token goes back.
  return returningRateToken(new ApiError(
    429,
    'too_many_in_flight',
    `This API key's account already has ${mib(held)} MiB of large request bodies being received or handled on this server; with this one's ${mib(bytes)} MiB it would pass its share of ${mib(share)} MiB. Retry when one of them has finished.`,
    null,
    {},
    { 'Retry-After': String(IN_FLIGHT_RETRY_AFTER_SECONDS) },
  ));
}
