/**
 * The account pool through the public API, against the fake OpenAI Images upstream (each member
 * has its own key, so the fake's per-key log says which member served a call): model maps,
 * failover without double charge, 429 cooldown, circuit, rejected credentials disabling a member
 * until an admin changes it, concurrency limits (wait, then 503 no_upstream_capacity), the slots each image
 * task holds (summed as the member's in-flight work), health in the admin API and per-member metrics.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { newId } from '../../server/lib/ids.ts';
import { NoCapacity } from '../../server/pool/pool.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { Fence } from '../../server/repositories/leased-tasks.ts';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { until } from '../support/tasks.ts';
import { createWorkers } from '../../server/workers/index.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { IMAGE_PRO, addUpstreamMember } from '../support/upstreams.ts';

const KEYS = ['sk-a', 'sk-b', 'sk-c', 'sk-d'];
let server: TestServer;
let fake: OpenAIImagesFake;

beforeAll(async () => {
  fake = await startOpenAIImagesFake({ apiKeys: KEYS, record: true });
  server = await startTestServer({ env: { IMAGE_CAPACITY_WAIT_MS: '1500', METRICS_TOKEN: 'metrics-token-0123456789' } });
  await seedCatalog(server.db, [IMAGE_PRO]);
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});
beforeEach(() => {
  fake.holdMs = 0;
  fake.faults.clear();
});

type MemberSpec = { name: string; key: string; priority?: number; weight?: number; concurrencyLimit?: number };

/** A customer whose group has the given members, all serving image-pro as gpt-image-1.5. */
async function customer(members: MemberSpec[]) {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const ids: Record<string, string> = {};
  for (const m of members) {
    ids[m.name] = (
      await addUpstreamMember(server.db, server.secretKey, {
        groupId: group.id,
        name: m.name,
        provider: 'openai',
        baseUrl: `${fake.url}/v1`,
        credentials: { api_key: m.key },
        models: [IMAGE_PRO.id],
        modelMap: { [IMAGE_PRO.id]: 'gpt-image-1.5' },
        priority: m.priority ?? 0,
        weight: m.weight ?? 1,
        concurrencyLimit: m.concurrencyLimit ?? null,
      })
    ).id;
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, groupId: group.id, key: key.key, keyId: key.id, ids };
}

async function generate(key: string, prompt = 'a lighthouse at dusk') {
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: IMAGE_PRO.id, prompt, size: '1024x1024' }),
  });
  const body = (await res.json()) as { data?: unknown[]; error?: { code: string; message: string } };
  return { status: res.status, body, taskId: res.headers.get('x-task-id'), retryAfter: res.headers.get('retry-after') };
}

const callsSince = (n: number) => fake.calls.slice(n);
const keysOf = (calls: { apiKey: string }[]) => calls.map((c) => c.apiKey);

async function ledgerKinds(taskId: string) {
  return (await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', taskId).orderBy('id').execute()).map((e) => e.kind);
}

async function membersOf(groupId: string) {
  const { data } = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } } });
  return Object.fromEntries(data!.data.map((m) => [m.name, m]));
}

