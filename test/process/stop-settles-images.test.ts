/**
 * A stop (SIGTERM, Ctrl-C) while synchronous image requests run (server/main.ts): once the grace is
 * over and their connections are cut, each request settles what it delivered — captured — and
 * releases the rest before the database pool closes. The stop used to close the pool as soon as the
 * connections were cut: a request still settling then met a destroyed pool, and its task stayed
 * `processing` with its credits held (then `needs_attention`, settled by hand), although the process
 * knew exactly what it had delivered. With the default grace, every deploy during a slow upstream
 * image did this. A run that never ends does not hold the stop: it waits a bounded time, naming its step.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { sql } from 'kysely';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../server/config.ts';
import { createLogger } from '../../server/logger.ts';
import { newLifecycle, startServer, type Lifecycle, type RunningServer } from '../../server/main.ts';
import type { ImageProvider } from '../../server/providers/types.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { holdOf, until } from '../support/tasks.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

const CREDIT = 1_000_000;
const GRACE_MS = 200;

let t: TestDatabase;
let dataDir: string;
let image: Buffer;
const servers: RunningServer[] = [];

/** What the upstream does with a call; each test sets it. */
let generate: ImageProvider['generate'];
const provider: ImageProvider = { generate: (account, job, signal, events) => generate(account, job, signal, events) };

beforeAll(async () => {
  t = await createTestDatabase();
  await seedCatalog(t.db);
  dataDir = mkdtempSync(join(tmpdir(), 'mediagate-stop-settles-'));
  image = await sharp({ create: { width: 64, height: 64, channels: 3, background: { r: 20, g: 110, b: 190 } } }).png().toBuffer();
});
afterAll(async () => {
  for (const s of servers) await s.stop().catch(() => undefined);
  await t?.destroy();
  rmSync(dataDir, { recursive: true, force: true });
});

