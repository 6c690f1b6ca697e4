/**
 * Tasks survive crashes and run on many instances (design §6): real server processes on one
 * database, SIGKILL in the middle of work, restart, and every task completes exactly once with
 * exactly one capture.
 */
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { until, waitVideoTasksFinished } from '../support/tasks.ts';
import { spawnServer, type ServerProcess, SERVER_ENTRY } from '../support/server-process.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';

let t: TestDatabase;
const secret = randomBytes(32).toString('hex');
const running: ServerProcess[] = [];

beforeAll(async () => {
  t = await createTestDatabase();
  await seedCatalog(t.db);
});
afterAll(async () => {
  await Promise.all(running.map((p) => p.kill('SIGKILL')));
  await t?.destroy();
});

async function start(extra: Record<string, string> = {}, args: string[] = []): Promise<ServerProcess> {
  const p = await spawnServer({
    command: [process.execPath, SERVER_ENTRY, ...args],
    workerOnly: args.includes('worker'),
    env: {
      DATABASE_URL: t.url,
      MEDIAGATE_SECRET_KEY: secret,
      MEDIAGATE_DATA_DIR: `/tmp/mediagate-persistence-${process.pid}`,
      DEMO_DATA: '0',
      TASK_LEASE_MS: '1500',
      TASK_POLL_MS: '100',
      WORKER_CONCURRENCY: '4',
      ...extra,
    },
  });
  running.push(p);
  return p;
}

