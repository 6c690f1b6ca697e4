/**
 * The `kling` adapters through the public API against the fake Kling API (test/fakes/kling.ts):
 * the shipped catalog definitions created through the admin API, members added through it, and
 * then every rule of issue 28's Kling part from a client's side — each video endpoint chosen by
 * the request's shape, creation refusing what a model cannot do before any upstream call, the pool
 * around Kling's codes (a 1302 rate limit fails over before the upstream accepted and cools the
 * member, an exhausted resource pack takes the member out until an admin updates it, a model the
 * account lacks (1103) takes it out for that model only), sticky polls, no double submit after a
 * crash (external_task_id), content-safety failures refunded, Kling images as a synchronous image
 * request, and JWT renewal while a job runs.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { KlingTokens } from '../../server/providers/kling/kling-auth.ts';
import { KlingImageProvider } from '../../server/providers/kling/kling-image.provider.ts';
import { KlingVideoProvider } from '../../server/providers/kling/kling-video.provider.ts';
import { startKlingFake, type KlingFake } from '../fakes/kling.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until, waitVideoFinished } from '../support/tasks.ts';

const VIDEO_MODELS = ['kling-v2-5-turbo-std', 'kling-v2-5-turbo-pro', 'kling-v2-6-std', 'kling-v3-std', 'kling-v3-pro', 'kling-v3-omni-std', 'kling-v1-6-pro'];
const IMAGE_MODELS = ['kling-v2-1'];

let server: TestServer;
let fake: KlingFake;
let seq = 0;

beforeAll(async () => {
  fake = await startKlingFake({
    accounts: [
      { accessKey: 'ak-a', secretKey: 'sk-a-secret' },
      { accessKey: 'ak-b', secretKey: 'sk-b-secret' },
    ],
    jobDurationMs: 300,
    durationFor: (p) => (p.includes('slow kling') ? 3_000 : undefined),
  });
  // Tokens of 4 s, renewed with 2 s left: a job of a few seconds needs more than one.
  const tokens = new KlingTokens({ ttlSeconds: 4, renewBeforeSeconds: 2 });
  server = await startTestServer({
    workers: true,
    env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000' },
    overrides: { providers: { kling: { video: new KlingVideoProvider({ pollIntervalMs: 100, tokens }), image: new KlingImageProvider({ pollIntervalMs: 50, tokens }) } } },
  });
  for (const id of [...VIDEO_MODELS, ...IMAGE_MODELS]) {
    const { response } = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(`kling/${id}`)!.model });
    expect(response.status).toBe(201);
  }
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

type Member = { name: string; ak: string; sk: string; priority?: number };

/** A customer whose group has Kling members added through the admin API (`a` first by priority). */
async function customer(members: Member[] = [{ name: 'a', ak: 'ak-a', sk: 'sk-a-secret' }], balance = 100) {
  const account = await createAccount(server.db, { balance });
  const group = await createGroup(server.db);
  const ids: Record<string, string> = {};
  for (const m of members) {
    const { data, response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: m.name, provider: 'kling', base_url: fake.url, credentials: { access_key: m.ak, secret_key: m.sk }, models: [...VIDEO_MODELS, ...IMAGE_MODELS], priority: m.priority ?? 0 },
    });
    expect(response.status).toBe(201);
    ids[m.name] = data!.id;
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, groupId: group.id, key: key.key, ids };
}

const twoMembers = () =>
  customer([
    { name: 'a', ak: 'ak-a', sk: 'sk-a-secret', priority: 10 },
    { name: 'b', ak: 'ak-b', sk: 'sk-b-secret', priority: 0 },
  ]);

type Json = Record<string, any>;

/** The task's worker is gone (its process died): another attempt takes the task over once the lease runs out. */
function loseTheWorker(id: string) {
  return server.db
    .updateTable('videoTasks')
    .set((eb) => ({ attempt: eb('attempt', '+', 1), leaseOwner: 'a-dead-worker', leaseExpiresAt: new Date(Date.now() + 500) }))
    .where('id', '=', id)
    .execute();
}

