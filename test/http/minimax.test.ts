/**
 * The `minimax` adapter through the public API against the fake MiniMax platform
 * (test/fakes/minimax.ts): the shipped catalog definitions created through the admin API and
 * members added through it, two per customer where the pool matters. From a client's side: v1
 * bodies (MiniMax's spelling and tiers, the optimizer and the watermark off), first and last frames
 * and S2V's subject, MiniMax-H3 on v2, creation refusing what a model cannot do before any upstream
 * call, the rules a definition cannot state refunded without a call, MiniMax's codes at HTTP 200
 * (1002 failover and cooldown before the upstream accepted, 1008 an account out until an admin
 * acts, 2061 a model outside the plan, 1026/1027 refunded as content-policy failures, 2013 refunded
 * with MiniMax's reason for the operator), sticky polls, and a download link that expired.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { startMiniMaxFake, type MiniMaxFake, type MiniMaxFakeTask } from '../fakes/minimax.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until, waitVideoFinished } from '../support/tasks.ts';

const MODELS = ['minimax-hailuo-2.3', 'minimax-hailuo-2.3-fast', 'minimax-hailuo-02', 's2v-01', 'minimax-h3'];

let server: TestServer;
let fake: MiniMaxFake;
let seq = 0;

beforeAll(async () => {
  fake = await startMiniMaxFake({ apiKeys: ['mm-a', 'mm-b'], queueMs: 60, jobDurationMs: 300 });
  server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000' } });
  // The shipped definitions, as `npm run admin -- models create --from minimax/<model>` creates them.
  for (const id of MODELS) {
    const { response } = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(`minimax/${id}`)!.model });
    expect(response.status).toBe(201);
  }
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});
beforeEach(() => {
  fake.faults.clear();
  fake.urlTtlMs = 9 * 3_600_000;
});

type Member = { name: string; key: string; priority?: number; models?: string[]; modelMap?: Record<string, string> };

/** A customer whose group has MiniMax members added through the admin API (`a` first by priority). */
async function customer(members: Member[] = [{ name: 'a', key: 'mm-a' }], balance = 100) {
  const account = await createAccount(server.db, { balance });
  const group = await createGroup(server.db);
  const ids: Record<string, string> = {};
  for (const m of members) {
    const { data, response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: m.name, provider: 'minimax', base_url: fake.url, credentials: { api_key: m.key }, models: m.models ?? MODELS, priority: m.priority ?? 0, ...(m.modelMap && { model_map: m.modelMap }) },
    });
    expect(response.status).toBe(201);
    ids[m.name] = data!.id;
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, groupId: group.id, key: key.key, ids };
}

const twoMembers = () =>
  customer([
    { name: 'a', key: 'mm-a', priority: 10 },
    { name: 'b', key: 'mm-b', priority: 0 },
  ]);

type Json = Record<string, any>;

async function create(key: string, overrides: Record<string, unknown> = {}) {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `minimax-${Date.now()}-${++seq}`, prompt: 'a paper boat on a river', model: 'minimax-hailuo-2.3', seconds: 6, aspectRatio: '16:9', resolution: '768p', ...overrides }),
  });
  return { status: res.status, body: (await res.json()) as Json };
}

const frame = async (w = 640, h = 360) => `data:image/png;base64,${(await sharp({ create: { width: w, height: h, channels: 3, background: { r: (w * 7) % 256, g: 90, b: 160 } } }).png().toBuffer()).toString('base64')}`;
const micro = (credits: number) => Math.round(credits * 1_000_000);

/** The fake's task of a gateway task (once its job id is saved), and the gateway's row. */
async function upstreamOf(taskId: string): Promise<{ row: { upstreamJobId: string | null; memberId: string | null }; task: MiniMaxFakeTask }> {
  const row = await until(async () => {
    const r = await server.db.selectFrom('videoTasks').select(['upstreamJobId', 'memberId']).where('id', '=', taskId).executeTakeFirstOrThrow();
    return r.upstreamJobId ? r : undefined;
  }, 10_000, 'the upstream job id');
  const task = fake.tasks.get(row.upstreamJobId!.replace(/^v[12]\//, ''));
  if (!task) throw new Error(`no MiniMax task for ${row.upstreamJobId}`);
  return { row, task };
}

/** The API keys of the requests that reached the fake for one MiniMax task (its submit and polls). */
function keysSeen(task: MiniMaxFakeTask) {
  return fake.requests.filter((r) => r.query.get('task_id') === task.id || r.path.endsWith(`/${task.id}`)).map((r) => r.headers.authorization?.slice('Bearer '.length));
}

const submitsBy = (key: string) => fake.requests.filter((r) => r.method === 'POST' && r.headers.authorization === `Bearer ${key}`).length;

async function healthOf(groupId: string) {
  const { data } = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } } });
  return Object.fromEntries(data!.data.map((m) => [m.name, m.health]));
}

