/**
 * The one retry policy of leased work: exponential backoff with full jitter, up to a number of
 * consecutive transient failures; each kind of task parameterizes it.
 */
export interface RetryPolicy {
  /** Transient failures in a row after which the task gives up. */
  maxRetries: number;
  baseDelayMs: number;
  maxDelayMs: number;
}

/** Delay before the next try after `retries` failures so far, or undefined: give up. */
export function retryDelay(policy: RetryPolicy, retries: number, random: () => number = Math.random): number | undefined {
  if (retries >= policy.maxRetries) return undefined;
  const ceiling = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** retries);
  // Full jitter, but never less than half the ceiling: spreads retries without retrying at once.
  return Math.round(ceiling / 2 + (random() * ceiling) / 2);
}

/** Adds up to `fraction` of `ms` at random, so that many jobs polled together drift apart. */
export function jitter(ms: number, fraction = 0.1, random: () => number = Math.random): number {
  return Math.round(ms * (1 + random() * fraction));
}