/** A server as `npm start -- --role api` runs it (server/main.ts), its upstream `provider`; `logs` are its log lines. */
async function start(): Promise<{ server: RunningServer; lifecycle: Lifecycle; logs: string[] }> {
  const config = loadConfig(
    { DATABASE_URL: t.url, MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'), HOST: '127.0.0.1', PORT: '0', DEMO_DATA: '0', MEDIAGATE_DATA_DIR: dataDir, SHUTDOWN_GRACE_MS: String(GRACE_MS) },
    ['--role', 'api'],
  );
  const logs: string[] = [];
  const log = createLogger('info', new Writable({ write: (chunk: Buffer, _enc, done) => (logs.push(chunk.toString()), done()) }));
  const lifecycle = newLifecycle();
  const server = await startServer(config, log, lifecycle, { providers: { local: { image: provider } } });
  servers.push(server);
  return { server, lifecycle, logs };
}

/** Resolves once the signal aborts. */
const aborted = (signal: AbortSignal) => new Promise<void>((resolve) => (signal.aborted ? resolve() : signal.addEventListener('abort', () => resolve(), { once: true })));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function post(url: string, key: string, body: object) {
  return fetch(`${url}/v1/images/generations`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
}

const taskOf = (accountId: string) => t.db.selectFrom('imageTasks').select(['id', 'status', 'errorCode', 'delivered']).where('accountId', '=', accountId).executeTakeFirstOrThrow();

describe('a stop while a synchronous image request runs', () => {
  it('a stream that delivered an image: the stop waits for its settlement — that image captured, the rest released', async () => {
    const { server } = await start();
    const c = await createCustomer(t.db, { balance: 10 });
    // The first image goes out at once; the next takes a while and does not stop at once when its
    // call is aborted (a render under way, an upstream's answer to its cancel).
    generate = async (_account, _job, signal, events) => {
      await events.image(0, { image });
      await aborted(signal);
      await sleep(700);
    };
    const res = await post(server.url!, c.key, { model: 'local-image-1', prompt: 'a lighthouse', n: 3, stream: true });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    let text = '';
    while (!text.includes('event: image_generation.completed')) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`the stream ended before its first image: ${text}`);
      text += Buffer.from(value).toString();
    }
    // The client stays, reading, until the stop cuts it off.
    const reading = (async () => {
      while (!(await reader.read()).done);
    })().catch((err: unknown) => err);

    await server.stop();
    expect(await reading).toBeInstanceOf(Error);
    const task = await taskOf(c.accountId);
    expect(task).toMatchObject({ status: 'completed', delivered: 1 });
    expect(await holdOf(t.db, task.id)).toEqual({ amount: 3 * CREDIT, status: 'captured', captured: CREDIT });
  });

  it('a JSON answer whose hold was still being placed when the connections were cut: the task fails interrupted (the stop, not the client), nothing charged', async () => {
    const { server } = await start();
    const c = await createCustomer(t.db, { balance: 10 });
    generate = async () => {
      throw new Error('the upstream is never called for a client that is gone');
    };
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    // Another transaction holds the key's row: the request's hold statement waits for it.
    const locked = t.db.transaction().execute(async (trx) => {
      await sql`select 1 from api_keys where id = ${c.apiKeyId} for update`.execute(trx);
      await released;
    });
    const request = post(server.url!, c.key, { model: 'local-image-1', prompt: 'a kite', n: 2 }).catch((err: unknown) => err);
    await until(async () => {
      const { rows } = await sql<{ n: number }>`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and datname = current_database()`.execute(t.db);
      return rows[0]!.n > 0;
    }, 10_000, 'the hold statement to wait on the lock');

    const stopping = server.stop();
    // The grace ends and the connection is cut while the hold still waits; then the hold commits.
    expect(await request).toBeInstanceOf(Error);
    await sleep(300);
    release();
    await locked;
    await stopping;
    const task = await taskOf(c.accountId);
    expect(task).toMatchObject({ status: 'failed', errorCode: 'interrupted', delivered: 0 });
    const { errorMessage } = await t.db.selectFrom('imageTasks').select('errorMessage').where('id', '=', task.id).executeTakeFirstOrThrow();
    expect(errorMessage).toBe('The gateway stopped (a restart) before any image was delivered; the credits were released.');
    expect(await holdOf(t.db, task.id)).toEqual({ amount: 2 * CREDIT, status: 'released', captured: 0 });
  });

  it('a run that never ends holds the stop a bounded time, under a step that names it, and the stop then ends', async () => {
    const { server, lifecycle, logs } = await start();
    const c = await createCustomer(t.db, { balance: 10 });
    let unblock!: () => void;
    const unblocked = new Promise<void>((resolve) => (unblock = resolve));
    generate = async () => {
      await unblocked;
      throw new Error('stopped');
    };
    const request = post(server.url!, c.key, { model: 'local-image-1', prompt: 'a kite', n: 1 }).catch((err: unknown) => err);
    await until(async () => (await taskOf(c.accountId).catch(() => undefined))?.status === 'processing', 10_000, 'the task to run');
    const begun = Date.now();
    let stopped = false;
    const stopping = server.stop().then(() => (stopped = true));
    await until(() => lifecycle.step === 'settling the image requests the drain cut, and stopping the task workers', 5_000, 'the settling step');
    expect(await request).toBeInstanceOf(Error);
    await stopping;
    const took = Date.now() - begun;
    unblock();
    expect(stopped).toBe(true);
    expect(took).toBeGreaterThanOrEqual(GRACE_MS + 2_900);
    // Before the forced exit of a stop still running (SHUTDOWN_GRACE_MS + 5 s).
    expect(took).toBeLessThan(GRACE_MS + 5_000);
    const line = logs.find((l) => l.includes('did not settle'));
    expect(line && JSON.parse(line)).toMatchObject({ level: 50, unsettled: 1 });
  });
});
