/**
 * The server survives a PostgreSQL crash (issue 26, item 6): the postmaster is killed with SIGKILL
 * while creations, image generations and polls are in flight. The server keeps running, every
 * request in flight ends with its answer or a retryable `503 database_unavailable` (never a 500,
 * never a dead process), `/readyz` says not ready while the database is away, and once PostgreSQL
 * is back everything works again without a restart: the engines and the cluster listener
 * reconnect, every video task completes exactly once, and an image is charged exactly when its
 * answer was sent.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DB } from '../../generated/db.d.ts';
import { createDatabase } from '../../server/db/database.ts';
import { findFreePort, startEmbeddedPostgres } from '../../server/db/embedded.ts';
import { migrateToLatest } from '../../server/db/migrate.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { spawnServer, type ServerProcess } from '../support/server-process.ts';
import { until, waitVideoTasksFinished } from '../support/tasks.ts';

const quiet = { info: () => undefined, warn: () => undefined };
const dataDir = mkdtempSync(join(tmpdir(), 'mediagate-pg-restart-'));
const pgRoot = mkdtempSync(join(tmpdir(), 'mediagate-pg-restart-root-'));
let port: number;
let postgres: Awaited<ReturnType<typeof startEmbeddedPostgres>> | undefined;
let db: Kysely<DB>;
let server: ServerProcess | undefined;

/** Starts (or restarts, after a crash) the cluster on the same port; retried while the dead postmaster's backends still hold its shared memory. */
async function startPostgres(): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      postgres = await startEmbeddedPostgres({ dataDir, log: quiet, rootDir: pgRoot, pickPort: async () => port });
      return;
    } catch (err) {
      if (attempt >= 20) throw err;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

function killPostmaster(): void {
  const pid = Number(readFileSync(join(postgres!.clusterDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
  process.kill(pid, 'SIGKILL');
}

beforeAll(async () => {
  port = await findFreePort();
  await startPostgres();
  db = createDatabase(postgres!.url, { max: 4, applicationName: 'mediagate-test' });
  await migrateToLatest(db);
  await seedCatalog(db);
}, 90_000);

afterAll(async () => {
  await server?.kill('SIGKILL');
  await db?.destroy().catch(() => undefined);
  await postgres?.stop().catch(() => undefined);
  if (postgres) rmSync(postgres.clusterDir, { recursive: true, force: true });
  rmSync(dataDir, { recursive: true, force: true });
  rmSync(pgRoot, { recursive: true, force: true });
});

interface Outcome {
  kind: 'video' | 'image' | 'poll';
  status: number;
  code?: string;
  retryAfter?: string | null;
}

describe('a PostgreSQL crash while requests and tasks are in flight', () => {
  it('keeps the server up, answers 503 database_unavailable meanwhile, and works again once PostgreSQL is back', async () => {
    const c = await createCustomer(db, { balance: 1000 });
    server = await spawnServer({
      env: {
        DATABASE_URL: postgres!.url,
        MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'),
        MEDIAGATE_DATA_DIR: join(dataDir, 'media'),
        DEMO_DATA: '0',
        LOG_LEVEL: 'info',
        TASK_LEASE_MS: '2000',
        TASK_POLL_MS: '200',
        LOCAL_RENDER_DELAY_MS: '1500',
      },
    });
    const auth = { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' };
    const outcomes: Outcome[] = [];
    const videoIds: string[] = [];
    let imagesAnswered = 0;
    let imagesInFlight = 0;

    const record = async (kind: Outcome['kind'], res: Response) => {
      const outcome: Outcome = { kind, status: res.status, retryAfter: res.headers.get('retry-after') };
      let body: { id?: string; data?: unknown[]; error?: { code?: string } } = {};
      try {
        body = JSON.parse(await res.text()) as typeof body;
      } catch {
        // An image answer is written while its charge commits and its last byte waits for the commit:
        // when the database goes away in between, the client gets a truncated answer, never charged.
        outcome.code = 'truncated';
      }
      if (body.error) outcome.code = body.error.code;
      if (kind === 'video' && res.status === 202 && body.id) videoIds.push(body.id);
      if (kind === 'image' && res.status === 200 && Array.isArray(body.data)) imagesAnswered++;
      outcomes.push(outcome);
    };
    let running = true;
    const video = async (i: number) =>
      record(
        'video',
        await fetch(`${server!.url}/v1/videos/generations`, {
          method: 'POST',
          headers: auth,
          body: JSON.stringify({ client_request_id: `restart-${i}-${randomBytes(4).toString('hex')}`, prompt: `clip ${i}`, model: 'local-video-lite', seconds: 2, aspectRatio: '16:9', resolution: '360p' }),
        }),
      );
    const image = async () => {
      imagesInFlight++;
      try {
        await record('image', await fetch(`${server!.url}/v1/images/generations`, { method: 'POST', headers: auth, body: JSON.stringify({ model: 'local-image-1', prompt: 'a lighthouse', n: 2 }) }));
      } finally {
        imagesInFlight--;
      }
    };
    const poll = async () => {
      const id = videoIds[Math.floor(Math.random() * videoIds.length)];
      if (id) await record('poll', await fetch(`${server!.url}/v1/videos/${id}`, { headers: auth }));
    };
    // Three clients that keep going through the whole outage.
    let n = 0;
    const loops = [video, image, poll].map(async (step) => {
      while (running) {
        await step(n++).catch((err: unknown) => outcomes.push({ kind: 'poll', status: 0, code: String(err) }));
        await new Promise((r) => setTimeout(r, 20));
      }
    });

    await until(() => videoIds.length >= 4 && imagesAnswered >= 2 && imagesInFlight > 0, 20_000, 'work in flight');
    killPostmaster();
    await until(async () => (await fetch(`${server!.url}/readyz`)).status === 503, 10_000, '/readyz to say not ready');
    // Requests keep arriving while the database is away.
    await new Promise((r) => setTimeout(r, 2000));
    expect(server.child.exitCode).toBeNull();

    await startPostgres();
    await until(async () => (await fetch(`${server!.url}/readyz`)).status === 200, 30_000, '/readyz to be ready again');
    const [videosBefore, imagesBefore] = [videoIds.length, imagesAnswered];
    await until(() => videoIds.length >= videosBefore + 3 && imagesAnswered >= imagesBefore + 2, 30_000, 'new creations and images after the restart');
    running = false;
    await Promise.all(loops);

    // Never a 500 or a dropped connection: an answer, or a retryable 503 that says the database is
    // away — or, for an image whose settlement met the outage, an answer cut before its last byte.
    const truncated = outcomes.filter((o) => o.code === 'truncated');
    for (const t of truncated) expect(t).toMatchObject({ kind: 'image', status: 200 });
    const failures = outcomes.filter((o) => ![200, 202].includes(o.status));
    for (const kind of ['video', 'image', 'poll']) expect(failures.filter((f) => f.kind === kind).length).toBeGreaterThan(0);
    for (const f of failures) {
      expect(f).toMatchObject({ status: 503, code: 'database_unavailable' });
      expect(Number(f.retryAfter)).toBeGreaterThan(0);
    }
    expect(server.child.exitCode).toBeNull();

    // Every video task accepted before, during or after the outage completes exactly once.
    const rows = await waitVideoTasksFinished(db, videoIds, 90_000);
    expect(rows.filter((r) => r.status !== 'completed')).toEqual([]);
    for (const id of videoIds) {
      const entries = await db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', id).orderBy('id').execute();
      expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
    }
    // Images: charged exactly for the answers that were sent; every other hold is released once the
    // lease of its request runs out.
    const settled = await until(
      async () => {
        const open = await db.selectFrom('creditHolds').select('taskId').where('accountId', '=', c.accountId).where('status', '=', 'held').execute();
        return open.length === 0;
      },
      30_000,
      'every hold to be settled',
    );
    expect(settled).toBe(true);
    const captured = await db
      .selectFrom('imageTasks')
      .select(({ fn }) => fn.countAll<number>().as('n'))
      .where('accountId', '=', c.accountId)
      .where('status', '=', 'completed')
      .executeTakeFirstOrThrow();
    expect(Number(captured.n)).toBe(imagesAnswered);
    const log = server.stdout();
    expect(log).not.toMatch(/Unhandled 'error' event/);
    await server.kill('SIGTERM');
  }, 180_000);
});