async function create(key: string, overrides: Record<string, unknown> = {}) {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `kling-${Date.now()}-${++seq}`, prompt: 'a paper boat on a river', model: 'kling-v3-std', seconds: 5, aspectRatio: '16:9', resolution: '720p', ...overrides }),
  });
  return { status: res.status, body: (await res.json()) as Json };
}

const frame = async (w = 640, h = 360) => `data:image/png;base64,${(await sharp({ create: { width: w, height: h, channels: 3, background: { r: (w * 7) % 256, g: 90, b: 160 } } }).png().toBuffer()).toString('base64')}`;

/** The fake's task of a gateway task (by its external_task_id), and the gateway's row. */
async function upstreamOf(taskId: string) {
  const row = await server.db.selectFrom('videoTasks').select(['upstreamJobId', 'memberId']).where('id', '=', taskId).executeTakeFirstOrThrow();
  const task = [...fake.tasks.values()].find((t) => t.externalTaskId === taskId);
  return { row, task };
}

/** The access keys of the requests that reached the fake for a Kling task id (submit and polls). */
function keysSeen(klingTaskId: string, externalId: string) {
  return fake.requests
    .filter((r) => r.path.endsWith(`/${klingTaskId}`) || (r.json as Json | undefined)?.external_task_id === externalId)
    .map((r) => keyOf(r.headers.authorization));
}

async function healthOf(groupId: string) {
  const { data } = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } } });
  return Object.fromEntries(data!.data.map((m) => [m.name, m.health]));
}