async function createTasks(url: string, key: string, n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const res = await fetch(`${url}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ client_request_id: `p-${randomBytes(6).toString('hex')}`, prompt: `clip ${i}`, model: 'local-video-lite', seconds: 2, aspectRatio: '16:9', resolution: '360p' }),
    });
    expect(res.status).toBe(202);
    ids.push(((await res.json()) as { id: string }).id);
  }
  return ids;
}

async function expectExactlyOnce(ids: string[], accountId: string, price: number) {
  for (const id of ids) {
    const entries = await t.db.selectFrom('ledgerEntries').select(['kind', 'amount']).where('taskId', '=', id).orderBy('id').execute();
    expect(entries).toEqual([
      { kind: 'hold', amount: price },
      { kind: 'capture', amount: price },
    ]);
    const outputs = await t.db.selectFrom('files').select('id').where('taskId', '=', id).where('purpose', '=', 'video_output').execute();
    expect(outputs).toHaveLength(1);
  }
  const account = await t.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', accountId).executeTakeFirstOrThrow();
  expect(account.totalSpent).toBe(price * ids.length);
  expect(account.balance).toBe(100_000_000 - price * ids.length);
}

/** The cluster listeners' sessions on the test database (every instance has one). */
async function listeners() {
  const { rows } = await sql<{ pid: number; state: string; query: string }>`
    select pid, state, query from pg_stat_activity where datname = current_database() and application_name = 'mediagate-listener'`.execute(t.db);
  return rows;
}

/** A worker session's claim of due video tasks (`claimDue`, leased-tasks.ts), by its text. */
const VIDEO_CLAIM = '%update "video_tasks" t%set attempt = t.attempt + 1%';

/** When the worker's video claim that waits for a lock started (full precision), if one waits. */
async function waitingVideoClaim(): Promise<string | undefined> {
  const { rows } = await sql<{ started: string }>`
    select query_start::text as started from pg_stat_activity
    where datname = current_database() and application_name = 'mediagate-worker' and wait_event_type = 'Lock' and query ilike ${VIDEO_CLAIM}`.execute(t.db);
  return rows[0]?.started;
}

/** Whether a video claim of the worker is running now (its session active in one). */
async function videoClaimRunning(): Promise<boolean> {
  const { rows } = await sql`
    select 1 from pg_stat_activity
    where datname = current_database() and application_name = 'mediagate-worker' and state <> 'idle' and query ilike ${VIDEO_CLAIM}`.execute(t.db);
  return rows.length > 0;
}

describe('a server process killed with SIGKILL while tasks run', () => {
  it('is restarted, and every task completes exactly once with exactly one capture', async () => {
    const c = await createCustomer(t.db, { balance: 100 });
    // Slow renders so that the kill lands while work is in flight.
    const first = await start({ LOCAL_RENDER_DELAY_MS: '1500' });
    const ids = await createTasks(first.url, c.key, 6);
    const deadline = Date.now() + 15_000;
    for (;;) {
      const inFlight = await t.db.selectFrom('videoTasks').select('id').where('id', 'in', ids).where('status', '=', 'in_progress').execute();
      if (inFlight.length > 0) break;
      if (Date.now() > deadline) throw new Error('no task started');
      await new Promise((r) => setTimeout(r, 50));
    }
    const killed = await first.kill('SIGKILL');
    expect(killed.signal).toBe('SIGKILL');
    const unfinished = await t.db.selectFrom('videoTasks').select('id').where('id', 'in', ids).where('status', '!=', 'completed').execute();
    expect(unfinished.length).toBeGreaterThan(0);

    const second = await start({ LOCAL_RENDER_DELAY_MS: '0' });
    const rows = await waitVideoTasksFinished(t.db, ids, 60_000);
    expect(rows.every((r) => r.status === 'completed')).toBe(true);
    // At least one task was resumed by a later attempt after its lease expired.
    expect(Math.max(...rows.map((r) => r.attempt))).toBeGreaterThan(1);
    await expectExactlyOnce(ids, c.accountId, 40_000);
    await second.kill('SIGTERM');
  }, 120_000);
});

describe('two server processes on one database', () => {
  it('a task created on one is read on the other, and each task is processed exactly once', async () => {
    const c = await createCustomer(t.db, { balance: 100 });
    // A longer lease: nothing dies here, so no task should change hands.
    const [a, b] = await Promise.all([start({ TASK_LEASE_MS: '10000' }), start({ TASK_LEASE_MS: '10000' })]);
    const ids = await createTasks(a.url, c.key, 8);
    const onB = await fetch(`${b.url}/v1/videos/${ids[0]}`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(onB.status).toBe(200);
    expect(((await onB.json()) as { id: string }).id).toBe(ids[0]);
    const rows = await waitVideoTasksFinished(t.db, ids, 60_000);
    expect(rows.every((r) => r.status === 'completed')).toBe(true);
    await expectExactlyOnce(ids, c.accountId, 40_000);
    // Both instances read the same finished task.
    const [fromA, fromB] = await Promise.all(
      [a, b].map(async (p) => (await (await fetch(`${p.url}/v1/videos/${ids[7]}`, { headers: { Authorization: `Bearer ${c.key}` } })).json()) as { status: string; billing: unknown }),
    );
    expect(fromA!.status).toBe('completed');
    expect(fromB!.billing).toEqual(fromA!.billing);
    await Promise.all([a.kill('SIGTERM'), b.kill('SIGTERM')]);
  }, 120_000);
});

describe('--role api and --role worker', () => {
  it('split the API and the task workers between processes', async () => {
    const c = await createCustomer(t.db, { balance: 100 });
    const api = await start({}, ['--role', 'api']);
    const ids = await createTasks(api.url, c.key, 3);
    // The API process runs no workers: the tasks stay queued.
    await new Promise((r) => setTimeout(r, 1000));
    const queued = await t.db.selectFrom('videoTasks').select('status').where('id', 'in', ids).execute();
    expect(queued.map((r) => r.status)).toEqual(['queued', 'queued', 'queued']);
    const worker = await start({ PUBLIC_BASE_URL: api.url }, ['--role', 'worker']);
    const rows = await waitVideoTasksFinished(t.db, ids, 60_000);
    expect(rows.every((r) => r.status === 'completed')).toBe(true);
    await expectExactlyOnce(ids, c.accountId, 40_000);
    await Promise.all([api.kill('SIGTERM'), worker.kill('SIGTERM')]);
  }, 120_000);

  it('a worker on another process starts a new task at once (LISTEN/NOTIFY), not at its periodic claim', async () => {
    const c = await createCustomer(t.db, { balance: 100 });
    const api = await start({}, ['--role', 'api']);
    const listenersBefore = new Set((await listeners()).map((l) => l.pid));
    // The worker's video claims wait on this lock until the test knows where they stand: its
    // start-up claim is the one that waits.
    let release!: () => void;
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => (locked = r));
    const lock = t.db.transaction().execute(async (trx) => {
      await sql`lock table video_tasks in share mode`.execute(trx);
      locked();
      await new Promise<void>((r) => (release = r));
    });
    await isLocked;
    // A periodic claim once a minute: only a notification can start the task within the test's 20 s.
    const starting = start({ TASK_POLL_MS: '60000', PUBLIC_BASE_URL: api.url }, ['--role', 'worker']);
    try {
      // The worker's listener ran its LISTEN (a new session, idle after it) ...
      await until(async () => (await listeners()).some((l) => !listenersBefore.has(l.pid) && l.state === 'idle' && /^listen /i.test(l.query)), 30_000, "the worker's LISTEN");
      // ... and its start-up video claim waits for the lock.
      await until(waitingVideoClaim, 30_000, "the worker's start-up claim");
    } finally {
      release();
      await lock;
    }
    const worker = await starting;
    // Once the start-up claim (and any claim the listener's connect woke) is over, only a
    // notification or the periodic claim (a minute away) can take new work.
    await until(async () => !(await videoClaimRunning()), 10_000, 'the start-up claim to be over');
    const ids = await createTasks(api.url, c.key, 1);
    const rows = await waitVideoTasksFinished(t.db, ids, 20_000);
    expect(rows[0]!.status).toBe('completed');
    await Promise.all([api.kill('SIGTERM'), worker.kill('SIGTERM')]);
  }, 120_000);
});