describe('pool routing', () => {
  it('sends the member model id upstream and keeps to the highest priority tier', async () => {
    const c = await customer([
      { name: 'top', key: 'sk-a', priority: 10 },
      { name: 'spare', key: 'sk-b', priority: 0 },
    ]);
    const before = fake.calls.length;
    for (let i = 0; i < 5; i++) expect((await generate(c.key)).status).toBe(200);
    const calls = callsSince(before);
    expect(keysOf(calls)).toEqual(['sk-a', 'sk-a', 'sk-a', 'sk-a', 'sk-a']);
    expect(calls.every((call) => call.model === 'gpt-image-1.5')).toBe(true);
  });

  it('names the member on the task row from the start, so the admin view counts the call in flight while the upstream works', async () => {
    const c = await customer([{ name: 'only', key: 'sk-a' }]);
    expect((await generate(c.key)).status).toBe(200); // candidates cached: the member is chosen before the task row is written
    fake.pause();
    const pending = generate(c.key);
    try {
      await until(async () => (await membersOf(c.groupId)).only!.health.in_flight === 1, 5_000, 'the call to be counted in flight');
      const running = await server.db.selectFrom('imageTasks').select(['memberId', 'memberSlots']).where('groupId', '=', c.groupId).where('status', '=', 'processing').execute();
      expect(running).toEqual([{ memberId: c.ids.only, memberSlots: 1 }]);
    } finally {
      fake.resume();
    }
    expect((await pending).status).toBe(200);
    expect((await membersOf(c.groupId)).only!.health.in_flight).toBe(0);
  });

  it('fails over to the next member on a 5xx, charges once, and records the failure on the member', async () => {
    const c = await customer([
      { name: 'top', key: 'sk-a', priority: 10 },
      { name: 'spare', key: 'sk-b', priority: 0 },
    ]);
    const before = fake.calls.length;
    fake.serverErrorNext('generations', 500);
    const r = await generate(c.key);
    expect(r.status).toBe(200);
    expect(keysOf(callsSince(before))).toEqual(['sk-a', 'sk-b']);
    expect(await ledgerKinds(r.taskId!)).toEqual(['hold', 'capture']);
    const task = await server.db.selectFrom('imageTasks').select(['memberId', 'actualCredits', 'quotedCredits']).where('id', '=', r.taskId!).executeTakeFirstOrThrow();
    expect(task.memberId).toBe(c.ids.spare);
    expect(task.actualCredits).toBe(task.quotedCredits);
    const members = await membersOf(c.groupId);
    expect(members.top!.health.recent.failures).toBe(1);
    expect(members.top!.health.last_error).toBeTruthy();
    expect(members.top!.health.cooldown_until).toBeNull(); // one 5xx does not open the circuit
  });

  it('cools a member down for its Retry-After after a 429: nothing goes there until it ends', async () => {
    const c = await customer([
      { name: 'top', key: 'sk-a', priority: 10 },
      { name: 'spare', key: 'sk-b', priority: 0 },
    ]);
    const before = fake.calls.length;
    fake.rateLimitNext('generations', 2);
    expect((await generate(c.key)).status).toBe(200);
    for (let i = 0; i < 3; i++) expect((await generate(c.key)).status).toBe(200);
    expect(keysOf(callsSince(before))).toEqual(['sk-a', 'sk-b', 'sk-b', 'sk-b', 'sk-b']);
    const members = await membersOf(c.groupId);
    expect(members.top!.health).toMatchObject({ cooldown_reason: 'rate_limited' });
    expect(Date.parse(members.top!.health.cooldown_until!) - Date.now()).toBeGreaterThan(500);
    await new Promise((r) => setTimeout(r, Date.parse(members.top!.health.cooldown_until!) - Date.now() + 100));
    const after = fake.calls.length;
    expect((await generate(c.key)).status).toBe(200);
    expect(keysOf(callsSince(after))).toEqual(['sk-a']);
  });

  it('answers 503 no_upstream_capacity with Retry-After when every member is cooling down (not the client\'s 429), and charges nothing', async () => {
    const c = await customer([{ name: 'only', key: 'sk-a' }]);
    fake.rateLimitNext('generations', 30);
    const first = await generate(c.key);
    expect(first.status).toBe(503);
    expect(first.body.error!.code).toBe('no_upstream_capacity');
    const before = fake.calls.length;
    const second = await generate(c.key);
    expect(second.status).toBe(503);
    expect(second.body.error!.code).toBe('no_upstream_capacity');
    expect(second.body.error!.message).toMatch(/^No upstream account can take model 'image-pro' right now: every one is cooling down after failures or rate limits; retry in \d+ s\. Task img_\w+ failed; nothing was charged\.$/);
    expect(Number(second.retryAfter)).toBeGreaterThan(20);
    expect(fake.calls.length).toBe(before); // the cooling member was not called
    for (const r of [first, second]) expect(await ledgerKinds(r.taskId!)).toEqual(['hold', 'release']);
  });

  it('blames an upstream 404 (a wrong base URL) on the member, not the client: the spare serves, and the member is left out for that model until an admin changes it', async () => {
    const c = await customer([
      { name: 'wrong-url', key: 'sk-a', priority: 10 },
      { name: 'spare', key: 'sk-b', priority: 0 },
    ]);
    // The operator forgot the /v1 of the base URL: the upstream answers 404 for the path.
    await server.db.updateTable('groupMembers').set({ baseUrl: fake.url }).where('id', '=', c.ids['wrong-url']!).execute();
    const first = await generate(c.key);
    expect(first.status).toBe(200);
    const faults = (await membersOf(c.groupId))['wrong-url']!.health.model_faults;
    expect(faults).toEqual([{ model: IMAGE_PRO.id, kind: 'misconfigured', reason: expect.stringMatching(/^HTTP 404: Invalid URL/), since: expect.any(String), until: expect.any(String) }]);
    expect(server.logs.some((l) => l.includes('"level":50') && l.includes('cannot serve this model'))).toBe(true);
    // The next requests go straight to the spare.
    const before = fake.requests.length;
    for (let i = 0; i < 3; i++) expect((await generate(c.key)).status).toBe(200);
    expect(fake.requests.slice(before).map((r) => String(r.headers.authorization))).toEqual(['Bearer sk-b', 'Bearer sk-b', 'Bearer sk-b']);
    // The operator fixes the base URL: the fault is gone and the member serves again.
    const patched = await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', {
      params: { path: { group_id: c.groupId, member_id: c.ids['wrong-url']! } },
      body: { base_url: `${fake.url}/v1` },
    });
    expect(patched.data!.health.model_faults).toEqual([]);
    const after = fake.calls.length;
    expect((await generate(c.key)).status).toBe(200);
    expect(keysOf(callsSince(after))).toEqual(['sk-a']);
  });

  it('answers 502 upstream_error, not 400, when the upstream refuses the model of a member\'s model map; the member\'s other models keep working', async () => {
    const other = { ...IMAGE_PRO, id: 'image-pro-other' };
    await seedCatalog(server.db, [IMAGE_PRO, other]);
    const c = await customer([{ name: 'mapped', key: 'sk-a' }]);
    await server.db
      .updateTable('groupMembers')
      .set({ models: [IMAGE_PRO.id, other.id], modelMap: JSON.stringify({ [IMAGE_PRO.id]: 'gpt-image-99', [other.id]: 'gpt-image-1.5' }) })
      .where('id', '=', c.ids.mapped!)
      .execute();
    const refused = await generate(c.key);
    expect(refused.status).toBe(502);
    expect(refused.body.error).toMatchObject({ code: 'upstream_error', message: expect.stringMatching(/^The upstream account that serves this request is misconfigured; the operator can see why in the pool member's health\. Task img_\w+ failed; nothing was charged\.$/) });
    expect(refused.body.error!.message).not.toContain('gpt-image-99');
    expect(await ledgerKinds(refused.taskId!)).toEqual(['hold', 'release']);
    const health = (await membersOf(c.groupId)).mapped!.health;
    expect(health.model_faults).toEqual([expect.objectContaining({ model: IMAGE_PRO.id, kind: 'misconfigured', reason: expect.stringContaining('gpt-image-99') })]);
    // The member is left out for that model only.
    const again = await generate(c.key);
    expect([again.status, again.body.error!.code]).toEqual([503, 'no_reachable_member']);
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: other.id, prompt: 'a lighthouse', size: '1024x1024' }),
    });
    expect(res.status).toBe(200);
  });

  it('says what happened in sentences: an upstream that cannot be reached', async () => {
    const c = await customer([{ name: 'gone', key: 'sk-a' }]);
    await server.db.updateTable('groupMembers').set({ baseUrl: 'http://127.0.0.1:9/v1' }).where('id', '=', c.ids.gone!).execute();
    const r = await generate(c.key);
    expect(r.status).toBe(502);
    expect(r.body.error!.message).toMatch(/^The upstream failed: the upstream image generation could not be reached\. Task img_\w+ failed; nothing was charged\.$/);
  });

  it('takes a member whose credentials are refused out of rotation until an admin updates it', async () => {
    const c = await customer([
      { name: 'revoked', key: 'sk-revoked', priority: 10 },
      { name: 'spare', key: 'sk-b', priority: 0 },
    ]);
    // A refused key never becomes a call in the fake's log: read the raw requests.
    const keysSent = (from: number) => fake.requests.slice(from).map((r) => String(r.headers.authorization).replace('Bearer ', ''));
    const before = fake.requests.length;
    const r = await generate(c.key);
    expect(r.status).toBe(200);
    expect(await ledgerKinds(r.taskId!)).toEqual(['hold', 'capture']);
    for (let i = 0; i < 3; i++) expect((await generate(c.key)).status).toBe(200);
    expect(keysSent(before)).toEqual(['sk-revoked', 'sk-b', 'sk-b', 'sk-b', 'sk-b']);
    expect(server.logs.some((l) => l.includes('credentials rejected'))).toBe(true);
    expect(server.logs.join('\n')).not.toContain('sk-revoked');
    const members = await membersOf(c.groupId);
    expect(members.revoked!.health.credentials_rejected).toBe(true);

    // The operator rotates the key: the member is back.
    const patched = await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', {
      params: { path: { group_id: c.groupId, member_id: c.ids.revoked! } },
      body: { credentials: { api_key: 'sk-c' } },
    });
    expect(patched.data!.health.credentials_rejected).toBe(false);
    const after = fake.calls.length;
    expect((await generate(c.key)).status).toBe(200);
    expect(keysOf(callsSince(after))).toEqual(['sk-c']);
  });

  it('after the only member\'s credentials are refused, says where the operator sees why (503 upstream_unavailable), then that the serving members are out of rotation (503 no_reachable_member)', async () => {
    const c = await customer([{ name: 'only', key: 'sk-refused' }]);
    const first = await generate(c.key);
    expect([first.status, first.body.error?.code]).toEqual([503, 'upstream_unavailable']);
    expect(first.body.error!.message).toMatch(/^The upstream account cannot take work right now \(its credentials, quota or balance\); the operator can see why in the pool member's health\. Task img_\w+ failed; nothing was charged\.$/);
    expect((await membersOf(c.groupId)).only!.health.credentials_rejected).toBe(true);
    // The member is still enabled, only out of rotation: the message says so, not that none is enabled.
    const next = await generate(c.key);
    expect([next.status, next.body.error?.code]).toEqual([503, 'no_reachable_member']);
    expect(next.body.error!.message).toMatch(
      new RegExp(`^No backend member can take work for model '${IMAGE_PRO.id}' now: every member that serves it is disabled or out of rotation \\(rejected credentials, a disabled upstream account, or the model refused upstream\\); the operator sees which in the group's member list\\. Task img_\\w+ failed; nothing was charged\\.$`),
    );
  });

  it('opens the circuit of a member after three 5xx in a row', async () => {
    const c = await customer([
      { name: 'flaky', key: 'sk-a', priority: 10 },
      { name: 'spare', key: 'sk-b', priority: 0 },
    ]);
    for (let i = 0; i < 3; i++) {
      fake.serverErrorNext('generations', 503); // the top member's call; the spare then succeeds
      expect((await generate(c.key)).status).toBe(200);
    }
    const before = fake.calls.length;
    expect((await generate(c.key)).status).toBe(200);
    expect(keysOf(callsSince(before))).toEqual(['sk-b']);
    expect((await membersOf(c.groupId)).flaky!.health).toMatchObject({ cooldown_reason: 'circuit_open', recent: { failures: 3 } });
  });

  it('never runs more than concurrency_limit calls on a member; requests wait for a slot, then get 503 no_upstream_capacity', async () => {
    const c = await customer([{ name: 'small', key: 'sk-d', concurrencyLimit: 2 }]);
    fake.resetInFlightStats();
    fake.holdMs = 300;
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) => generate(c.key, `concurrent ${i}`)));
    expect(results.map((r) => r.status)).toEqual([200, 200, 200, 200, 200, 200]);
    expect(fake.maxInFlightByKey['sk-d']).toBe(2);

    // Slots held longer than the wait: the excess gets 503 with Retry-After, and is not charged.
    fake.resetInFlightStats();
    fake.holdMs = 2500;
    const busy = await Promise.all(Array.from({ length: 4 }, (_, i) => generate(c.key, `busy ${i}`)));
    expect(fake.maxInFlightByKey['sk-d']).toBe(2);
    expect(busy.map((r) => r.status).sort()).toEqual([200, 200, 503, 503]);
    for (const r of busy.filter((b) => b.status === 503)) {
      expect(r.body.error!.code).toBe('no_upstream_capacity');
      expect(r.body.error!.message).toContain('every one is at its concurrency limit');
      expect(Number(r.retryAfter)).toBeGreaterThanOrEqual(1);
      expect(await ledgerKinds(r.taskId!)).toEqual(['hold', 'release']);
    }
    expect((await membersOf(c.groupId)).small!.health.in_flight).toBe(0);
  });

  it('counts upstream calls per member and outcome in /metrics', async () => {
    const c = await customer([{ name: 'metered', key: 'sk-a' }]);
    fake.serverErrorNext('generations', 500);
    await generate(c.key);
    await generate(c.key);
    const text = await (await fetch(`${server.directUrl}/metrics`, { headers: { Authorization: 'Bearer metrics-token-0123456789' } })).text();
    const line = (outcome: string) => text.split('\n').find((l) => l.startsWith(`mediagate_upstream_requests_total{provider="openai",member="${c.ids.metered}",outcome="${outcome}"}`));
    expect(line('ok')).toMatch(/ 1$/);
    expect(line('retryable')).toMatch(/ 1$/);
    expect(text).toContain(`mediagate_upstream_request_duration_seconds_count{provider="openai",member="${c.ids.metered}"} 2`);
  });
});

