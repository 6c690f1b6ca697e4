/**
 * The media sweeper when the store fails as a whole or refuses everything, and stopping it: a store
 * that is down ends the expired phase at its first failure (not a call per expired file); refused
 * deletes are bounded per run and the walk goes on past them at the next; no row is locked while the
 * store is called; stop() ends a run at once, even inside a store call that never answers, and a
 * stopping process stops its engines without waiting for a sweep; an S3 call that never answers
 * times out.
 */
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { MediaSweeper } from '../../server/services/media/media-sweeper.ts';
import { SweeperRepository } from '../../server/repositories/sweeper.repository.ts';
import { createTransactor } from '../../server/db/transaction.ts';
import { StorageUnavailable, type MediaStore } from '../../server/storage/media-store.ts';
import { S3MediaStore } from '../../server/storage/s3-media-store.ts';
import { createWorkers } from '../../server/workers/index.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

let server: TestServer;
let accountId: string;
beforeAll(async () => {
  server = await startTestServer({ workers: false });
  await seedCatalog(server.db);
  accountId = (await createCustomer(server.db, { balance: 100 })).accountId;
});
afterAll(async () => server?.close());
beforeEach(async () => {
  await server.db.deleteFrom('files').execute();
  await server.db.deleteFrom('sweepers').execute();
});

/** `n` expired uploads (no bytes stored), `file_zz<0…n>`, expiring 1 ms apart from `prefix`'s start. */
async function seedExpired(n: number, prefix = 'zz', ageMs = 86_400_000) {
  await sql`insert into files (id, account_id, purpose, content_type, bytes, storage_key, width, height, expires_at)
    select 'file_' || ${prefix} || lpad(g::text, 18, '0'), ${accountId}, 'upload', 'image/png', 1, 'upload/' || ${prefix} || '/file_' || ${prefix} || lpad(g::text, 18, '0'), 1, 1,
      now() - ${ageMs} * interval '1 millisecond' + g * interval '1 ms'
    from generate_series(1, ${n}) g`.execute(server.db);
}

const sweeperWith = (store: Partial<MediaStore>) =>
  new MediaSweeper({
    files: server.ctx.repositories.files,
    sweepers: new SweeperRepository(server.db),
    store: Object.assign(Object.create(server.ctx.mediaStore) as MediaStore, { list: async () => [], ...store }),
    tx: createTransactor(server.db, server.ctx.log),
    log: server.ctx.log,
  });

const storeError = (key: string, code: string, message: string) => new StorageUnavailable(key, Object.assign(new Error(`${code}: ${message}`), { code, syscall: 's3' }));
const fileCount = async () => Number((await server.db.selectFrom('files').select((eb) => eb.fn.countAll().as('n')).executeTakeFirstOrThrow()).n);

describe('the expired phase against a failing store', () => {
  it('a store that is down ends the phase at its first failure, logged once; the files wait, unchanged, for the next run', async () => {
    await seedExpired(300);
    const before = await server.db.selectFrom('files').select(['id', 'expiresAt']).orderBy('id').execute();
    let deletes = 0;
    const down = sweeperWith({
      delete: async (key: string) => {
        deletes++;
        await new Promise((r) => setTimeout(r, 100));
        throw storeError(key, 'ECONNREFUSED', 'connect ECONNREFUSED 127.0.0.1:9000');
      },
    });
    const logged = server.logs.length;
    const started = Date.now();
    expect(await down.run()).toEqual({ pending: 0, expired: 0, unlanded: 0, orphans: 0 });
    expect(deletes).toBe(1);
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(await server.db.selectFrom('files').select(['id', 'expiresAt']).orderBy('id').execute()).toEqual(before);
    const failures = server.logs.slice(logged).filter((l) => l.includes('media sweep phase failed'));
    expect(failures).toHaveLength(1);
    expect(failures[0]).toContain('"phase":"expired"');
    expect(failures[0]).toContain('"code":"ECONNREFUSED"');

    // Back up: the next run removes them all, the first one too.
    expect(await sweeperWith({}).run()).toMatchObject({ expired: 300 });
    expect(await fileCount()).toBe(0);
  });

  it('a timeout or a 5xx is the store as a whole too; EACCES, EPERM and AccessDenied are refusals of one object', async () => {
    await seedExpired(10);
    for (const code of ['TimeoutError', 'InternalError', 'EIO', 'NoSuchBucket']) {
      let deletes = 0;
      await sweeperWith({ delete: async (key: string) => { deletes++; throw storeError(key, code, 'failed'); } }).sweepExpired().catch(() => undefined);
      expect([code, deletes]).toEqual([code, 1]);
    }
    for (const code of ['EACCES', 'EPERM', 'AccessDenied']) {
      let deletes = 0;
      expect(await sweeperWith({ delete: async (key: string) => { deletes++; throw storeError(key, code, 'refused'); } }).sweepExpired()).toBe(0);
      expect([code, deletes]).toEqual([code, 10]);
    }
    expect(await fileCount()).toBe(10);
  });

  it('refusing every delete costs at most 1,000 calls a run, and the walk goes on past them at the next run to the files it can delete', async () => {
    // 1,200 files it refuses (a bucket policy on their keys), expired first; 5 it can delete after them.
    await seedExpired(1200, 'lk', 2 * 86_400_000);
    await seedExpired(5, 'ok');
    const tried: string[][] = [];
    const refusing = sweeperWith({
      delete: async (key: string) => {
        tried.at(-1)!.push(key);
        if (key.startsWith('upload/lk/')) throw storeError(key, 'AccessDenied', 'Access Denied (HTTP 403)');
      },
    });
    const run = async () => {
      tried.push([]);
      const started = Date.now();
      const report = (await refusing.run())!;
      return { report, ms: Date.now() - started };
    };
    const first = await run();
    expect(first.report.expired).toBe(0);
    expect(tried[0]).toHaveLength(1000);
    expect(first.ms).toBeLessThan(10_000);
    const second = await run();
    expect(second.report.expired).toBe(5);
    expect(tried[1]).toHaveLength(205);
    expect(new Set([...tried[0]!, ...tried[1]!]).size).toBe(1205);
    // The walk ended: the next starts over, from the oldest refused file.
    await run();
    expect(tried[2]![0]).toBe('upload/lk/file_lk000000000000000001');
    expect(await fileCount()).toBe(1200);
  });
});