async function download(videoUrl: string) {
  const url = new URL(videoUrl);
  return Buffer.from(await (await fetch(`${server.directUrl}${url.pathname}${url.search}`)).arrayBuffer());
}

describe('minimax videos through the public API', () => {
  it('publishes each model\'s real constraints in /v1/videos/capabilities', async () => {
    const c = await customer();
    const { data } = await server.client(c.key).GET('/v1/videos/capabilities');
    const byModel = Object.fromEntries(data!.items.map((i) => [i.model, i]));
    expect(byModel['minimax-hailuo-2.3']).toMatchObject({ durations: [6, 10], aspectRatios: ['16:9'], resolutions: ['768p', '1080p'], durationConstraints: [{ when: { resolutions: ['1080p'] }, durations: [6] }], input: { frames: 'first-only' }, audio: { supported: false }, configuredReachable: true });
    expect(byModel['minimax-hailuo-02']).toMatchObject({ resolutions: ['512p', '768p', '1080p'], input: { frames: 'first-and-optional-last' } });
    expect(byModel['s2v-01']).toMatchObject({ durations: [6], resolutions: ['720p'], input: { frames: 'none', referenceImages: { maxCount: 1, configurable: false } } });
    expect(byModel['minimax-h3']).toMatchObject({ durations: [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], resolutions: ['768p', '2k'], audio: { supported: true, defaultEnabled: true }, input: { referenceImages: { maxCount: 9, configurable: true } } });
  });

  it('text to video on v1: MiniMax\'s spelling and tier, the optimizer and the watermark off; the file looked up and downloaded without the key; charged once', async () => {
    const c = await customer();
    const created = await create(c.key, { seconds: 10 });
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    const { row, task: upstream } = await upstreamOf(created.body.id);
    expect(row.upstreamJobId).toBe(`v1/${upstream.id}`);
    expect(upstream.body).toEqual({ model: 'MiniMax-Hailuo-2.3', prompt: 'a paper boat on a river', duration: 10, resolution: '768P', prompt_optimizer: false, aigc_watermark: false });
    expect([upstream.retrieves, upstream.downloads]).toEqual([1, 1]);
    expect(fake.cdnSawAuth).toBe(0);
    expect((await download(task.video_url!)).subarray(4, 8).toString('latin1')).toBe('ftyp');
    expect(task.billing).toMatchObject({ quotedCredits: 0.56, actualCredits: 0.56 });
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.body.id).orderBy('id').execute();
    expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
  });

  it('sends a first and last frame (Hailuo 02) and a subject reference (S2V-01) as the images they are', async () => {
    const c = await customer();
    const pair = await create(c.key, { model: 'minimax-hailuo-02', resolution: '1080p', firstFrame: await frame(), lastFrame: await frame(480, 480) });
    const subject = await create(c.key, { model: 's2v-01', resolution: '720p', referenceImages: [await frame(512, 768)] });
    for (const created of [pair, subject]) {
      expect(created.status, JSON.stringify(created.body)).toBe(202);
      expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    }
    const a = (await upstreamOf(pair.body.id)).task;
    expect(a.images.map((i) => `${i.role} ${i.form} ${i.mimeType} ${i.width}x${i.height}`)).toEqual(['first_frame data image/png 640x360', 'last_frame data image/png 480x480']);
    expect(a.body).toMatchObject({ model: 'MiniMax-Hailuo-02', resolution: '1080P', duration: 6 });
    const b = (await upstreamOf(subject.body.id)).task;
    expect(b.body).toMatchObject({ model: 'S2V-01', resolution: '720P', duration: 6, subject_reference: [{ type: 'character', image: [{ role: 'subject', width: 512, height: 768 }] }] });
    expect(await holdOf(server.db, subject.body.id)).toMatchObject({ status: 'captured', captured: micro(0.65) });
  });

  it('runs MiniMax-H3 on v2: content roles, ratio, 2K, audio always on; the recorded result link downloaded', async () => {
    const c = await customer();
    const refs = await create(c.key, { model: 'minimax-h3', seconds: 12, resolution: '2k', aspectRatio: '9:16', referenceImages: [await frame(), await frame(400, 400)] });
    const frames = await create(c.key, { model: 'minimax-h3', seconds: 4, resolution: '768p', firstFrame: await frame(), lastFrame: await frame() });
    for (const created of [refs, frames]) expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    const { row, task: a } = await upstreamOf(refs.body.id);
    expect(row.upstreamJobId).toBe(`v2/${a.id}`);
    const { content, ...params } = a.body as { content: Json[] };
    expect(params).toEqual({ model: 'MiniMax-H3', resolution: '2K', duration: 12, ratio: '9:16', aigc_watermark: false });
    expect(content.map((i) => i.role ?? i.type)).toEqual(['text', 'reference_image', 'reference_image']);
    expect((await upstreamOf(frames.body.id)).task.images.map((i) => i.role)).toEqual(['first_frame', 'last_frame']);
    expect(a.downloads).toBe(1);
    expect(await holdOf(server.db, refs.body.id)).toMatchObject({ status: 'captured', captured: 12 * micro(0.113) });
  });

  it('refuses at creation, before any charge or upstream call, what a model cannot do', async () => {
    const c = await customer();
    const before = fake.counts.submit;
    const refusals: [Record<string, unknown>, string][] = [
      [{ resolution: '1080p', seconds: 10 }, 'unsupported_duration'],
      [{ seconds: 5 }, 'unsupported_duration'],
      [{ aspectRatio: '9:16' }, 'unsupported_aspect_ratio'],
      [{ resolution: '720p' }, 'unsupported_resolution'],
      [{ firstFrame: await frame(), lastFrame: await frame() }, 'last_frame_not_supported'],
      [{ referenceImages: [await frame()] }, 'too_many_reference_images'],
      [{ generate_audio: true }, 'audio_not_supported'],
      [{ model: 'minimax-h3', seconds: 5, generate_audio: false }, 'audio_always_on'],
      [{ model: 's2v-01', resolution: '720p', referenceImages: [await frame(), await frame()] }, 'too_many_reference_images'],
      [{ model: 'minimax-h3', seconds: 16 }, 'unsupported_duration'],
      [{ negative_prompt: 'rain' }, 'unsupported_by_upstream'],
      [{ model: 'minimax-h3', seconds: 5, prompt: 'a'.repeat(7001) }, 'unsupported_by_upstream'],
    ];
    for (const [body, code] of refusals) {
      const res = await create(c.key, body);
      expect([res.status, res.body.error?.code], JSON.stringify(body).slice(0, 120)).toEqual([400, code]);
    }
    expect(fake.counts.submit).toBe(before);
    expect(await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  });

  it('refuses at creation, nothing held, a prompt over 2,000 characters on a v1 model, and takes it on H3 (7,000)', async () => {
    const c = await customer();
    const before = fake.counts.submit;
    const prompt = 'a paper boat drifting '.repeat(114).slice(0, 2500);
    const v1 = await create(c.key, { prompt });
    expect([v1.status, v1.body.error?.code, v1.body.error?.message]).toEqual([
      400,
      'unsupported_by_upstream',
      "Model 'minimax-hailuo-2.3' runs on an upstream that accepts prompts of at most 2000 characters on MiniMax-Hailuo-2.3; change the request.",
    ]);
    expect(fake.counts.submit).toBe(before);
    expect(await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);

    const h3 = await create(c.key, { model: 'minimax-h3', seconds: 5, prompt });
    expect(h3.status, JSON.stringify(h3.body)).toBe(202);
    expect((await waitVideoFinished(server, c.key, h3.body.id)).task.status).toBe('completed');
    expect(((await upstreamOf(h3.body.id)).task.body as { content: Json[] }).content[0]).toEqual({ type: 'text', text: prompt });
  });

  it('takes a long prompt on a catalog model of the operator\'s own id that its members map to H3 (the id is no MiniMax model: the members decide)', async () => {
    const { response } = await server.admin().POST('/admin/v1/models', { body: { ...findCatalogDefinition('minimax/minimax-h3')!.model, id: 'acme-h3', display_name: 'Acme H3' } });
    expect(response.status).toBe(201);
    const c = await customer([{ name: 'a', key: 'mm-a', models: ['acme-h3'], modelMap: { 'acme-h3': 'MiniMax-H3' } }]);
    const prompt = 'a paper boat drifting '.repeat(140).slice(0, 3000);
    const created = await create(c.key, { model: 'acme-h3', seconds: 5, prompt });
    expect(created.status, JSON.stringify(created.body)).toBe(202);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect(((await upstreamOf(created.body.id)).task.body as { model: string; content: Json[] })).toMatchObject({ model: 'MiniMax-H3', content: [{ type: 'text', text: prompt }] });
  });

  it('refuses at creation, nothing held, a prompt the only member\'s own v1 model cannot take under an operator\'s id that is no MiniMax model', async () => {
    const { response } = await server.admin().POST('/admin/v1/models', { body: { ...findCatalogDefinition('minimax/minimax-hailuo-02')!.model, id: 'hailuo', display_name: 'Hailuo' } });
    expect(response.status).toBe(201);
    const c = await customer([{ name: 'a', key: 'mm-a', models: ['hailuo'], modelMap: { hailuo: 'MiniMax-Hailuo-02' } }]);
    const before = fake.counts.submit;
    const refused = await create(c.key, { model: 'hailuo', prompt: 'a paper boat drifting '.repeat(140).slice(0, 3000) });
    expect([refused.status, refused.body.error?.code, refused.body.error?.message]).toEqual([
      400,
      'unsupported_by_upstream',
      "Model 'hailuo' runs on an upstream that accepts prompts of at most 2000 characters on MiniMax-Hailuo-02; change the request.",
    ]);
    expect(fake.counts.submit).toBe(before);
    expect(await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  });

  it('takes a prompt over 2,000 characters on a v1 catalog id that every member maps to H3 (7,000)', async () => {
    const toH3 = { 'minimax-hailuo-2.3': 'MiniMax-H3' };
    const c = await customer([
      { name: 'a', key: 'mm-a', priority: 10, modelMap: toH3 },
      { name: 'b', key: 'mm-b', priority: 0, modelMap: toH3 },
    ]);
    const prompt = 'a paper boat drifting '.repeat(230).slice(0, 5000);
    const created = await create(c.key, { prompt });
    expect(created.status, JSON.stringify(created.body)).toBe(202);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect(((await upstreamOf(created.body.id)).task.body as { model: string; content: Json[] })).toMatchObject({ model: 'MiniMax-H3', content: [{ type: 'text', text: prompt }] });
  });

  it('fails and refunds, without calling MiniMax, what a definition cannot refuse: a text-only image-to-video model, 512p without a frame', async () => {
    const c = await customer();
    const before = fake.counts.submit;
    const fast = await create(c.key, { model: 'minimax-hailuo-2.3-fast' });
    const low = await create(c.key, { model: 'minimax-hailuo-02', resolution: '512p' });
    const a = (await waitVideoFinished(server, c.key, fast.body.id)).task;
    expect([a.status, a.error?.code, a.error?.message]).toEqual(['failed', 'upstream_rejected', 'MiniMax accepts a first frame on its image-to-video model MiniMax-Hailuo-2.3-Fast.']);
    const b = (await waitVideoFinished(server, c.key, low.body.id)).task;
    expect([b.status, b.error?.message]).toEqual(['failed', expect.stringContaining('512p on MiniMax-Hailuo-02 only from a first frame')]);
    expect(fake.counts.submit).toBe(before);
    for (const id of [fast.body.id, low.body.id]) expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('turns the prompt optimizer on for a catalog model whose upstream id asks for it', async () => {
    const body = { ...findCatalogDefinition('minimax/minimax-hailuo-2.3')!.model, id: 'minimax-hailuo-2.3-prompt-optimizer', display_name: 'Hailuo 2.3 (optimized prompts)' };
    expect((await server.admin().POST('/admin/v1/models', { body })).response.status).toBe(201);
    const c = await customer([{ name: 'a', key: 'mm-a', models: ['minimax-hailuo-2.3-prompt-optimizer'] }]);
    const created = await create(c.key, { model: 'minimax-hailuo-2.3-prompt-optimizer' });
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await upstreamOf(created.body.id)).task.body).toMatchObject({ model: 'MiniMax-Hailuo-2.3', prompt_optimizer: true });
  });

  it('fails a content refusal at submit (1026) and after it (1027) with content_policy_violation, refunded', async () => {
    const c = await customer();
    for (const prompt of ['a storm [minimax:sensitive]', 'a storm [minimax:sensitive-output]']) {
      const created = await create(c.key, { prompt });
      const { task } = await waitVideoFinished(server, c.key, created.body.id);
      expect([task.status, task.error?.code, task.error?.message], prompt).toEqual(['failed', 'content_policy_violation', expect.stringMatching(/^MiniMax refused the (prompt or an input image|generated video) under its content policy \(MiniMax 102[67]: (in|out)put new_sensitive\)\.$/)]);
      expect(task.billing).toMatchObject({ actualCredits: 0 });
      expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
    }
    // A refusal is about the request, not the member.
    expect((await healthOf(c.groupId)).a).toMatchObject({ cooldown_until: null, account_disabled: null, credentials_rejected: false });
  });

  it('fails invalid parameters (2013) refunded, with MiniMax\'s reason for the client and the operator', async () => {
    const c = await customer();
    // MiniMax wants the short side of a frame over 300 px.
    const created = await create(c.key, { firstFrame: await frame(300, 300) });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    const reason = 'MiniMax rejected the request as invalid (MiniMax 2013: invalid params, first_frame_image of 300x300 px: the short side must be greater than 300 px).';
    expect([task.status, task.error?.code, task.error?.message]).toEqual(['failed', 'upstream_rejected', reason]);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
    const { data } = await server.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: created.body.id } } });
    expect(data).toMatchObject({ status: 'failed', error: { message: reason }, captured_credits: 0 });
  });

  it('fails and refunds a task whose download link expired before it was fetched', async () => {
    const c = await customer();
    // Every link MiniMax signs is dead at once (as 9 hours later).
    fake.urlTtlMs = 0;
    const created = await create(c.key);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error?.code, task.error?.message]).toEqual(['failed', 'upstream_error', "The upstream's link to the video expired before it was downloaded."]);
    const { task: upstream } = await upstreamOf(created.body.id);
    // The status is not asked again once the job succeeded: only the download failed.
    expect([upstream.retrieves, upstream.downloads]).toEqual([1, 0]);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });
});