describe('kling videos through the public API', () => {
  it('publishes each model\'s real constraints in /v1/videos/capabilities', async () => {
    const c = await customer();
    const { data } = await server.client(c.key).GET('/v1/videos/capabilities');
    const byModel = Object.fromEntries(data!.items.map((i) => [i.model, i]));
    expect(byModel['kling-v3-pro']).toMatchObject({ durations: [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], aspectRatios: ['16:9', '9:16', '1:1'], resolutions: ['1080p'], audio: { supported: true, defaultEnabled: false }, configuredReachable: true });
    expect(byModel['kling-v2-5-turbo-std']).toMatchObject({ durations: [5, 10], resolutions: ['720p'], input: { frames: 'first-only' }, audio: { supported: false } });
    expect(byModel['kling-v3-omni-std']).toMatchObject({ input: { frames: 'first-and-optional-last', referenceImages: { maxCount: 7, configurable: true }, framesAndReferencesMutuallyExclusive: true } });
  });

  it('text-to-video: model_name and mode from the catalog model, a string duration, sound on, the task id as external_task_id; downloads and captures once', async () => {
    const c = await customer();
    const created = await create(c.key, { model: 'kling-v3-pro', seconds: 12, aspectRatio: '9:16', resolution: '1080p', generate_audio: true, negative_prompt: 'blurry' });
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    expect(task.billing).toMatchObject({ quotedCredits: 4.032, actualCredits: 4.032 });
    const { row, task: upstream } = await upstreamOf(created.body.id);
    expect(upstream!.body).toEqual({ model_name: 'kling-v3', prompt: 'a paper boat on a river', negative_prompt: 'blurry', mode: 'pro', duration: '12', aspect_ratio: '9:16', sound: 'on', external_task_id: created.body.id });
    expect(row.upstreamJobId).toBe(`text2video/${upstream!.taskId}`);
    expect(upstream!.downloads).toBe(1);
    const url = new URL(task.video_url!);
    const video = Buffer.from(await (await fetch(`${server.directUrl}${url.pathname}${url.search}`)).arrayBuffer());
    expect(video.subarray(4, 8).toString('latin1')).toBe('ftyp');
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 4_032_000 });
  });

  it('chooses each endpoint by the request\'s shape: image2video for frames, multi-image2video for references, omni-video for omni models', async () => {
    const c = await customer();
    const cases = [
      [{ model: 'kling-v3-std', firstFrame: await frame() }, 'image2video'],
      [{ model: 'kling-v2-5-turbo-pro', resolution: '1080p', firstFrame: await frame(), lastFrame: await frame(480, 480) }, 'image2video'],
      [{ model: 'kling-v1-6-pro', resolution: '1080p', seconds: 10, reference_images: [await frame(), await frame(400, 400)] }, 'multi-image2video'],
      [{ model: 'kling-v3-omni-std', seconds: 7, reference_images: [await frame(), await frame(), await frame()] }, 'omni-video'],
      [{ model: 'kling-v3-omni-std', firstFrame: await frame(), lastFrame: await frame() }, 'omni-video'],
    ] as const;
    const ids: string[] = [];
    for (const [body] of cases) {
      const created = await create(c.key, body);
      expect(created.status, JSON.stringify(created.body)).toBe(202);
      ids.push(created.body.id as string);
    }
    for (const [i, [body, endpoint]] of cases.entries()) {
      const { task } = await waitVideoFinished(server, c.key, ids[i]!);
      expect(task.status, `${body.model}: ${JSON.stringify(task.error)}`).toBe('completed');
      const { task: upstream } = await upstreamOf(ids[i]!);
      expect(upstream!.endpoint).toBe(endpoint);
      const sent = fake.requests.find((r) => r.method === 'POST' && (r.json as Json)?.external_task_id === ids[i])!.body.toString();
      // Raw base64, never a data URL.
      expect(sent).not.toContain('data:image');
    }
    const tail = (await upstreamOf(ids[1]!)).task!;
    expect([tail.image?.width, tail.imageTail?.width]).toEqual([640, 480]);
    expect((await upstreamOf(ids[2]!)).task!.imageList).toHaveLength(2);
    expect((await upstreamOf(ids[4]!)).task!.imageList.map((i) => i.type)).toEqual(['first_frame', 'end_frame']);
  });

  it('refuses at creation, before any charge or upstream call, what a model cannot do', async () => {
    const c = await customer();
    const before = fake.counts.submit;
    const refusals = [
      [{ model: 'kling-v2-5-turbo-std', firstFrame: await frame(), lastFrame: await frame() }, 'last_frame_not_supported'],
      [{ model: 'kling-v2-6-std', generate_audio: true }, 'audio_not_supported'],
      [{ model: 'kling-v3-pro', resolution: '1080p', seconds: 16 }, 'unsupported_duration'],
      [{ model: 'kling-v3-std', aspectRatio: '4:3' }, 'unsupported_aspect_ratio'],
      [{ model: 'kling-v3-std', resolution: '1080p' }, 'unsupported_resolution'],
      [{ model: 'kling-v3-omni-std', reference_images: Array.from({ length: 8 }, () => 'x') }, 'too_many_reference_images'],
      // Kling's 2,500 characters per prompt field (the contract allows more): refused here, not after the 202.
      [{ model: 'kling-v3-std', prompt: 'a'.repeat(2501) }, 'unsupported_by_upstream'],
      [{ model: 'kling-v3-std', negative_prompt: 'b'.repeat(2501) }, 'unsupported_by_upstream'],
    ] as const;
    for (const [body, code] of refusals) {
      const res = await create(c.key, body);
      expect([res.status, res.body.error?.code], JSON.stringify(body)).toEqual([400, code]);
    }
    expect(fake.counts.submit).toBe(before);
    expect(await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  });

  it('a content-safety failure fails the task with content_policy_violation and refunds it, at submit (1301) and after it (risk control)', async () => {
    const c = await customer();
    for (const prompt of ['kling-block this', 'kling-risk this']) {
      const created = await create(c.key, { prompt });
      const { task } = await waitVideoFinished(server, c.key, created.body.id);
      expect([task.status, task.error?.code], prompt).toEqual(['failed', 'content_policy_violation']);
      expect(task.error!.message.length).toBeGreaterThan(10);
      expect(task.billing).toMatchObject({ actualCredits: 0 });
      expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
    }
  });

  it('a Kling 2.6 first and last frame with audio fails before any upstream call, refunded', async () => {
    const c = await customer();
    await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition('kling/kling-v2-6-pro')!.model });
    await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', { params: { path: { group_id: c.groupId, member_id: c.ids.a! } }, body: { models: [...VIDEO_MODELS, 'kling-v2-6-pro'] } });
    const before = fake.counts.submit;
    const created = await create(c.key, { model: 'kling-v2-6-pro', resolution: '1080p', firstFrame: await frame(), lastFrame: await frame(), generate_audio: true });
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error?.code]).toEqual(['failed', 'upstream_rejected']);
    expect(task.error!.message).toContain('without audio');
    expect(fake.counts.submit).toBe(before);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });
});