describe('a member preselected for the task row', () => {
  it('is the head of the drawn routing order, and only when it has no concurrency limit', async () => {
    const c = await customer([
      { name: 'top', key: 'sk-a', priority: 10 },
      { name: 'spare', key: 'sk-b', priority: 0 },
    ]);
    expect(await server.ctx.pool.preselect({ groupId: c.groupId, model: IMAGE_PRO.id, capability: 'image', slots: () => 2 })).toEqual({
      order: [c.ids.top, c.ids.spare],
      first: { memberId: c.ids.top, slots: 2 },
    });
    const limited = await customer([{ name: 'small', key: 'sk-c', concurrencyLimit: 5 }]);
    expect(await server.ctx.pool.preselect({ groupId: limited.groupId, model: IMAGE_PRO.id, capability: 'image' })).toEqual({ order: [limited.ids.small] });
  });

  it('runs the work without taking its slots again; a failover takes the next member as usual', async () => {
    const c = await customer([
      { name: 'top', key: 'sk-a', priority: 10 },
      { name: 'spare', key: 'sk-b', priority: 0 },
    ]);
    const { pool, log } = server.ctx;
    const { order, first } = await pool.preselect({ groupId: c.groupId, model: IMAGE_PRO.id, capability: 'image' });
    const taken: string[] = [];
    const route = (work: (memberId: string) => Promise<string>) =>
      pool.route(
        { groupId: c.groupId, model: IMAGE_PRO.id, capability: 'image', order, first, take: async (memberId) => void taken.push(memberId), release: async () => undefined, log },
        (account) => work(account.memberId),
      );
    expect(await route(async (id) => id)).toBe(c.ids.top);
    expect(taken).toEqual([]);
    const failing = async (id: string) => {
      if (id === c.ids.top) throw new ProviderError('retryable', 'upstream 502');
      return id;
    };
    expect(await route(failing)).toBe(c.ids.spare);
    expect(taken).toEqual([c.ids.spare]);
  });

  it('is not drawn again when the head has a concurrency limit: route takes its slot in the drawn order', async () => {
    const c = await customer([
      { name: 'heavy', key: 'sk-a', weight: 3 },
      { name: 'light', key: 'sk-b', weight: 1, concurrencyLimit: 2 },
    ]);
    const { pool, log } = server.ctx;
    // The drawn order names the limited member first: route must not draw again.
    const taken: string[] = [];
    const served = await pool.route(
      { groupId: c.groupId, model: IMAGE_PRO.id, capability: 'image', order: [c.ids.light!, c.ids.heavy!], take: async (memberId) => void taken.push(memberId), release: async () => undefined, log },
      async (account) => account.memberId,
    );
    expect([served, taken]).toEqual([c.ids.light, [c.ids.light]]);
  });

  it('keeps the weights when the lighter member has a concurrency limit: 1,000 requests split 3:1 within ±5 points', async () => {
    const c = await customer([
      { name: 'heavy', key: 'sk-a', weight: 3 },
      { name: 'light', key: 'sk-b', weight: 1, concurrencyLimit: 2 },
    ]);
    const before = fake.calls.length;
    // Two at a time: the limited member always has a free slot, so only the draw decides.
    let next = 0;
    const statuses: number[] = [];
    await Promise.all(
      [0, 1].map(async () => {
        while (next < 1000) {
          next++;
          const res = await fetch(`${server.directUrl}/v1/images/generations`, {
            method: 'POST',
            headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
            body: JSON.stringify({ model: IMAGE_PRO.id, prompt: 'weights', size: '1024x1024', response_format: 'url' }),
          });
          await res.arrayBuffer();
          statuses.push(res.status);
        }
      }),
    );
    expect(statuses.filter((s) => s === 200)).toHaveLength(1000);
    const served = keysOf(callsSince(before).filter((call) => call.outcome === 'ok'));
    const share = (key: string) => served.filter((k) => k === key).length / 1000;
    // Expected 0.75 / 0.25: ±5 points is over 3.6 standard deviations of a fair split (drawing again
    // when the head was limited gave the light member about 6%).
    expect(Math.abs(share('sk-a') - 0.75)).toBeLessThanOrEqual(0.05);
    expect(Math.abs(share('sk-b') - 0.25)).toBeLessThanOrEqual(0.05);
  }, 120_000);
});

