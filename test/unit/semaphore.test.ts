import { describe, expect, it } from 'vitest';
import { Semaphore } from '../../server/lib/semaphore.ts';

describe('Semaphore', () => {
  it('grants weighted units up to the limit, first in first served', async () => {
    const s = new Semaphore(10);
    const a = await s.acquire(undefined, 6);
    const order: string[] = [];
    const b = s.acquire(undefined, 6).then((r) => (order.push('b'), r));
    // c would fit now, but b waits ahead of it.
    const c = s.acquire(undefined, 2).then((r) => (order.push('c'), r));
    await new Promise((r) => setImmediate(r));
    expect([s.inUse, order]).toEqual([6, []]);
    a();
    const releaseB = await b;
    await c;
    expect([s.inUse, order]).toEqual([8, ['b', 'c']]);
    releaseB();
    releaseB(); // twice is harmless
    expect(s.inUse).toBe(2);
  });

  it('caps a weight above the limit and leaves the queue on abort', async () => {
    const s = new Semaphore(4);
    const big = await s.acquire(undefined, 100);
    expect(s.inUse).toBe(4);
    const abort = new AbortController();
    const waiting = s.acquire(abort.signal, 1);
    const next = s.acquire(undefined, 1);
    abort.abort(new Error('gone'));
    await expect(waiting).rejects.toThrow('gone');
    big();
    (await next)();
    expect(s.inUse).toBe(0);
  });

  it('takes units at once or not at all (tryAcquire), never ahead of a waiter', async () => {
    const s = new Semaphore(2);
    const a = s.tryAcquire()!;
    const b = s.tryAcquire()!;
    expect(s.tryAcquire()).toBeUndefined();
    const waiting = s.acquire();
    a();
    // The freed unit went to the waiter, which came first.
    const c = await waiting;
    expect(s.tryAcquire()).toBeUndefined();
    b();
    c();
    expect(s.inUse).toBe(0);
    const d = s.tryAcquire(2)!;
    expect(s.inUse).toBe(2);
    d();
    d();
    expect(s.inUse).toBe(0);
  });
});
