/**
 * The account pool across two real server processes sharing one database, against the fake
 * OpenAI Images and /v1/videos upstreams (one key per member; the fakes' own per-key logs are the
 * witness): weights inside the top priority tier over 1,000 requests (also with a concurrency limit
 * on the lighter member), the lower tier untouched while the top one is healthy and taking over when
 * it cools down, a concurrency limit that holds across both instances, failover without double
 * charge, rejected credentials that one instance saw keeping the member away from both, one probe of
 * a half-open circuit between both, and video jobs polled only on the member that accepted them by
 * an instance that did not submit them.
 */
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { startOpenAIVideosFake, type OpenAIVideosFake } from '../fakes/openai-video-upstream.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { freePort } from '../support/ports.ts';
import { spawnServer, type ServerProcess } from '../support/server-process.ts';
import { holdOf, until, waitVideoTasksFinished } from '../support/tasks.ts';
import { IMAGE_PRO, SORA_2, addUpstreamMember } from '../support/upstreams.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';

const ADMIN_TOKEN = 'pool-routing-admin-token-0123456789';
const IMAGE_PRICE = IMAGE_PRO.prices[0]!.unitPrice;
/** The longest TTLs config allows: a change seen sooner than this after a cache filled came from a notification. */
const POOL_CACHE_TTL_MS = 5000;
const KEY_CACHE_TTL_MS = 5000;
let t: TestDatabase;
let fake: OpenAIImagesFake;
let videos: OpenAIVideosFake;
const secret = randomBytes(32);
const servers: ServerProcess[] = [];

beforeAll(async () => {
  t = await createTestDatabase();
  await seedCatalog(t.db, [IMAGE_PRO, SORA_2]);
  fake = await startOpenAIImagesFake({ apiKeys: ['sk-heavy', 'sk-light', 'sk-spare', 'sk-limited', 'sk-flaky', 'sk-backup'] });
  videos = await startOpenAIVideosFake({ apiKeys: ['sk-video-a', 'sk-video-b'], jobDurationMs: 300 });
  for (let i = 0; i < 2; i++) {
    servers.push(
      await spawnServer({
        env: {
          DATABASE_URL: t.url,
          MEDIAGATE_SECRET_KEY: secret.toString('hex'),
          MEDIAGATE_DATA_DIR: `/tmp/mediagate-pool-routing-${process.pid}-${i}`,
          DEMO_DATA: '0',
          IMAGE_CAPACITY_WAIT_MS: '20000',
          DB_POOL_MAX: '20',
          ADMIN_TOKEN,
          // The first poll of a job comes 1.5-3 s after its submit: time enough to stop the submitter.
          VIDEO_POLL_INTERVAL_MS: '3000',
          // The caches' longest TTLs, so that a change seen before they expire shows the notification at work.
          POOL_CACHE_TTL_MS: String(POOL_CACHE_TTL_MS),
          MODEL_CACHE_TTL_MS: '5000',
          KEY_CACHE_TTL_MS: String(KEY_CACHE_TTL_MS),
        },
      }),
    );
  }
}, 120_000);
afterAll(async () => {
  for (const s of servers) s.child.kill('SIGCONT'); // a failed sticky-job test may leave one stopped
  await Promise.all(servers.map((s) => s.kill('SIGKILL')));
  await fake?.close();
  await videos?.close();
  await t?.destroy();
});

type MemberSpec = { key: string; priority: number; weight?: number; concurrencyLimit?: number; baseUrl?: string };

/** A customer whose group has the given image members (named after their keys). */
async function customer(members: MemberSpec[]) {
  const account = await createAccount(t.db, { balance: 100_000 });
  const group = await createGroup(t.db);
  const ids: Record<string, string> = {};
  for (const m of members) {
    ids[m.key] = (
      await addUpstreamMember(t.db, secret, {
        groupId: group.id,
        name: m.key,
        provider: 'openai',
        baseUrl: m.baseUrl ?? `${fake.url}/v1`,
        credentials: { api_key: m.key },
        models: [IMAGE_PRO.id],
        modelMap: { [IMAGE_PRO.id]: 'gpt-image-1' },
        priority: m.priority,
        weight: m.weight ?? 1,
        concurrencyLimit: m.concurrencyLimit ?? null,
      })
    ).id;
  }
  const key = await createApiKey(t.db, { accountId: account.id, groupId: group.id });
  return { key: key.key, keyId: key.id, accountId: account.id, groupId: group.id, ids };
}

