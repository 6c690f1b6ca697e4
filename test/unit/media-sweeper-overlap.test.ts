/**
 * The media sweeper's runs, with strict fakes of its repositories and store: one run per process at
 * a time. The workers fire run() every minute whether or not the last one has ended, and the lease
 * is renewed for its own owner, so a run longer than a minute (an expired backlog on a slow store)
 * got a twin walking from the same cursor, and the first to end released the lease under the other.
 * A call meanwhile now joins the run in progress. And a run's check of image outputs whose bytes
 * never landed goes on batch after batch until it has caught up (or for a minute): one batch of 200
 * a run fell behind a gateway writing more than 200 images a minute.
 */
import { describe, expect, it, vi } from 'vitest';
import type { Transactor } from '../../server/db/transaction.ts';
import { createLogger } from '../../server/logger.ts';
import type { FileRepository } from '../../server/repositories/file.repository.ts';
import type { SweeperRepository } from '../../server/repositories/sweeper.repository.ts';
import { MediaSweeper } from '../../server/services/media/media-sweeper.ts';
import type { MediaStore, StoredObject } from '../../server/storage/media-store.ts';

/** A sweeper over an empty files table and a store of `objects`, whose listing waits for `listGate`. */
function sweeperOf(objects: StoredObject[], listGate: Promise<void>) {
  const calls: string[] = [];
  const sweepers = {
    // As the real one: granted again to the owner that holds it.
    take: async () => (calls.push('take'), { cursor: null }),
    save: async (_name: string, _owner: string, _cursor: string | null, release: boolean) => void calls.push(release ? 'release' : 'save'),
  } as unknown as SweeperRepository;
  const files = {
    duePendingDeletes: async () => (calls.push('pending'), []),
    forgetPendingDeletes: async () => undefined,
    deferPendingDeletes: async () => undefined,
    expiredAfter: async () => (calls.push('expired'), []),
    deleteExpired: async () => 0,
    recentOutputs: async () => (calls.push('unlanded'), []),
    deleteRows: async () => 0,
    keysWithRows: async () => new Set<string>(),
  } as unknown as FileRepository;
  const store = {
    list: async () => {
      calls.push('list');
      await listGate;
      return objects;
    },
    delete: async (key: string) => void calls.push(`delete ${key}`),
  } as unknown as MediaStore;
  const tx = { run: (fn: (trx: never) => Promise<unknown>) => fn(undefined as never), single: undefined } as unknown as Transactor;
  const sweeper = new MediaSweeper({ files, sweepers, store, tx, log: createLogger('silent'), now: () => Date.now() + 2 * 60 * 60_000 });
  return { sweeper, calls };
}

describe('the media sweeper', () => {
  it('joins the run in progress rather than starting a second one beside it, and runs afresh once it has ended', async () => {
    let open!: () => void;
    const orphan = { key: 'upload/ab/file_abOrphan', bytes: 3, modifiedAt: new Date() };
    const { sweeper, calls } = sweeperOf([orphan], new Promise<void>((resolve) => (open = resolve)));
    const first = sweeper.run();
    // The first run is in its orphan phase, waiting for the store's listing.
    while (!calls.includes('list')) await new Promise((resolve) => setTimeout(resolve, 5));
    const second = sweeper.run();
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(calls).toEqual(['take', 'pending', 'expired', 'unlanded', 'list']);
    open();
    const reports = await Promise.all([first, second]);
    expect(reports).toEqual([
      { pending: 0, expired: 0, unlanded: 0, orphans: 1 },
      { pending: 0, expired: 0, unlanded: 0, orphans: 1 },
    ]);
    // One walk, one delete, the lease released once, by the run that took it.
    expect(calls).toEqual(['take', 'pending', 'expired', 'unlanded', 'list', `delete ${orphan.key}`, 'release']);
    calls.length = 0;
    expect(await sweeper.run()).toEqual({ pending: 0, expired: 0, unlanded: 0, orphans: 1 });
    expect(calls.filter((c) => c === 'take')).toHaveLength(1);
  });
});

describe("the media sweeper's check of image outputs whose bytes never landed", () => {
  /** `count` recent output rows, every 7th of whose bytes never landed; `tick` runs at each stat. */
  function sweeperOf(count: number, tick: () => void = () => undefined) {
    const rows = Array.from({ length: count }, (_, i) => ({ id: `file_ab${String(i).padStart(5, '0')}`, storageKey: `image_output/ab/file_ab${String(i).padStart(5, '0')}`, createdAt: new Date(1_000_000 + i).toISOString() }));
    const landed = (key: string) => Number(key.slice(-5)) % 7 !== 0;
    const deleted: string[] = [];
    let cursor: string | null = null;
    const sweepers = {
      take: async () => ({ cursor }),
      save: async (_name: string, _owner: string, saved: string | null) => void (cursor = saved),
    } as unknown as SweeperRepository;
    const files = {
      expiredAfter: async () => [],
      deleteExpired: async () => 0,
      recentOutputs: async (after: { createdAt: string; id: string } | undefined, _window: unknown, limit: number) =>
        rows.filter((r) => !after || r.createdAt > after.createdAt || (r.createdAt === after.createdAt && r.id > after.id)).slice(0, limit),
      deleteRows: async (ids: string[]) => void deleted.push(...ids),
      keysWithRows: async () => new Set<string>(),
    } as unknown as FileRepository;
    const store = {
      stat: async (key: string) => (tick(), landed(key) ? { key, bytes: 1, modifiedAt: new Date() } : undefined),
      list: async () => [],
      delete: async () => undefined,
    } as unknown as MediaStore;
    const tx = { run: (fn: (trx: never) => Promise<unknown>) => fn(undefined as never), single: undefined } as unknown as Transactor;
    const sweeper = new MediaSweeper({ files, sweepers, store, tx, log: createLogger('silent') });
    return { sweeper, deleted, missing: rows.filter((r) => !landed(r.storageKey)).map((r) => r.id) };
  }

  it('checks every row written since the last run in one run, batch after batch', async () => {
    const { sweeper, deleted, missing } = sweeperOf(1_150);
    expect(await sweeper.run()).toMatchObject({ unlanded: missing.length });
    expect(deleted).toEqual(missing);
  });

  it('stops after a minute of checking, and the next run goes on from there', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      // Each stat takes a second: a minute passes within the first batch of 200.
      const { sweeper, deleted, missing } = sweeperOf(450, () => vi.setSystemTime(Date.now() + 1000));
      await sweeper.run();
      expect(deleted).toEqual(missing.filter((id) => Number(id.slice(-5)) < 200));
      await sweeper.run();
      expect(deleted).toEqual(missing.filter((id) => Number(id.slice(-5)) < 400));
      await sweeper.run();
      expect(deleted).toEqual(missing);
    } finally {
      vi.useRealTimers();
    }
  });
});
