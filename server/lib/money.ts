/**
 * Money is integer micro-credits everywhere inside the service (1 credit = 1,000,000); the API shows
 * decimal credits. Conversions happen only at the edges, here.
 */
export const MICRO = 1_000_000;

/** Micro-credits -> the decimal number the API shows (exact: the result is the nearest double to the decimal). */
export function toCredits(micro: number): number {
  return micro / MICRO;
}

/** Decimal credits from a request -> micro-credits; undefined when it has more than 6 fractional digits or is out of range. */
export function fromCredits(credits: number): number | undefined {
  if (!Number.isFinite(credits)) return undefined;
  const micro = Math.round(credits * MICRO);
  if (!Number.isSafeInteger(micro) || Math.abs(micro / MICRO - credits) > 1e-9 * Math.max(1, Math.abs(credits))) return undefined;
  return micro;
}
