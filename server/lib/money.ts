/**
 * Money is integer micro-credits everywhere inside the service (1 credit = 1,000,000); the API shows
 * decimal credits. Conversions happen only at the edges, here.
 */
export const MICRO = 1_000_000;

/** Micro-credits -> the decimal number the API shows (exact: the result is the nearest double to the decimal). */
export function toCredits(micro: number): number {
  return micro / MICRO;
}

/**
 * Decimal credits from a request -> micro-credits; undefined when it has more than 6 fractional
 * digits or is out of range. A decimal of at most 6 fractional digits parses to the nearest double
 * to it, and `micro / MICRO` (a correctly rounded division of two exact numbers) is that same
 * double: the micro-credits are the integer whose quotient is exactly the number sent.
 * `credits * MICRO` may round to a neighbour of it (from 2^32 credits up), so the neighbours are
 * tried too. Otherwise the nearest is kept when it is a few units in the last place off, relative
 * to the amount: a client's floating-point noise passes (`0.1 + 0.2` sent as 0.30000000000000004
 * is 0.3), a 7th digit does not, at any size (1000.0000004 is about a million units off).
 */
export function fromCredits(credits: number): number | undefined {
  if (!Number.isFinite(credits)) return undefined;
  const near = Math.round(credits * MICRO);
  if (!Number.isSafeInteger(near + 1) || !Number.isSafeInteger(near - 1)) return undefined;
  for (const micro of [near, near - 1, near + 1]) if (micro / MICRO === credits) return micro;
  return Math.abs(near / MICRO - credits) > 4 * Number.EPSILON * Math.abs(credits) ? undefined : near;
}
