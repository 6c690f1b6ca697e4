/**
 * The one retry policy of leased work: exponential backoff with jitter, up to a number of
 * consecutive transient failures (video tasks: until their deadline); an upstream's Retry-After
 * wins over the backoff. A kind with a published schedule (webhook deliveries) lists its delays
 * instead. Each kind of task parameterizes it.
 */
import { ProviderError } from '../../providers/provider-error.ts';

export interface RetryPolicy {
  /** Transient failures in a row after which the task gives up (Infinity: until its deadline). */
  maxRetries: number;
  baseDelayMs: number;
  maxDelayMs: number;
  /**
   * Published delays instead of the exponential backoff: the k-th retry waits `scheduleMs[k]` plus
   * up to `scheduleJitter` of it (default 10 %); the retries end with the list (`maxRetries` is
   * then the list's length at most).
   */
  scheduleMs?: readonly number[];
  scheduleJitter?: number;
}

/** Delay before the next try after `retries` failures so far, or undefined: give up. */
export function retryDelay(policy: RetryPolicy, retries: number, random: () => number = Math.random, err?: unknown): number | undefined {
  if (retries >= policy.maxRetries) return undefined;
  if (policy.scheduleMs) {
    const delay = policy.scheduleMs[retries];
    return delay === undefined ? undefined : jitter(delay, policy.scheduleJitter ?? 0.1, random);
  }
  if (err instanceof ProviderError && err.retryAfterMs !== undefined) return jitter(err.retryAfterMs, 0.1, random);
  const ceiling = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** Math.min(retries, 30));
  // Full jitter, but never less than half the ceiling: spreads retries without retrying at once.
  return Math.round(ceiling / 2 + (random() * ceiling) / 2);
}

/**
 * Adds up to `fraction` of `ms` at random, so that many jobs polled together drift apart (5,000
 * jobs created in one second are polled over the following ones, not in one burst).
 */
export function jitter(ms: number, fraction = 0.1, random: () => number = Math.random): number {
  return Math.round(ms * (1 + random() * fraction));
}

/**
 * A poll delay of about `ms` that never exceeds it: spreads polls of many jobs (down to
 * `1 - fraction` of the interval) while keeping the detection delay within one interval.
 */
export function spread(ms: number, fraction = 0.2, random: () => number = Math.random): number {
  return Math.round(ms * (1 - random() * fraction));
}