describe('member slots', () => {
  type Customer = Awaited<ReturnType<typeof customer>>;

  /** A processing image task of the customer, as a request running it would hold it. */
  async function processingTask(c: Customer, n: number): Promise<Fence> {
    const id = newId('img');
    await server.db
      .insertInto('imageTasks')
      .values({ id, accountId: c.accountId, apiKeyId: c.keyId, groupId: c.groupId, operation: 'generation', model: IMAGE_PRO.id, prompt: 'slots', params: JSON.stringify({}), n, unitPrice: 0, quotedCredits: 0, attempt: 1 })
      .execute();
    return { id, attempt: 1 };
  }

  /** Routes a task that wants `wanted` parallel calls the way the image runner does; resolves to the slots it got. */
  function route(c: Customer, fence: Fence, wanted: number) {
    const { pool, repositories, log } = server.ctx;
    return pool.route(
      {
        groupId: c.groupId,
        model: IMAGE_PRO.id,
        capability: 'image',
        slots: () => wanted,
        take: async (memberId, db, slots) => void expect(await repositories.imageTasks.assignMember(fence, memberId, slots, db)).toBe(true),
        release: async () => void (await repositories.imageTasks.releaseMember(fence)),
        log,
      },
      async (_account, slots) => slots,
    );
  }

  /** The member's slots in use as its slot lock counts them. */
  const inFlight = (c: Customer) => server.db.transaction().execute((trx) => server.ctx.repositories.routing.lockSlots(trx, c.ids.small!));
  const slotsOf = (fence: Fence) => server.db.selectFrom('imageTasks').select(['memberId', 'memberSlots']).where('id', '=', fence.id).executeTakeFirstOrThrow();

  it('records the slots each image task took (as many as it wants and are free) and counts their sum as the member\'s in-flight work', async () => {
    const c = await customer([{ name: 'small', key: 'sk-d', concurrencyLimit: 3 }]);
    const [a, b, late] = [await processingTask(c, 2), await processingTask(c, 2), await processingTask(c, 1)];

    expect(await route(c, a, 2)).toBe(2);
    expect(await slotsOf(a)).toEqual({ memberId: c.ids.small, memberSlots: 2 });
    expect(await inFlight(c)).toBe(2);
    // One slot left: the next task gets it and runs its calls one at a time.
    expect(await route(c, b, 2)).toBe(1);
    expect(await slotsOf(b)).toEqual({ memberId: c.ids.small, memberSlots: 1 });
    expect(await inFlight(c)).toBe(3);
    expect((await membersOf(c.groupId)).small!.health.in_flight).toBe(3);
    // None left: the existing 'full' handling.
    await expect(route(c, late, 1)).rejects.toSatisfy((err) => err instanceof NoCapacity && err.reason === 'full');
    expect(await slotsOf(late)).toEqual({ memberId: null, memberSlots: 1 });

    // A released task gives all its slots back.
    await server.ctx.repositories.imageTasks.releaseMember(a);
    expect(await slotsOf(a)).toEqual({ memberId: null, memberSlots: 1 });
    expect(await inFlight(c)).toBe(1);
    expect(await route(c, late, 1)).toBe(1);
    expect(await inFlight(c)).toBe(2);

    // The database holds the invariant too.
    await expect(server.db.updateTable('imageTasks').set({ memberSlots: 0 }).where('id', '=', b.id).execute()).rejects.toThrow(/image_tasks_member_slots_check/);
  });
});