describe('kling members in the pool', () => {
  it('fails a 1302 rate limit over to the second member before the upstream accepted, cools the first, polls stick to the second, billed once', async () => {
    const c = await twoMembers();
    // Kling documents no Retry-After; one an edge sends is the member's cooldown.
    fake.rateLimitNext('submit', 30, { retryAfter: true });
    const created = await create(c.key);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    const { row, task: upstream } = await upstreamOf(created.body.id);
    expect(row.memberId).toBe(c.ids.b);
    expect(upstream!.accessKey).toBe('ak-b');
    // The refused submit was a's; the accepted one and every poll b's.
    const [refused, ...accepted] = keysSeen(upstream!.taskId, created.body.id);
    expect([refused, accepted.length > 1, new Set(accepted)]).toEqual(['ak-a', true, new Set(['ak-b'])]);
    const health = await healthOf(c.groupId);
    expect(health.a!.cooldown_reason).toBe('rate_limited');
    expect(new Date(health.a!.cooldown_until!).getTime()).toBeGreaterThan(Date.now() + 20_000);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.body.id).orderBy('id').execute();
    expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
  });

  it('takes a member whose resource pack is used up (1102) out until an admin updates it; the other serves meanwhile', async () => {
    const c = await twoMembers();
    fake.setResourcePack('ak-a', 'exhausted');
    try {
      const first = await create(c.key);
      expect((await waitVideoFinished(server, c.key, first.body.id)).task.status).toBe('completed');
      expect((await upstreamOf(first.body.id)).row.memberId).toBe(c.ids.b);
      const health = await healthOf(c.groupId);
      expect(health.a!.account_disabled).toEqual({ reason: expect.stringContaining("resource pack is used up or expired (Kling 1102"), since: expect.any(String) });

      // Out: the next task goes to b without asking a.
      const submitsOfA = () => fake.requests.filter((r) => r.method === 'POST' && keyOf(r.headers.authorization) === 'ak-a').length;
      const aBefore = submitsOfA();
      const second = await create(c.key);
      expect((await waitVideoFinished(server, c.key, second.body.id)).task.status).toBe('completed');
      expect((await upstreamOf(second.body.id)).row.memberId).toBe(c.ids.b);
      expect(submitsOfA()).toBe(aBefore);

      // The operator tops the account up and updates the member: it serves again.
      fake.setResourcePack('ak-a', 'ok');
      const patched = await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', { params: { path: { group_id: c.groupId, member_id: c.ids.a! } }, body: { enabled: true } });
      expect(patched.data!.health.account_disabled).toBeNull();
      const third = await create(c.key);
      expect((await waitVideoFinished(server, c.key, third.body.id)).task.status).toBe('completed');
      expect((await upstreamOf(third.body.id)).row.memberId).toBe(c.ids.a);
    } finally {
      fake.setResourcePack('ak-a', 'ok');
    }
  });

  it('leaves a member whose account lacks a model (1103) out for that model only, with no expiry; its other models keep working', async () => {
    const c = await twoMembers();
    fake.permitModels('ak-a', ['kling-v3', 'kling-v2-5-turbo']);
    try {
      const omni = await create(c.key, { model: 'kling-v3-omni-std' });
      expect((await waitVideoFinished(server, c.key, omni.body.id)).task.status).toBe('completed');
      expect((await upstreamOf(omni.body.id)).row.memberId).toBe(c.ids.b);
      const faults = (await healthOf(c.groupId)).a!.model_faults;
      expect(faults).toEqual([{ model: 'kling-v3-omni-std', kind: 'model_not_open', reason: expect.stringContaining('HTTP 403 1103'), since: expect.any(String), until: null }]);
      expect((await healthOf(c.groupId)).a!.account_disabled).toBeNull();

      const plain = await create(c.key, { model: 'kling-v3-std' });
      expect((await waitVideoFinished(server, c.key, plain.body.id)).task.status).toBe('completed');
      expect((await upstreamOf(plain.body.id)).row.memberId).toBe(c.ids.a);
    } finally {
      fake.permitModels('ak-a', undefined);
    }
  });

  it('never submits twice: a worker lost after Kling created the task looks it up by its external_task_id on the resubmit, and the task Kling has is taken', async () => {
    const c = await customer();
    fake.delayAnswerNext('submit', 2_000);
    const created = await create(c.key);
    await until(() => [...fake.tasks.values()].some((t) => t.externalTaskId === created.body.id), 10_000, 'the task at Kling');
    // The worker loses the task before the answer arrives (as when its process dies).
    await loseTheWorker(created.body.id);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    // The resubmit found the task before creating anything.
    const submits = fake.requests.filter((r) => r.method === 'POST' && (r.json as Json)?.external_task_id === created.body.id);
    expect(submits).toHaveLength(1);
    expect(fake.requests.some((r) => r.method === 'GET' && r.query.get('external_task_id') === created.body.id && r.receivedAt > submits[0]!.receivedAt)).toBe(true);
    expect([...fake.tasks.values()].filter((t) => t.externalTaskId === created.body.id)).toHaveLength(1);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.body.id).orderBy('id').execute();
    expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
  });

  it('a resubmit whose lookup of the taken external_task_id is rate-limited asks the same member again: the task Kling has completes, billed once', async () => {
    const c = await customer();
    fake.delayAnswerNext('submit', 2_000);
    const created = await create(c.key);
    await until(() => [...fake.tasks.values()].some((t) => t.externalTaskId === created.body.id), 10_000, 'the task at Kling');
    // The resubmit's lookup is the next query Kling gets: rate-limited.
    fake.rateLimitNext('poll', 1);
    await loseTheWorker(created.body.id);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    // The rate-limited lookup, then the one that found the task; nothing created again.
    const lookups = fake.requests.filter((r) => r.method === 'GET' && r.query.get('external_task_id') === created.body.id);
    expect(lookups.length).toBeGreaterThanOrEqual(2);
    expect(new Set(lookups.map((r) => keyOf(r.headers.authorization)))).toEqual(new Set(['ak-a']));
    const submits = fake.requests.filter((r) => r.method === 'POST' && (r.json as Json)?.external_task_id === created.body.id);
    expect(submits).toHaveLength(1);
    expect([...fake.tasks.values()].filter((t) => t.externalTaskId === created.body.id)).toHaveLength(1);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.body.id).orderBy('id').execute();
    expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
  });

  it('a resubmit whose create Kling would refuse first for the resource pack the first task used up (1102) takes the task Kling has: completed, billed once', async () => {
    const c = await customer();
    fake.delayAnswerNext('submit', 2_000);
    const created = await create(c.key);
    await until(() => [...fake.tasks.values()].some((t) => t.externalTaskId === created.body.id), 10_000, 'the task at Kling');
    fake.setResourcePack('ak-a', 'exhausted');
    try {
      await loseTheWorker(created.body.id);
      const { task } = await waitVideoFinished(server, c.key, created.body.id);
      expect(task.status).toBe('completed');
      expect(fake.requests.filter((r) => r.method === 'POST' && (r.json as Json)?.external_task_id === created.body.id)).toHaveLength(1);
      expect([...fake.tasks.values()].filter((t) => t.externalTaskId === created.body.id)).toHaveLength(1);
      const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.body.id).orderBy('id').execute();
      expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
    } finally {
      fake.setResourcePack('ak-a', 'ok');
    }
  });

  it('renews the member\'s JWT while a job runs: several tokens, each received before its exp, none refused', async () => {
    const c = await customer([{ name: 'a', ak: 'ak-a', sk: 'sk-a-secret' }]);
    const since = Date.now();
    const refusals = fake.authRefusals.length;
    const created = await create(c.key, { prompt: 'a slow kling shot' });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    const seen = fake.tokens.filter((t) => t.iss === 'ak-a' && t.receivedAt >= since);
    expect(new Set(seen.map((t) => t.token)).size).toBeGreaterThanOrEqual(2);
    for (const t of seen) expect(t.receivedAt / 1000).toBeLessThan(t.exp);
    expect(fake.authRefusals.slice(refusals)).toEqual([]);
  });
});

