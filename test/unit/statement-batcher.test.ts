import { describe, expect, it } from 'vitest';
import { StatementBatcher } from '../../server/db/statement-batcher.ts';

/** A runner that records its calls and answers when told. */
function recorder() {
  const calls: { kind: 'one' | 'many'; items: number[]; release: () => void }[] = [];
  const wait = (kind: 'one' | 'many', items: number[]) => new Promise<void>((release) => calls.push({ kind, items, release }));
  return {
    calls,
    runner: {
      one: async (i: number) => (await wait('one', [i]), i * 10),
      many: async (items: readonly number[]) => {
        await wait('many', [...items]);
        if (items.includes(13)) throw new Error('refused');
        return items.map((i) => i * 10);
      },
    },
  };
}
/** A few turns of the event loop: enough for queued work to go out. */
const tick = async () => {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
};

describe('StatementBatcher', () => {
  it('sends one request alone, and what arrives while a statement is in flight as the next batch', async () => {
    const { calls, runner } = recorder();
    const b = new StatementBatcher(runner, { maxInFlight: 1, maxBatch: 3 });
    const first = b.run(1);
    await tick();
    expect(calls.map((c) => [c.kind, c.items])).toEqual([['one', [1]]]);
    const rest = [2, 3, 4, 5].map((i) => b.run(i));
    await tick();
    expect(calls).toHaveLength(1); // nothing more while one statement is in flight
    calls[0]!.release();
    expect(await first).toBe(10);
    await tick();
    expect(calls.map((c) => [c.kind, c.items])).toEqual([['one', [1]], ['many', [2, 3, 4]]]); // at most maxBatch
    calls[1]!.release();
    await tick();
    expect(calls[2]).toMatchObject({ kind: 'one', items: [5] });
    calls[2]!.release();
    expect(await Promise.all(rest)).toEqual([20, 30, 40, 50]);
    expect(b.stats).toEqual({ batches: 1, batched: 3, singles: 2, fallbacks: 0 });
  });

  it('runs each request of a batch that fails on its own, and passes each its own answer or error', async () => {
    const runner = {
      one: async (i: number) => {
        if (i === 13) throw new Error('thirteen');
        return i;
      },
      many: async () => {
        throw new Error('refused');
      },
    };
    const b = new StatementBatcher(runner, { maxInFlight: 2, maxBatch: 10 });
    const results = await Promise.allSettled([12, 13, 14].map((i) => b.run(i)));
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value : (r.reason as Error).message))).toEqual([12, 'thirteen', 14]);
    expect(b.stats).toEqual({ batches: 0, batched: 0, singles: 3, fallbacks: 1 });
  });

  it('runs a request sent alone at once in its own statement, while the requests around it still share one', async () => {
    const { calls, runner } = recorder();
    const b = new StatementBatcher(runner, { maxInFlight: 1, maxBatch: 10 });
    const together = [1, 2].map((i) => b.run(i));
    const alone = b.alone(13);
    expect(calls.map((c) => [c.kind, c.items])).toEqual([['one', [13]]]); // not even waiting for the turn to end
    await tick();
    expect(calls.map((c) => [c.kind, c.items])).toEqual([['one', [13]], ['many', [1, 2]]]);
    for (const c of calls) c.release();
    expect(await alone).toBe(130);
    expect(await Promise.all(together)).toEqual([10, 20]);
    expect(b.stats).toEqual({ batches: 1, batched: 2, singles: 1, fallbacks: 0 });
  });
});
