/**
 * The task engine against a fake OpenAI `/v1/videos` upstream with real server processes: many
 * jobs in flight at once, two processes sharing them with each submit and each download done
 * once, and a SIGKILL with hundreds of jobs in flight after which every task completes exactly
 * once with one capture. Hundreds here, to keep the suite quick; thousands are the inflight bench's
 * (`npm run bench -- inflight`: 10,000 jobs from one process).
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startOpenAIVideosFake, type OpenAIVideosFake } from '../fakes/openai-video-upstream.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { waitVideoTasksFinished } from '../support/tasks.ts';
import { spawnServer, type ServerProcess } from '../support/server-process.ts';
import { SORA_2, addUpstreamMember } from '../support/upstreams.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase;
let fake: OpenAIVideosFake;
const secret = randomBytes(32);
const running: ServerProcess[] = [];

beforeAll(async () => {
  t = await createTestDatabase();
  await seedCatalog(t.db, [SORA_2]);
  // Jobs take 2.5 s upstream; "shared" ones 8 s (many must overlap however slowly a loaded machine
  // creates them); "long" ones run until the test lets them finish (the SIGKILL test needs all of
  // them still running when it kills the server, however long a loaded machine takes to submit 200).
  const durations: Record<string, number | 'never'> = { shared: 8000, long: 'never' };
  fake = await startOpenAIVideosFake({ jobDurationMs: 2500, contentBytes: 2048, durationFor: (prompt) => durations[prompt.split(' ')[0]!] });
});
afterAll(async () => {
  await Promise.all(running.map((p) => p.kill('SIGKILL')));
  await fake?.close();
  await t?.destroy();
});

async function start(extra: Record<string, string> = {}): Promise<ServerProcess> {
  const p = await spawnServer({
    env: {
      DATABASE_URL: t.url,
      MEDIAGATE_SECRET_KEY: secret.toString('hex'),
      MEDIAGATE_DATA_DIR: `/tmp/mediagate-upstream-engine-${process.pid}`,
      DEMO_DATA: '0',
      VIDEO_POLL_INTERVAL_MS: '500',
      // Long enough that heartbeats queued behind 200 steps on a loaded CI machine still land in time
      // (a lease that lapses lets the row be claimed again: a second submit); short enough for the restart.
      TASK_LEASE_MS: '5000',
      TASK_POLL_MS: '200',
      ...extra,
    },
  });
  running.push(p);
  return p;
}

async function customer() {
  const account = await createAccount(t.db, { balance: 10_000 });
  const group = await createGroup(t.db);
  await addUpstreamMember(t.db, secret, { groupId: group.id, provider: 'openai', baseUrl: `${fake.url}/v1`, credentials: { api_key: 'sk-test' }, models: [SORA_2.id] });
  const key = await createApiKey(t.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, key: key.key };
}

async function createTasks(urls: string[], key: string, n: number, prompt = 'clip'): Promise<string[]> {
  const ids: string[] = [];
  let next = 0;
  const worker = async (w: number) => {
    while (next < n) {
      const i = next++;
      const res = await fetch(`${urls[(w + i) % urls.length]}/v1/videos/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ client_request_id: `ue-${randomBytes(6).toString('hex')}`, prompt: `${prompt} ${i}`, model: SORA_2.id, seconds: 4, aspectRatio: '16:9', resolution: '720p' }),
      });
      expect(res.status).toBe(202);
      ids.push(((await res.json()) as { id: string }).id);
    }
  };
  await Promise.all(Array.from({ length: 16 }, (_, w) => worker(w)));
  return ids;
}

/** Every task: completed, one hold and one capture, one output file. */
async function expectCompletedOnce(ids: string[]) {
  const rows = await t.db.selectFrom('videoTasks').select(['id', 'status']).where('id', 'in', ids).execute();
  expect(rows.filter((r) => r.status !== 'completed')).toEqual([]);
  const entries = await t.db
    .selectFrom('ledgerEntries')
    .select(['taskId', 'kind', (eb) => eb.fn.countAll<number>().as('n')])
    .where('taskId', 'in', ids)
    .groupBy(['taskId', 'kind'])
    .execute();
  expect(entries.filter((e) => Number(e.n) !== 1)).toEqual([]);
  expect(entries.filter((e) => e.kind === 'capture')).toHaveLength(ids.length);
  expect(entries.filter((e) => e.kind === 'hold')).toHaveLength(ids.length);
  const outputs = await t.db
    .selectFrom('files')
    .select(['taskId', (eb) => eb.fn.countAll<number>().as('n')])
    .where('taskId', 'in', ids)
    .where('purpose', '=', 'video_output')
    .groupBy('taskId')
    .execute();
  expect(outputs).toHaveLength(ids.length);
  expect(outputs.filter((o) => Number(o.n) !== 1)).toEqual([]);
}