describe('kling images', () => {
  it('runs Kling\'s asynchronous image task within a synchronous request: n images of the asked size, charged n times', async () => {
    const c = await customer();
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'kling-v2-1', prompt: 'a lighthouse at dawn', n: 2, aspectRatio: '16:9', resolution: '2K' }),
    });
    const body = (await res.json()) as Json;
    expect(res.status, JSON.stringify(body)).toBe(200);
    expect(body.data).toHaveLength(2);
    for (const item of body.data as Json[]) expect(await sharp(Buffer.from(item.b64_json, 'base64')).metadata()).toMatchObject({ width: 2048, height: 1152, format: 'png' });
    const upstream = [...fake.tasks.values()].find((t) => t.kind === 'image' && t.prompt === 'a lighthouse at dawn')!;
    // external_task_id: what a submit without an answer is looked up by (kling-image-once.test.ts).
    expect(upstream.body).toEqual({ model_name: 'kling-v2-1', prompt: 'a lighthouse at dawn', n: 2, aspect_ratio: '16:9', resolution: '2k', external_task_id: expect.any(String) });
    expect(upstream.externalTaskId).toBe(upstream.body.external_task_id);
    expect(upstream.downloads).toBe(2);
    expect(await holdOf(server.db, res.headers.get('x-task-id')!)).toMatchObject({ status: 'captured', captured: 28_000 });
  });

  it('answers a content-safety refusal as content_policy_violation and charges nothing', async () => {
    const c = await customer();
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'kling-v2-1', prompt: 'kling-block me' }),
    });
    const body = (await res.json()) as Json;
    expect([res.status, body.error.code]).toEqual([400, 'content_policy_violation']);
    expect(await holdOf(server.db, res.headers.get('x-task-id')!)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('keeps polling through a rate-limited status call and still delivers', async () => {
    const c = await customer();
    fake.rateLimitNext('image-poll', 0, { times: 2 });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'kling-v2-1', prompt: 'a patient lighthouse' }),
    });
    expect(res.status).toBe(200);
    expect([...fake.tasks.values()].filter((t) => t.prompt === 'a patient lighthouse')).toHaveLength(1);
  });
});

/** The access key (the JWT's `iss`) a request was signed for. */
function keyOf(authorization: string | string[] | undefined): string {
  return JSON.parse(Buffer.from(String(authorization).split('.')[1]!, 'base64url').toString()).iss as string;
}