describe('pool routing of streams', () => {
  async function stream(key: string) {
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: IMAGE_PRO.id, prompt: 'a streamed lighthouse', size: '1024x1024', stream: true, partial_images: 2 }),
    });
    const text = await res.text();
    const events = [...text.matchAll(/^event: (.+)$/gm)].map((m) => m[1]);
    return { status: res.status, events, taskId: res.headers.get('x-task-id') };
  }

  it('fails over before anything reached the client', async () => {
    const c = await customer([
      { name: 'top', key: 'sk-a', priority: 10 },
      { name: 'spare', key: 'sk-b', priority: 0 },
    ]);
    const before = fake.calls.length;
    fake.serverErrorNext('generations', 502);
    const r = await stream(c.key);
    expect(r.status).toBe(200);
    expect(r.events).toEqual(['image_generation.partial_image', 'image_generation.partial_image', 'image_generation.completed']);
    expect(keysOf(callsSince(before))).toEqual(['sk-a', 'sk-b']);
    expect(await ledgerKinds(r.taskId!)).toEqual(['hold', 'capture']);
  });

  it('never fails over once a partial image reached the client: the stream ends with an error and nothing undelivered is charged', async () => {
    const c = await customer([
      { name: 'top', key: 'sk-a', priority: 10 },
      { name: 'spare', key: 'sk-b', priority: 0 },
    ]);
    const before = fake.calls.length;
    fake.streamErrorNext('generations', 1, { message: 'The server had an error while processing your request.', type: 'server_error', param: null, code: null });
    const r = await stream(c.key);
    expect(r.events).toEqual(['image_generation.partial_image', 'error']);
    expect(keysOf(callsSince(before))).toEqual(['sk-a']);
    expect(await ledgerKinds(r.taskId!)).toEqual(['hold', 'release']);
  });
});