const jobsOf = (ids: string[]) => {
  const wanted = new Set(ids);
  return [...fake.jobs.values()].filter((j) => j.idempotencyKey && wanted.has(j.idempotencyKey));
};

describe('two server processes sharing 400 upstream jobs', () => {
  it('keep them all in flight at once and do each submit and each download once', async () => {
    const c = await customer();
    const [a, b] = await Promise.all([start({ TASK_LEASE_MS: '15000' }), start({ TASK_LEASE_MS: '15000' })]);
    const ids = await createTasks([a.url, b.url], c.key, 400, 'shared');
    const rows = await waitVideoTasksFinished(t.db, ids, 120_000);
    await expectCompletedOnce(ids);
    const jobs = jobsOf(ids);
    expect(jobs).toHaveLength(400);
    expect(jobs.filter((j) => j.downloads !== 1)).toEqual([]);
    expect(new Set(rows.map((r) => r.upstreamJobId)).size).toBe(400);
    // Jobs were in flight together: many ran upstream at the same time.
    const overlapping = jobs.filter((j) => j.createdAt < jobs[0]!.doneAt!).length;
    expect(overlapping).toBeGreaterThan(100);
    await Promise.all([a.kill('SIGTERM'), b.kill('SIGTERM')]);
  }, 180_000);
});

describe('SIGKILL with 200 jobs in flight', () => {
  it('restarts, and every task completes exactly once with one capture', async () => {
    const c = await customer();
    const first = await start();
    const ids = await createTasks([first.url], c.key, 200, 'long');
    // Kill once every job runs upstream (none finishes before the kill) and none has finished.
    const deadline = Date.now() + 60_000;
    for (;;) {
      const submitted = await t.db.selectFrom('videoTasks').select('id').where('id', 'in', ids).where('upstreamJobId', 'is not', null).execute();
      if (submitted.length === ids.length) break;
      if (Date.now() > deadline) throw new Error(`only ${submitted.length} submitted`);
      await new Promise((r) => setTimeout(r, 50));
    }
    expect((await first.kill('SIGKILL')).signal).toBe('SIGKILL');
    const inFlight = await t.db.selectFrom('videoTasks').select('id').where('id', 'in', ids).where('status', 'in', ['queued', 'in_progress']).where('upstreamJobId', 'is not', null).execute();
    expect(inFlight).toHaveLength(200);
    // The upstream finishes them while the server is down and restarting.
    for (const job of jobsOf(ids)) job.doneAt = Date.now() + 2000;

    const second = await start();
    await waitVideoTasksFinished(t.db, ids, 120_000);
    await expectCompletedOnce(ids);
    // Every job id was saved before the kill: the restarted process polls them and submits none
    // again (a submit repeats only when a kill lands between sending it and saving its id).
    const jobs = jobsOf(ids);
    expect(jobs).toHaveLength(ids.length);
    expect(new Set(jobs.map((j) => j.idempotencyKey)).size).toBe(ids.length);
    expect(second.stdout()).not.toMatch(/resubmitting/);
    await second.kill('SIGTERM');
  }, 180_000);
});
