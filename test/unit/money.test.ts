// Credits as the API takes them (decimal, at most 6 fractional digits) to integer micro-credits.
import { describe, expect, it } from 'vitest';
import { fromCredits, MICRO, toCredits } from '../../server/lib/money.ts';

/** The decimal text a client would send for `micro` micro-credits (what JSON.parse reads). */
function decimalOf(micro: bigint): string {
  const sign = micro < 0n ? '-' : '';
  const abs = micro < 0n ? -micro : micro;
  return `${sign}${abs / 1_000_000n}.${String(abs % 1_000_000n).padStart(6, '0')}`;
}

describe('fromCredits', () => {
  it('takes every decimal of at most 6 fractional digits back to its exact micro-credits, small or large', () => {
    let seed = 42;
    const next = () => (seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31);
    for (let i = 0; i < 20_000; i++) {
      // Magnitudes from 1e-6 to about 1e9 credits (1e15 micro-credits).
      const digits = 1 + (next() % 15);
      const micro = BigInt(next()) * BigInt(next()) % 10n ** BigInt(digits);
      const text = decimalOf(i % 2 ? micro : -micro);
      const credits = JSON.parse(text) as number;
      expect([text, fromCredits(credits)]).toEqual([text, Number(i % 2 ? micro : -micro)]);
      expect(toCredits(fromCredits(credits)!)).toBe(credits);
    }
  });

  it('is exact from 2^32 credits up too, where credits × 1e6 rounds to a neighbour (4294967296.299974 became …975)', () => {
    expect(fromCredits(4294967296.299974)).toBe(4_294_967_296_299_974);
    let seed = 7;
    const next = () => (seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31);
    // Up to 2^33 credits every 6-digit decimal is its own double (above, neighbours share one).
    for (let i = 0; i < 20_000; i++) {
      const micro = 2n ** 32n * 1_000_000n + ((BigInt(next()) * BigInt(next())) % (2n ** 32n * 1_000_000n));
      const text = decimalOf(micro);
      expect([text, fromCredits(JSON.parse(text) as number)]).toEqual([text, Number(micro)]);
    }
  });

  it('refuses a 7th fractional digit at any size (it once passed above about 1 credit: 1000.0000004 became 1000)', () => {
    for (const text of ['1.0000004', '1000.0000004', '123456.1234567', '0.0000001', '-5000.0000005', '99999999.0000001']) {
      expect([text, fromCredits(JSON.parse(text) as number)]).toEqual([text, undefined]);
    }
    expect(fromCredits(1000)).toBe(1000 * MICRO);
  });

  it('lets a client\'s floating-point noise through (0.1 + 0.2 is 0.3)', () => {
    expect(fromCredits(0.1 + 0.2)).toBe(300_000);
    expect(fromCredits(1.1 * 3)).toBe(3_300_000);
  });

  it('refuses what is not a finite amount in range', () => {
    for (const v of [Number.NaN, Number.POSITIVE_INFINITY, 1e12]) expect(fromCredits(v)).toBeUndefined();
  });
});