describe('the OpenAI Images adapter through the API', () => {
  it('refuses a moderated prompt with content_policy_violation and the upstream reason, charging nothing', async () => {
    const c = await customer([{ name: 'only', key: 'sk-a' }]);
    const r = await generate(c.key, 'please moderate-me');
    expect(r.status).toBe(400);
    expect(r.body.error!.code).toBe('content_policy_violation');
    expect(r.body.error!.message).toMatch(/safety system/);
    expect(await ledgerKinds(r.taskId!)).toEqual(['hold', 'release']);
    // A refusal is about the request, not the account: no failover, no cooldown.
    expect((await membersOf(c.groupId)).only!.health).toMatchObject({ cooldown_until: null, credentials_rejected: false });
  });

  it('sends a GIF input (an upload may be one) as a PNG: OpenAI takes PNG, JPEG and WebP only', async () => {
    const c = await customer([{ name: 'only', key: 'sk-a' }]);
    const gif = await sharp({ create: { width: 256, height: 256, channels: 3, background: '#3366aa' } }).gif().toBuffer();
    const form = new FormData();
    form.append('model', IMAGE_PRO.id);
    form.append('prompt', 'brighten it');
    form.append('size', '1024x1024');
    form.append('image', new Blob([gif], { type: 'image/gif' }), 'in.gif');
    const before = fake.calls.length;
    const res = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    expect(res.status, await res.clone().text()).toBe(200);
    const [call] = callsSince(before);
    expect(call!.images.map((i) => i.mimeType)).toEqual(['image/png']);
  });

  it('sends an edit with several images and a mask as multipart image[] parts and returns the requested size', async () => {
    const c = await customer([{ name: 'only', key: 'sk-a' }]);
    const png = (color: string) => sharp({ create: { width: 1024, height: 1024, channels: 4, background: color } }).png().toBuffer();
    const form = new FormData();
    form.append('model', IMAGE_PRO.id);
    form.append('prompt', 'put them together');
    form.append('size', '1024x1024');
    for (const color of ['#ff0000', '#00ff00']) form.append('image[]', new Blob([await png(color)], { type: 'image/png' }), 'in.png');
    form.append('mask', new Blob([await png('#00000000')], { type: 'image/png' }), 'mask.png');
    const before = fake.calls.length;
    const res = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    const body = (await res.json()) as { data: { b64_json: string }[] };
    expect(res.status).toBe(200);
    const [call] = callsSince(before);
    expect(call).toMatchObject({ route: 'edits', model: 'gpt-image-1.5', apiKey: 'sk-a' });
    expect(call!.images.map((i) => i.field)).toEqual(['image[]', 'image[]']);
    expect(call!.mask).toBeDefined();
    const meta = await sharp(Buffer.from(body.data[0]!.b64_json, 'base64')).metadata();
    expect([meta.width, meta.height, meta.format]).toEqual([1024, 1024, 'png']);
  });
});

