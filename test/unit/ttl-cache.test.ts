/** The configuration cache of the hot path: shared loads, expiry, failures not kept, bounded size. */
import { describe, expect, it } from 'vitest';
import { TtlCache } from '../../server/lib/ttl-cache.ts';

function clock() {
  let now = 1_000;
  return { now: () => now, advance: (ms: number) => void (now += ms) };
}

describe('TtlCache', () => {
  it('shares one load between concurrent misses and reuses it until it expires', async () => {
    const c = clock();
    const cache = new TtlCache<number>(100, 10, c.now);
    let loads = 0;
    const load = async () => ++loads;
    expect(await Promise.all([cache.get('k', load), cache.get('k', load)])).toEqual([1, 1]);
    c.advance(99);
    expect(await cache.get('k', load)).toBe(1);
    c.advance(1);
    expect(await cache.get('k', load)).toBe(2);
    cache.clear();
    expect(await cache.get('k', load)).toBe(3);
  });

  it('does not keep a failed load, and reads every time with a TTL of 0', async () => {
    const cache = new TtlCache<number>(1_000);
    await expect(cache.get('k', () => Promise.reject(new Error('database down')))).rejects.toThrow('database down');
    expect(await cache.get('k', async () => 7)).toBe(7);
    let loads = 0;
    const off = new TtlCache<number>(0);
    await off.get('k', async () => ++loads);
    await off.get('k', async () => ++loads);
    expect(loads).toBe(2);
  });

  it('makes room by dropping the oldest entry', async () => {
    const cache = new TtlCache<string>(1_000, 2);
    let loads = 0;
    const load = (v: string) => async () => (loads++, v);
    await cache.get('a', load('a'));
    await cache.get('b', load('b'));
    await cache.get('c', load('c'));
    expect(loads).toBe(3);
    await cache.get('b', load('b'));
    await cache.get('c', load('c'));
    expect(loads).toBe(3);
    await cache.get('a', load('a'));
    expect(loads).toBe(4);
  });
});