describe('minimax members in the pool', () => {
  it('fails a 1002 rate limit over to the second member before MiniMax accepted, cools the first, polls stick to the second, billed once', async () => {
    const c = await twoMembers();
    fake.rateLimitNext('submit');
    const created = await create(c.key);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    const { row, task: upstream } = await upstreamOf(created.body.id);
    expect([row.memberId, upstream.apiKey]).toEqual([c.ids.b, 'mm-b']);
    const seen = keysSeen(upstream);
    expect([seen.length > 1, new Set(seen)]).toEqual([true, new Set(['mm-b'])]);
    const health = await healthOf(c.groupId);
    expect(health.a!).toMatchObject({ cooldown_reason: 'rate_limited', last_error: 'rate limit' });
    // No Retry-After at HTTP 200: the pool's first backoff, a second.
    expect(Date.parse(health.a!.cooldown_until!) - Date.now()).toBeLessThanOrEqual(1000);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.body.id).orderBy('id').execute();
    expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
  });

  it('takes a member whose balance is used up (1008) out until an admin updates it; the other serves meanwhile', async () => {
    const c = await twoMembers();
    fake.setBalance('mm-a', 'empty');
    try {
      const first = await create(c.key);
      expect((await waitVideoFinished(server, c.key, first.body.id)).task.status).toBe('completed');
      expect((await upstreamOf(first.body.id)).row.memberId).toBe(c.ids.b);
      expect((await healthOf(c.groupId)).a!.account_disabled).toEqual({ reason: "the MiniMax account's balance is used up (MiniMax 1008: insufficient balance)", since: expect.any(String) });

      const aBefore = submitsBy('mm-a');
      const second = await create(c.key);
      expect((await waitVideoFinished(server, c.key, second.body.id)).task.status).toBe('completed');
      expect((await upstreamOf(second.body.id)).row.memberId).toBe(c.ids.b);
      expect(submitsBy('mm-a')).toBe(aBefore);

      // The operator tops the account up and updates the member: it serves again.
      fake.setBalance('mm-a', 'ok');
      const patched = await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', { params: { path: { group_id: c.groupId, member_id: c.ids.a! } }, body: { enabled: true } });
      expect(patched.data!.health.account_disabled).toBeNull();
      const third = await create(c.key);
      expect((await waitVideoFinished(server, c.key, third.body.id)).task.status).toBe('completed');
      expect((await upstreamOf(third.body.id)).row.memberId).toBe(c.ids.a);
    } finally {
      fake.setBalance('mm-a', 'ok');
    }
  });

  it('leaves a member whose plan lacks a model (2061) out for that model only, with no expiry; its other models keep working', async () => {
    const c = await twoMembers();
    fake.permitModels('mm-a', ['MiniMax-Hailuo-2.3']);
    try {
      const h3 = await create(c.key, { model: 'minimax-h3', seconds: 5 });
      expect((await waitVideoFinished(server, c.key, h3.body.id)).task.status).toBe('completed');
      expect((await upstreamOf(h3.body.id)).row.memberId).toBe(c.ids.b);
      const health = (await healthOf(c.groupId)).a!;
      expect(health.model_faults).toEqual([{ model: 'minimax-h3', kind: 'model_not_open', reason: expect.stringContaining('2061'), since: expect.any(String), until: null }]);
      expect(health).toMatchObject({ account_disabled: null, cooldown_until: null, credentials_rejected: false });

      const plain = await create(c.key);
      expect((await waitVideoFinished(server, c.key, plain.body.id)).task.status).toBe('completed');
      expect((await upstreamOf(plain.body.id)).row.memberId).toBe(c.ids.a);
    } finally {
      fake.permitModels('mm-a', undefined);
    }
  });

  it('routes a prompt a member\'s own v1 model cannot take to a member whose model can; with none left, refused at creation', async () => {
    // Member a runs the catalog's H3 as Hailuo 2.3 (its model map): each member is judged by its own model.
    const mapped = { name: 'a', key: 'mm-a', priority: 10, modelMap: { 'minimax-h3': 'MiniMax-Hailuo-2.3' } };
    const prompt = 'a paper boat drifting '.repeat(114).slice(0, 2500);
    const c = await customer([mapped, { name: 'b', key: 'mm-b', priority: 0 }]);
    const aBefore = submitsBy('mm-a');
    const created = await create(c.key, { model: 'minimax-h3', seconds: 5, prompt });
    expect(created.status, JSON.stringify(created.body)).toBe(202);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    const { row, task: upstream } = await upstreamOf(created.body.id);
    expect([row.memberId, upstream.apiKey, (upstream.body as { model: string }).model]).toEqual([c.ids.b, 'mm-b', 'MiniMax-H3']);
    expect(submitsBy('mm-a')).toBe(aBefore);

    const alone = await customer([mapped]);
    const refused = await create(alone.key, { model: 'minimax-h3', seconds: 5, prompt });
    expect([refused.status, refused.body.error?.code, refused.body.error?.message]).toEqual([
      400,
      'unsupported_by_upstream',
      "Model 'minimax-h3' runs on an upstream that accepts prompts of at most 2000 characters on MiniMax-Hailuo-2.3; change the request.",
    ]);
    expect(submitsBy('mm-a')).toBe(aBefore);
    expect(await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', alone.accountId).execute()).toEqual([]);
  });

  it('takes a member whose key MiniMax refuses (2049) out until an admin updates it', async () => {
    const c = await customer([
      { name: 'a', key: 'mm-revoked', priority: 10 },
      { name: 'b', key: 'mm-b', priority: 0 },
    ]);
    const created = await create(c.key);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await upstreamOf(created.body.id)).row.memberId).toBe(c.ids.b);
    const health = (await healthOf(c.groupId)).a!;
    expect(health.credentials_rejected).toBe(true);
    expect(health.last_error).toBe("MiniMax refused the account's API key (MiniMax 2049: invalid api key)");
  });
});