describe('a respond-async image task when its engine stops', () => {
  it('lets the upstream call in flight finish and completes the task: one call, charged once', async () => {
    const c = await customer([{ name: 'slow', key: 'sk-c' }]);
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json', Prefer: 'respond-async' },
      body: JSON.stringify({ model: IMAGE_PRO.id, prompt: 'stopped mid-way', size: '1024x1024', n: 2 }),
    });
    expect(res.status).toBe(202);
    const taskId = res.headers.get('x-task-id')!;
    fake.holdMs = 1500;
    const first = createWorkers(server.ctx);
    first.start();
    try {
      // The engine's call is in flight upstream when the engine is stopped (a graceful shutdown):
      // the stop waits for its answer (cut, it could still be billed upstream, and the next claim
      // would call again), and the step settles it.
      await until(async () => (fake.inFlightByKey['sk-c'] ?? 0) > 0 || undefined, 10_000, 'the upstream call to start');
      await first.stop();
    } finally {
      fake.holdMs = 0;
    }
    const row = await server.db.selectFrom('imageTasks').select(['status', 'delivered', 'retries']).where('id', '=', taskId).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'completed', delivered: 2, retries: 0 });
    expect(await ledgerKinds(taskId)).toEqual(['hold', 'capture']);
    expect(fake.calls.filter((call) => call.prompt === 'stopped mid-way')).toHaveLength(1);
  });
});