describe('no row locks while the store is called', () => {
  it("a file's row is free while its bytes are deleted, and two sweepers on the same files delete each row once", async () => {
    await seedExpired(150);
    const lockedOut: string[] = [];
    const probing = (ms: number) =>
      sweeperWith({
        delete: async (key: string) => {
          // Another transaction takes the row's lock, waiting out a statement of the other sweeper
          // but not a sweep that holds it through its store calls (this one's own, in a transaction).
          await server.db
            .transaction()
            .execute(async (trx) => {
              await sql`set local lock_timeout = '200ms'`.execute(trx);
              await sql`select id from files where storage_key = ${key} for update`.execute(trx);
            })
            .catch((err: { code?: string }) => lockedOut.push(`${key}: ${err.code}`));
          await new Promise((r) => setTimeout(r, ms));
        },
      });
    const [a, b] = await Promise.all([probing(2).sweepExpired(), probing(3).sweepExpired()]);
    expect(lockedOut).toEqual([]);
    expect(a + b).toBe(150);
    expect(await fileCount()).toBe(0);
  });
});

describe('stopping', () => {
  it('stop() during a store call that never answers ends the run at once; the file keeps its row and the lease is released', async () => {
    await seedExpired(3);
    let calls = 0;
    const hung = sweeperWith({ delete: () => { calls++; return new Promise<void>(() => undefined); } });
    const running = hung.run();
    await until(() => calls > 0, 5_000, 'the first delete');
    const started = Date.now();
    hung.stop();
    await running;
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(calls).toBe(1);
    expect(await fileCount()).toBe(3);
    expect(await server.db.selectFrom('sweepers').select(['owner', 'leaseUntil']).where('name', '=', 'media').executeTakeFirstOrThrow()).toEqual({ owner: null, leaseUntil: null });
    // A later run starts afresh.
    expect(await sweeperWith({}).run()).toMatchObject({ expired: 3 });
  });

  it("a stopping process's workers end a media sweep stuck in a store call", async () => {
    await seedExpired(3);
    let calls = 0;
    const mediaSweeper = sweeperWith({ delete: () => { calls++; return new Promise<void>(() => undefined); } });
    const workers = createWorkers({ ...server.ctx, mediaSweeper });
    workers.start();
    await until(() => calls > 0, 5_000, 'the sweep in its first delete');
    const started = Date.now();
    await workers.stop();
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it('a stopping process stops its engines claiming before it waits for a sweep run in flight', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    let endSweep!: () => void;
    const sweepRunning = new Promise<undefined>((resolve) => (endSweep = () => resolve(undefined)));
    // A run that takes its time to end (a statement, a store call the SDK is still retrying).
    const mediaSweeper = { run: () => sweepRunning, stop: () => undefined } as unknown as MediaSweeper;
    const workers = createWorkers({ ...server.ctx, mediaSweeper });
    workers.start();
    const stopped = workers.stop();
    const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ client_request_id: 'stop-order-1', prompt: 'a lighthouse', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' }),
    });
    expect(res.status).toBe(202);
    const id = ((await res.json()) as { id: string }).id;
    // Several periodic claims (TASK_POLL_MS 50) while the sweep is still running.
    await new Promise((r) => setTimeout(r, 500));
    expect(await server.db.selectFrom('videoTasks').select(['status', 'attempt', 'leaseOwner']).where('id', '=', id).executeTakeFirstOrThrow()).toEqual({ status: 'queued', attempt: 0, leaseOwner: null });
    endSweep();
    await stopped;
  });
});

describe('S3 calls that never answer', () => {
  let hung: Server;
  const sockets = new Set<Socket>();
  beforeAll(async () => {
    // Accepts connections and never answers (a wedged proxy, a store that hangs).
    hung = createServer((socket) => {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
    });
    await new Promise<void>((resolve) => hung.listen(0, '127.0.0.1', resolve));
  });
  afterAll(async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise<void>((resolve) => hung.close(() => resolve()));
  });

  it('time out (each attempt) and end the sweep phase as the store failing', async () => {
    const store = new S3MediaStore({
      bucket: 'media',
      region: 'us-east-1',
      endpoint: `http://127.0.0.1:${(hung.address() as AddressInfo).port}`,
      forcePathStyle: true,
      credentials: { accessKeyId: 'test', secretAccessKey: 'test' },
      timeouts: { connectMs: 1_000, requestMs: 300 },
    });
    try {
      const started = Date.now();
      const err = await store.delete('upload/zz/file_zzHung').catch((e: unknown) => e);
      expect(err).toBeInstanceOf(StorageUnavailable);
      expect((err as StorageUnavailable).code).toBe('TimeoutError');
      expect(Date.now() - started).toBeLessThan(10_000);

      await seedExpired(5);
      const sweeper = new MediaSweeper({ files: server.ctx.repositories.files, sweepers: new SweeperRepository(server.db), store, tx: createTransactor(server.db, server.ctx.log), log: server.ctx.log });
      await expect(sweeper.sweepExpired()).rejects.toBeInstanceOf(StorageUnavailable);
      expect(await fileCount()).toBe(5);
    } finally {
      store.close();
    }
  }, 30_000);
});