/** One generation of `n` images on `server`. */
async function generate(key: string, server: ServerProcess, n = 1) {
  const res = await fetch(`${server.url}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: IMAGE_PRO.id, prompt: `a lighthouse, ${n} times`, size: '1024x1024', n }),
  });
  const body = (await res.json()) as { data?: unknown[] };
  return { status: res.status, images: body.data?.length ?? 0, taskId: res.headers.get('x-task-id')! };
}

/** `n` generations spread over both servers, `concurrency` at a time; returns the status codes. */
async function generateMany(key: string, n: number, concurrency: number): Promise<number[]> {
  const statuses: number[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const i = next++;
        const res = await fetch(`${servers[i % 2]!.url}/v1/images/generations`, {
          method: 'POST',
          headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
          body: JSON.stringify({ model: IMAGE_PRO.id, prompt: `request ${i}`, size: '1024x1024', response_format: 'url' }),
        });
        await res.arrayBuffer();
        statuses.push(res.status);
      }
    }),
  );
  return statuses;
}

/** Calls the fake answered with images, per member key. */
function servedByKey(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const call of fake.calls) if (call.outcome === 'ok') out[call.apiKey] = (out[call.apiKey] ?? 0) + 1;
  return out;
}

/**
 * Every task was held once and captured once at n × price (a ledger entry each, nothing
 * released), and the account was charged for these tasks and nothing else.
 */
async function expectChargedOnce(accountId: string, taskIds: string[], n: number) {
  const charge = n * IMAGE_PRICE;
  for (const id of taskIds) {
    const entries = await t.db.selectFrom('ledgerEntries').select(['kind', 'amount']).where('taskId', '=', id).orderBy('id').execute();
    expect(entries.map((e) => [e.kind, Math.abs(Number(e.amount))]), id).toEqual([
      ['hold', charge],
      ['capture', charge],
    ]);
    expect(await holdOf(t.db, id)).toMatchObject({ status: 'captured', amount: charge, captured: charge });
  }
  const captures = await t.db.selectFrom('ledgerEntries').select('taskId').where('accountId', '=', accountId).where('kind', '=', 'capture').execute();
  expect(captures.map((e) => e.taskId).sort()).toEqual([...taskIds].sort());
  const account = await t.db.selectFrom('accounts').select(totalSpentOf('accounts').as('totalSpent')).where('id', '=', accountId).executeTakeFirstOrThrow();
  expect(Number(account.totalSpent)).toBe(taskIds.length * charge);
}

describe('pool routing across two instances', () => {
  it('splits 1,000 requests 3:1 by weight inside the top tier, never touching the lower tier while the top one is healthy', async () => {
    const { key } = await customer([
      { key: 'sk-heavy', priority: 10, weight: 3 },
      { key: 'sk-light', priority: 10, weight: 1 },
      { key: 'sk-spare', priority: 0 },
    ]);
    const before = servedByKey();
    const statuses = await generateMany(key, 1000, 16);
    expect(statuses.filter((s) => s === 200)).toHaveLength(1000);
    const got = (k: string) => (servedByKey()[k] ?? 0) - (before[k] ?? 0);
    // Expected 750 / 250: a share within ±5 points is over 3.6 standard deviations of a fair split.
    expect(Math.abs(got('sk-heavy') / 1000 - 0.75)).toBeLessThanOrEqual(0.05);
    expect(Math.abs(got('sk-light') / 1000 - 0.25)).toBeLessThanOrEqual(0.05);
    expect(got('sk-spare')).toBe(0);

    // Both top members rate-limited: the lower tier takes over, on both instances, with one charge each.
    fake.rateLimitNext('generations', 30, 2);
    const failover = await generateMany(key, 10, 1);
    expect(failover.every((s) => s === 200)).toBe(true);
    expect(got('sk-spare')).toBeGreaterThanOrEqual(9);
  }, 180_000);

  it('keeps the 3:1 split over 1,000 requests when the lighter member has a concurrency limit', async () => {
    const { key } = await customer([
      { key: 'sk-heavy', priority: 10, weight: 3 },
      { key: 'sk-light', priority: 10, weight: 1, concurrencyLimit: 2 },
    ]);
    const before = servedByKey();
    // Two at a time over both instances: the limited member always has a free slot, so only the
    // draw decides (a head with a limit used to be drawn again, giving it about 6%).
    const statuses = await generateMany(key, 1000, 2);
    expect(statuses.filter((s) => s === 200)).toHaveLength(1000);
    const got = (k: string) => (servedByKey()[k] ?? 0) - (before[k] ?? 0);
    expect(Math.abs(got('sk-heavy') / 1000 - 0.75)).toBeLessThanOrEqual(0.05);
    expect(Math.abs(got('sk-light') / 1000 - 0.25)).toBeLessThanOrEqual(0.05);
  }, 180_000);

  it('holds a member to its concurrency limit across both instances', async () => {
    const { key } = await customer([{ key: 'sk-limited', priority: 0, concurrencyLimit: 3 }]);
    fake.resetInFlightStats();
    fake.holdMs = 250;
    try {
      const statuses = await generateMany(key, 24, 24);
      expect(statuses.every((s) => s === 200)).toBe(true);
    } finally {
      fake.holdMs = 0;
    }
    expect(fake.maxInFlightByKey['sk-limited']).toBe(3);
  }, 120_000);

  it('fails over from a member answering 500 to its first calls, from both instances, holding and capturing each request once at n × price', async () => {
    const c = await customer([
      { key: 'sk-flaky', priority: 10 },
      { key: 'sk-backup', priority: 0 },
    ]);
    const before = fake.calls.length;
    const results = [];
    for (let i = 0; i < 4; i++) {
      // The fake's faults are not per key: one for each of the first two calls, which go to sk-flaky.
      if (i < 2) fake.serverErrorNext('generations', 500, 1);
      results.push(await generate(c.key, servers[i % 2]!, 2));
    }
    expect(results.map((r) => [r.status, r.images])).toEqual(Array(4).fill([200, 2]));
    // Instance 0 and then instance 1 met a 500 and moved to the backup; then the member recovered.
    expect(fake.calls.slice(before).map((call) => `${call.apiKey}:${call.status}`)).toEqual(['sk-flaky:500', 'sk-backup:200', 'sk-flaky:500', 'sk-backup:200', 'sk-flaky:200', 'sk-flaky:200']);
    await expectChargedOnce(c.accountId, results.map((r) => r.taskId), 2);
  }, 60_000);

  it('fails concurrent requests to both instances over from a member that refuses connections, charging each once, and opens its circuit for both', async () => {
    const c = await customer([
      { key: 'sk-gone', priority: 10, baseUrl: `http://127.0.0.1:${await freePort()}/v1` },
      { key: 'sk-backup', priority: 0 },
    ]);
    const concurrent = await Promise.all(Array.from({ length: 8 }, (_, i) => generate(c.key, servers[i % 2]!, 2)));
    // Calls that fail together count as one failure of the streak (issue 26, item 7): three
    // requests one after the other, each meeting the member (until its circuit opens), make it three.
    const sequential = [];
    for (let i = 0; i < 3; i++) sequential.push(await generate(c.key, servers[i % 2]!, 2));
    const results = [...concurrent, ...sequential];
    expect(results.map((r) => [r.status, r.images])).toEqual(Array(11).fill([200, 2]));
    await expectChargedOnce(c.accountId, results.map((r) => r.taskId), 2);
    const health = () => t.db.selectFrom('memberHealth').select(['cooldownReason', 'failures']).where('memberId', '=', c.ids['sk-gone']!).executeTakeFirstOrThrow();
    const open = await health();
    expect(open.cooldownReason).toBe('circuit_open');
    expect(open.failures).toBeGreaterThanOrEqual(3);
    // Neither instance tries the member while its circuit is open: no new failure is recorded.
    for (const server of servers) expect((await generate(c.key, server)).status).toBe(200);
    expect((await health()).failures).toBe(open.failures);
  }, 60_000);

  it('lets exactly one probe through to a member whose circuit cooldown is over, across both instances, and its success closes the circuit for both', async () => {
    // The probed member has an upstream of its own, so that only its calls can be held.
    const probed = await startOpenAIImagesFake({ apiKeys: ['sk-probed'] });
    try {
      const c = await customer([
        { key: 'sk-probed', priority: 10, baseUrl: `${probed.url}/v1` },
        { key: 'sk-backup', priority: 0 },
      ]);
      const memberOf = async (taskId: string) => (await t.db.selectFrom('imageTasks').select('memberId').where('id', '=', taskId).executeTakeFirstOrThrow()).memberId;
      // Its circuit opened a while ago and the cooldown just ended (the insert's NOTIFY reaches both instances).
      await t.db
        .insertInto('memberHealth')
        .values({
          memberId: c.ids['sk-probed']!,
          cooldownUntil: sql<Date>`now() - interval '1 millisecond'`,
          cooldownReason: 'circuit_open',
          consecutiveFailures: 3,
          failureCountedAt: sql<Date>`now() - interval '31 seconds'`,
          lastErrorAt: sql<Date>`now() - interval '31 seconds'`,
        })
        .execute();

      probed.pause();
      const answered: string[] = [];
      let pending: Promise<unknown>[] = [];
      try {
        pending = Array.from({ length: 8 }, (_, i) => generate(c.key, servers[i % 2]!).then(async (r) => answered.push(r.status === 200 ? ((await memberOf(r.taskId)) ?? '') : String(r.status))));
        // Seven answered by the backup while the probe is held; a second call reaching the member ends the wait early.
        await until(() => (answered.length === 7 && probed.inFlight === 1) || probed.inFlight > 1, 30_000, 'seven answers while the probe is held');
        expect(probed.inFlight).toBe(1);
        expect(answered).toEqual(Array(7).fill(c.ids['sk-backup']));
      } finally {
        probed.resume();
        await Promise.all(pending);
      }
      expect(answered[7]).toBe(c.ids['sk-probed']);
      // The probe's success closed the circuit at once, and both instances heard of it.
      expect(await t.db.selectFrom('memberHealth').select(['cooldownReason', 'consecutiveFailures', 'probeUntil']).where('memberId', '=', c.ids['sk-probed']!).executeTakeFirstOrThrow()).toEqual({
        cooldownReason: null,
        consecutiveFailures: 0,
        probeUntil: null,
      });
      for (const server of servers) {
        const r = await generate(c.key, server);
        expect([r.status, await memberOf(r.taskId)]).toEqual([200, c.ids['sk-probed']]);
      }
    } finally {
      await probed.close();
    }
  }, 60_000);

  it('keeps a member whose key one instance saw refused (401) away from both instances, and shows it rejected in the admin view', async () => {
    const c = await customer([
      { key: 'sk-revoked', priority: 10 },
      { key: 'sk-backup', priority: 0 },
    ]);
    // A refused key never becomes a call in the fake's log: count the raw requests.
    const sentWith = (key: string) => fake.requests.filter((r) => r.headers.authorization === `Bearer ${key}`).length;
    const first = await generate(c.key, servers[0]!);
    expect(first.status).toBe(200);
    expect(sentWith('sk-revoked')).toBe(1);
    await expectChargedOnce(c.accountId, [first.taskId], 1);
    const later = [];
    for (let i = 0; i < 4; i++) later.push(await generate(c.key, servers[1 - (i % 2)]!));
    expect(later.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    expect(sentWith('sk-revoked')).toBe(1);

    const res = await fetch(`${servers[1]!.url}/admin/v1/groups/${c.groupId}/members`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
    const { data } = (await res.json()) as { data: { name: string; health: { credentials_rejected: boolean } }[] };
    expect(Object.fromEntries(data.map((m) => [m.name, m.health.credentials_rejected]))).toEqual({ 'sk-revoked': true, 'sk-backup': false });
  }, 60_000);

  it('drops both instances\' cached members and keys as soon as anyone changes them (SQL included), long before the caches expire', async () => {
    const c = await customer([
      { key: 'sk-heavy', priority: 10 },
      { key: 'sk-spare', priority: 0 },
    ]);
    const servedBy = async (server: ServerProcess) => {
      const before = fake.calls.length;
      const r = await generate(c.key, server);
      return r.status === 200 ? fake.calls.slice(before).find((call) => call.outcome === 'ok')?.apiKey : r.status;
    };
    // Both instances have the key, the model and the candidates cached. This group and key are new:
    // nothing of them was cached before `filled`, so those entries live until filled + 5 s at least.
    const filled = Date.now();
    for (const server of servers) expect(await servedBy(server)).toBe('sk-heavy');

    // An operator takes the top member out with SQL, no admin API involved: the database tells both instances.
    const memberChanged = Date.now();
    await t.db.updateTable('groupMembers').set({ enabled: false }).where('id', '=', c.ids['sk-heavy']!).execute();
    await until(async () => (await servedBy(servers[0]!)) === 'sk-spare' && (await servedBy(servers[1]!)) === 'sk-spare', 10_000, 'both instances to route to the spare');
    // Seen while the candidates cached at `filled` would still be served: the notification dropped them.
    expect(Date.now() - filled).toBeLessThan(POOL_CACHE_TTL_MS);

    // The key is deactivated the same way: 403 from both, while the key cache would still say active.
    // The member change's notification emptied it, so what it holds now was cached after `memberChanged`.
    await t.db.updateTable('apiKeys').set({ isActive: false }).where('id', '=', c.keyId).execute();
    await until(async () => (await servedBy(servers[0]!)) === 403 && (await servedBy(servers[1]!)) === 403, 10_000, 'both instances to refuse the key');
    expect(Date.now() - memberChanged).toBeLessThan(KEY_CACHE_TTL_MS);
  }, 60_000);

  // Ends instance 1: keep this test last.
  it('polls and downloads a video job only on the member that accepted it, from an instance that did not submit it', async () => {
    const account = await createAccount(t.db, { balance: 100 });
    const group = await createGroup(t.db);
    const member = async (key: string, priority: number) =>
      (await addUpstreamMember(t.db, secret, { groupId: group.id, name: key, provider: 'openai', baseUrl: `${videos.url}/v1`, credentials: { api_key: key }, models: [SORA_2.id], priority })).id;
    const a = await member('sk-video-a', 10);
    const b = await member('sk-video-b', 0);
    const { key } = await createApiKey(t.db, { accountId: account.id, groupId: group.id });
    const [submitter, poller] = [servers[1]!, servers[0]!];

    // Only instance 1 can submit: instance 0 is stopped until the jobs are accepted.
    poller.child.kill('SIGSTOP');
    let ids: string[];
    try {
      ids = await Promise.all(
        Array.from({ length: 3 }, async (_, i) => {
          const res = await fetch(`${submitter.url}/v1/videos/generations`, {
            method: 'POST',
            headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
            body: JSON.stringify({ client_request_id: `sticky-${i}`, prompt: 'a paper boat on a river', model: SORA_2.id, seconds: 4, aspectRatio: '16:9', resolution: '720p' }),
          });
          expect(res.status).toBe(202);
          return ((await res.json()) as { id: string }).id;
        }),
      );
      // Accepted upstream and the submit step over (the lease given back), before any poll.
      await until(async () => {
        const rows = await t.db.selectFrom('videoTasks').select(['upstreamJobId', 'leaseOwner']).where('id', 'in', ids).execute();
        return rows.every((r) => r.upstreamJobId !== null && r.leaseOwner === null);
      }, 10_000, 'the jobs to be accepted');
      expect(videos.counts.retrieve).toBe(0);
      await submitter.kill('SIGKILL');
    } finally {
      poller.child.kill('SIGCONT');
    }
    // A poll routed through the pool would now go to b.
    await t.db.updateTable('groupMembers').set({ priority: 20 }).where('id', '=', b).execute();

    const rows = await waitVideoTasksFinished(t.db, ids, 20_000);
    expect(rows.map((r) => r.status)).toEqual(['completed', 'completed', 'completed']);
    const keyOf = (r: { headers: Record<string, unknown> }) => String(r.headers.authorization).replace('Bearer ', '');
    for (const row of rows) {
      const submits = videos.requests.filter((r) => r.method === 'POST' && r.headers['idempotency-key'] === row.id);
      expect(submits.map(keyOf)).toEqual(['sk-video-a']);
      const followUps = videos.requests.filter((r) => r.method === 'GET' && r.path.startsWith(`/v1/videos/${row.upstreamJobId}`));
      expect(followUps.map((r) => r.path)).toContain(`/v1/videos/${row.upstreamJobId}/content`);
      expect(new Set(followUps.map(keyOf))).toEqual(new Set(['sk-video-a']));
      expect((await holdOf(t.db, row.id)).status).toBe('captured');
    }
    expect(videos.requests.filter((r) => keyOf(r) === 'sk-video-b')).toEqual([]);
    const tasks = await t.db.selectFrom('videoTasks').select('memberId').where('id', 'in', ids).execute();
    expect(tasks.map((r) => r.memberId)).toEqual([a, a, a]);
  }, 60_000);
});