describe('a respond-async image task on a member with a concurrency limit', () => {
  it('resumed after its worker died during the upstream call, gives back the slot its row still names and completes on the next claim', async () => {
    const c = await customer([{ name: 'only', key: 'sk-d', concurrencyLimit: 1 }]);
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json', Prefer: 'respond-async' },
      body: JSON.stringify({ model: IMAGE_PRO.id, prompt: 'stopped on a limited member', size: '1024x1024' }),
    });
    expect(res.status).toBe(202);
    const taskId = res.headers.get('x-task-id')!;
    // The row as its dead worker left it: it names the member (its one slot counts as taken), its lease is over.
    await server.db.updateTable('imageTasks').set({ memberId: c.ids.only, memberSlots: 1, attempt: 1, leaseOwner: 'w_dead', leaseExpiresAt: new Date(Date.now() - 1000) }).where('id', '=', taskId).execute();
    const row = () => server.db.selectFrom('imageTasks').select(['status', 'delivered', 'memberId', 'retries']).where('id', '=', taskId).executeTakeFirstOrThrow();
    const second = createWorkers(server.ctx);
    second.start();
    try {
      await until(async () => ((await row()).status === 'completed' ? true : undefined), 10_000, 'the task to complete on the next claim');
    } finally {
      await second.stop();
    }
    // The cut call counts as a try (it may have been billed upstream).
    expect(await row()).toMatchObject({ status: 'completed', delivered: 1, retries: 1 });
    // The slot is free again for the member's other traffic.
    expect((await generate(c.key)).status).toBe(200);
  });
});

describe('a respond-async image task whose upstream fails for a passing reason', () => {
  async function asyncTask(key: string, prompt: string) {
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', Prefer: 'respond-async' },
      body: JSON.stringify({ model: IMAGE_PRO.id, prompt, size: '1024x1024' }),
    });
    expect(res.status).toBe(202);
    return res.headers.get('x-task-id')!;
  }
  const row = (id: string) => server.db.selectFrom('imageTasks').select(['status', 'delivered', 'retries', 'errorCode']).where('id', '=', id).executeTakeFirstOrThrow();
  const attemptsOf = async (id: string) => (await server.db.selectFrom('taskAttempts').select('outcome').where('taskId', '=', id).orderBy('id').execute()).map((a) => a.outcome);

  it.each([
    ['a 500', (n: number) => fake.serverErrorNext('generations', 500, n), 'retryable'],
    ['a 429 with Retry-After', (n: number) => fake.rateLimitNext('generations', 1, n), 'rate_limited'],
  ])('is tried again later after %s, its failed call recorded, and completes', async (_what, fail, kind) => {
    const c = await customer([{ name: 'only', key: 'sk-a' }]);
    fail(1);
    const id = await asyncTask(c.key, `passing failure ${kind}`);
    const workers = createWorkers(server.ctx);
    workers.start();
    try {
      await until(async () => ((await row(id)).status !== 'processing' ? true : undefined), 20_000, 'the task to end');
    } finally {
      await workers.stop();
    }
    expect(await row(id)).toMatchObject({ status: 'completed', delivered: 1, retries: 1 });
    expect(await attemptsOf(id)).toEqual([kind, 'ok']);
    expect(await ledgerKinds(id)).toEqual(['hold', 'capture']);
  });

  it('fails with the upstream blamed once its retries are spent', async () => {
    const c = await customer([{ name: 'only', key: 'sk-b' }]);
    fake.serverErrorNext('generations', 500, 10);
    const id = await asyncTask(c.key, 'failing every time');
    const workers = createWorkers(server.ctx);
    workers.start();
    try {
      await until(async () => ((await row(id)).status !== 'processing' ? true : undefined), 30_000, 'the task to end');
    } finally {
      await workers.stop();
      fake.faults.clear();
    }
    expect(await row(id)).toMatchObject({ status: 'failed', delivered: 0, errorCode: 'upstream_error' });
    expect(await attemptsOf(id)).toEqual(['retryable', 'retryable', 'retryable']);
    expect(await ledgerKinds(id)).toEqual(['hold', 'release']);
  });
});
