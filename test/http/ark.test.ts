/**
 * The `ark` adapters through the public API against the fake ModelArk (test/fakes/ark.ts), with the
 * shipped catalog definitions created through the admin API and members added through it as an
 * operator would: Seedream sizes, edits, batches for `n`, `data[]` mixing images and per-image
 * errors (only delivered images charged), the upstream's stream relayed image by image, the
 * member's watermark option, Volcengine ids through the model map; Seedance frames and references,
 * the catalog's refusals before any upstream call, failed, expired and cancelled tasks, a result URL
 * that expired before its download, the deadline's cancel; and the pool around them: failover
 * between two Ark members on a 429, an overdue account, a member whose account has not activated
 * one model (or may not use it: a service not open, a paused model, a used-up free trial), Ark's
 * failed risk-detection service, and a queued-task limit.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { startArkFake, type ArkFake } from '../fakes/ark.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until, waitVideoFinished } from '../support/tasks.ts';

const SEEDREAM_40 = 'seedream-4-0-250828';
const SEEDREAM_45 = 'seedream-4-5-251128';
const SEEDREAM_50 = 'seedream-5-0-260128';
const SEEDANCE_PRO = 'seedance-1-0-pro-250528';
const SEEDANCE_FAST = 'seedance-1-0-pro-fast-251015';
const SEEDANCE_LITE_I2V = 'seedance-1-0-lite-i2v-250428';
const SEEDANCE_15 = 'seedance-1-5-pro-251215';
const SEEDANCE_20 = 'dreamina-seedance-2-0-260128';
const MODELS = [SEEDREAM_40, SEEDREAM_45, SEEDREAM_50, SEEDANCE_PRO, SEEDANCE_FAST, SEEDANCE_LITE_I2V, SEEDANCE_15, SEEDANCE_20];
/** Every canonical model but Seedance 1.5 pro: an account that has not activated it. */
const ALL_BUT_15 = ['seedream-4-0-250828', 'seedream-4-5-251128', 'seedream-5-0-260128', 'seedance-1-0-pro-250528', 'seedance-1-0-pro-fast-251015', 'seedance-1-0-lite-i2v-250428', 'seedance-2-0-260128'];

let server: TestServer;
let fake: ArkFake;
let volcengine: ArkFake;
let seq = 0;

beforeAll(async () => {
  fake = await startArkFake({ accounts: { 'ark-a': {}, 'ark-b': {}, 'ark-no-15': { models: ALL_BUT_15 } } });
  volcengine = await startArkFake({ platform: 'volcengine', accounts: { 'ark-cn': {} } });
  server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000' } });
  // The shipped definitions, as `npm run admin -- models create --from ark/<model>` creates them.
  for (const id of MODELS) {
    const created = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(`ark/${id}`)!.model });
    expect(created.response.status).toBe(201);
  }
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
  await volcengine?.close();
});
beforeEach(() => {
  fake.faults.clear();
  fake.urlTtlMs = 24 * 3600_000;
});

type MemberSpec = { name: string; key: string; priority?: number; baseUrl?: string; modelMap?: Record<string, string>; models?: string[] };

/** A customer whose group has Ark members, added through the admin API. */
async function customer(members: MemberSpec[] = [{ name: 'a', key: 'ark-a' }], balance = 100) {
  const account = await createAccount(server.db, { balance });
  const group = await createGroup(server.db);
  const ids: Record<string, string> = {};
  for (const m of members) {
    const created = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: {
        name: m.name,
        provider: 'ark',
        base_url: m.baseUrl ?? `${fake.url}/api/v3`,
        credentials: { api_key: m.key },
        models: m.models ?? MODELS,
        ...(m.modelMap && { model_map: m.modelMap }),
        priority: m.priority ?? 0,
      },
    });
    expect(created.response.status).toBe(201);
    ids[m.name] = created.data!.id;
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, groupId: group.id, key: key.key, ids };
}

const twoMembers = () =>
  customer([
    { name: 'a', key: 'ark-a', priority: 10 },
    { name: 'b', key: 'ark-b', priority: 0 },
  ]);

type Json = Record<string, any>;

async function post(key: string, path: string, body: unknown) {
  const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const text = await res.text();
  let json: Json = {};
  try {
    json = JSON.parse(text) as Json;
  } catch {
    // an event stream
  }
  return { status: res.status, body: json, text, taskId: res.headers.get('x-task-id') };
}

const imageMeta = async (b64: string) => sharp(Buffer.from(b64, 'base64')).metadata();
const png = (w: number, h: number, alpha = 1) => sharp({ create: { width: w, height: h, channels: 4, background: { r: 60, g: 120, b: 200, alpha } } }).png().toBuffer();
const dataUrl = (b: Buffer) => `data:image/png;base64,${b.toString('base64')}`;
const micro = (credits: number) => Math.round(credits * 1_000_000);

async function balanceOf(accountId: string) {
  const row = await server.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow();
  return Number(row.balance);
}

async function healthOf(groupId: string) {
  const { data } = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } } });
  return Object.fromEntries(data!.data.map((m) => [m.name, m.health]));
}

function parseSse(text: string) {
  return text
    .split('\n\n')
    .filter((f) => f.trim())
    .map((frame) => ({ event: /^event: (.+)$/m.exec(frame)?.[1] ?? '', data: JSON.parse(/^data: (.+)$/m.exec(frame)?.[1] ?? '{}') as Json }));
}

describe('seedream', () => {
  it('asks each version for a size it takes and delivers the promised size, with b64_json, watermark off and no n; one image charged', async () => {
    const c = await customer();
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_45, prompt: 'a lighthouse at dusk', aspectRatio: '16:9', resolution: '2K' });
    expect(res.status).toBe(200);
    const call = fake.imageCalls.at(-1)!;
    // 2048x1152 is under 4.5's 2560x1440 pixels: its recommended 2K 16:9, resized here.
    expect(call).toMatchObject({ apiKey: 'ark-a', model: SEEDREAM_45, prompt: 'a lighthouse at dusk', size: '2848x1600', stream: false });
    expect(call.body).toMatchObject({ response_format: 'b64_json', watermark: false, sequential_image_generation: 'disabled' });
    expect(call.body).not.toHaveProperty('n');
    expect(call.body).not.toHaveProperty('output_format');
    expect(await imageMeta(res.body.data[0].b64_json)).toMatchObject({ width: 2048, height: 1152, format: 'png' });
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: micro(0.04) });

    // 4.0 takes 2048x1152 itself: asked for exactly.
    const exact = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'exact', aspectRatio: '16:9', resolution: '2K', output_format: 'jpeg' });
    expect(exact.status).toBe(200);
    expect(fake.imageCalls.at(-1)!.size).toBe('2048x1152');
    expect(await imageMeta(exact.body.data[0].b64_json)).toMatchObject({ width: 2048, height: 1152, format: 'jpeg' });
  });

  it('asks 5.0 lite for PNG when the client wants PNG, at the exact 4K size', async () => {
    const c = await customer();
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_50, prompt: 'a harbour', aspectRatio: '16:9', resolution: '4K' });
    expect(res.status).toBe(200);
    expect(fake.imageCalls.at(-1)!).toMatchObject({ size: '3840x2160', body: { output_format: 'png' } });
    expect(await imageMeta(res.body.data[0].b64_json)).toMatchObject({ width: 3840, height: 2160, format: 'png' });
  });

  it('edits with the inputs as lowercase data URLs and the mask last, and refuses more than 14 inputs before any call', async () => {
    const c = await customer();
    const input = await png(640, 360);
    const mask = await png(640, 360, 0);
    const ok = await post(c.key, '/v1/images/edits', { model: SEEDREAM_40, prompt: 'add a boat', images: [dataUrl(input), dataUrl(input)], mask: dataUrl(mask) });
    expect(ok.status).toBe(200);
    const call = fake.imageCalls.at(-1)!;
    expect(call.images.map((i) => `${i.mimeType} ${i.width}x${i.height}`)).toEqual(['image/png 640x360', 'image/png 640x360', 'image/png 640x360']);
    expect(call.prompt).toMatch(/^add a boat\n\n.*mask/);

    const calls = fake.imageCalls.length;
    const balance = await balanceOf(c.accountId);
    const tooMany = await post(c.key, '/v1/images/edits', { model: SEEDREAM_40, prompt: 'too many', images: Array(14).fill(dataUrl(input)), mask: dataUrl(mask) });
    expect([tooMany.status, tooMany.body.error?.code]).toEqual([400, 'too_many_images']);
    expect(fake.imageCalls.length).toBe(calls);
    expect(await balanceOf(c.accountId)).toBe(balance);
  });

  it('asks for n images as one batch (sequential_image_generation) and charges n', async () => {
    const c = await customer();
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'a comic strip', n: 3, aspectRatio: '1:1', resolution: '1K' });
    expect(res.status).toBe(200);
    expect(res.body.data).toHaveLength(3);
    expect(fake.imageCalls.at(-1)!.body).toMatchObject({ sequential_image_generation: 'auto', sequential_image_generation_options: { max_images: 3 } });
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: 3 * micro(0.03) });
  });

  it('asks again for the images the model decided not to make', async () => {
    const c = await customer();
    const before = fake.imageCalls.length;
    // The model makes one image per call, whatever max_images says.
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'three cats [ark:images=1]', n: 3 });
    expect(res.status).toBe(200);
    expect(res.body.data).toHaveLength(3);
    expect(fake.imageCalls.slice(before).map((call) => call.body.sequential_image_generation_options ?? call.body.sequential_image_generation)).toEqual([{ max_images: 3 }, { max_images: 2 }, 'disabled']);
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: 3 * micro(0.03) });
  });

  it('delivers the images of a data[] that mixes images and per-image errors, and charges only those', async () => {
    const c = await customer();
    const balance = await balanceOf(c.accountId);
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'four seasons [ark:unsafe-image=1]', n: 3 });
    expect(res.status).toBe(200);
    expect(fake.imageCalls.at(-1)!.outcomes).toEqual([{ size: '2048x2048' }, { error: 'OutputImageSensitiveContentDetected' }, { size: '2048x2048' }]);
    expect(res.body.data).toHaveLength(2);
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: 2 * micro(0.03) });
    expect(await balanceOf(c.accountId)).toBe(balance - 2 * micro(0.03));
    const task = await server.db.selectFrom('imageTasks').select(['status', 'delivered']).where('id', '=', res.taskId!).executeTakeFirstOrThrow();
    expect(task).toEqual({ status: 'completed', delivered: 2 });
  });

  it('refuses under the content policy when no image was made, charging nothing and not cooling the member', async () => {
    const c = await customer();
    const balance = await balanceOf(c.accountId);
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'refused [ark:unsafe-image=0]' });
    expect([res.status, res.body.error?.code]).toEqual([400, 'content_policy_violation']);
    expect(res.body.error.message).toContain('sensitive information');
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'released', captured: 0 });
    expect(await balanceOf(c.accountId)).toBe(balance);
    expect((await healthOf(c.groupId)).a).toMatchObject({ cooldown_until: null });
  });

  it('streams from Seedream when partial images are asked for: each image as it is done, a refused one as the error event, only delivered images charged', async () => {
    const c = await customer();
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'a storyboard [ark:unsafe-image=1]', n: 3, stream: true, partial_images: 1, aspectRatio: '16:9', resolution: '1K' });
    expect(res.status).toBe(200);
    expect(fake.imageCalls.at(-1)!).toMatchObject({ stream: true, body: { stream: true } });
    const events = parseSse(res.text);
    expect(events.map((e) => [e.event, e.data.image_index])).toEqual([
      ['image_generation.completed', 0],
      ['image_generation.completed', 1],
      ['error', undefined],
    ]);
    expect(events[2]!.data.error.code).toBe('content_policy_violation');
    expect(await imageMeta(events[0]!.data.b64_json)).toMatchObject({ width: 1248, height: 704 });
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: 2 * micro(0.03) });

    // A parameter error is a plain 400 before Seedream's stream: the client's error event says why.
    const refused = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'x [ark:unsafe-prompt]', stream: true, partial_images: 1 });
    expect(parseSse(refused.text).map((e) => [e.event, e.data.error?.code])).toEqual([['error', 'content_policy_violation']]);
    expect(await holdOf(server.db, refused.taskId!)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('keeps the images a stream delivered before it broke off, and fails a stream refused before any image over to the spare', async () => {
    const one = await customer();
    fake.streamErrorNext(1);
    const broken = await post(one.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'two frames', n: 2, stream: true, partial_images: 1 });
    expect(parseSse(broken.text).map((e) => e.event)).toEqual(['image_generation.completed', 'error']);
    expect(await holdOf(server.db, broken.taskId!)).toMatchObject({ status: 'captured', captured: micro(0.03) });

    const c = await twoMembers();
    fake.streamErrorNext(0, 'ServerOverloaded');
    const before = fake.imageCalls.length;
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'overloaded', stream: true, partial_images: 1 });
    expect(parseSse(res.text).map((e) => e.event)).toEqual(['image_generation.completed']);
    expect(fake.imageCalls.slice(before).map((x) => x.apiKey)).toEqual(['ark-a', 'ark-b']);
    expect((await healthOf(c.groupId)).a!.cooldown_reason).toBe('rate_limited');
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: micro(0.03) });
  });

  it('adds the watermark only for a member whose base URL asks for it', async () => {
    const c = await customer([{ name: 'marked', key: 'ark-a', baseUrl: `${fake.url}/api/v3?watermark=true` }]);
    expect((await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'marked' })).status).toBe(200);
    expect(fake.imageCalls.at(-1)!.body.watermark).toBe(true);
  });

  it('serves a Volcengine member through its model map, and leaves a member without it out for that model', async () => {
    const mapped = await customer([{ name: 'cn', key: 'ark-cn', baseUrl: `${volcengine.url}/api/v3`, modelMap: { [SEEDREAM_40]: `doubao-${SEEDREAM_40}` } }]);
    const ok = await post(mapped.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'via volcengine' });
    expect(ok.status).toBe(200);
    expect(volcengine.imageCalls.at(-1)!.model).toBe('doubao-seedream-4-0-250828');

    const unmapped = await customer([{ name: 'cn', key: 'ark-cn', baseUrl: `${volcengine.url}/api/v3` }]);
    const refused = await post(unmapped.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'BytePlus id on Volcengine' });
    expect([refused.status, refused.body.error?.code]).toEqual([502, 'upstream_error']);
    expect((await healthOf(unmapped.groupId)).cn!.model_faults).toEqual([expect.objectContaining({ model: SEEDREAM_40, kind: 'misconfigured', reason: expect.stringContaining('InvalidEndpointOrModel.NotFound') })]);
  });
});

describe('ark and the pool', () => {
  it('fails a 429 without Retry-After over to the second member, charged once, and cools the first by the pool\'s backoff', async () => {
    const c = await twoMembers();
    fake.rateLimitNext('images');
    const before = fake.imageCalls.length;
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'failover' });
    expect(res.status).toBe(200);
    // The 429 came before the fake logs a call: the only logged call is b's.
    expect(fake.imageCalls.slice(before).map((x) => x.apiKey)).toEqual(['ark-b']);
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: micro(0.03) });
    const health = await healthOf(c.groupId);
    expect(health.a!.cooldown_reason).toBe('rate_limited');
    // No Retry-After from Ark: the first strike's backoff, a second.
    expect(Date.parse(health.a!.cooldown_until!) - Date.now()).toBeLessThanOrEqual(1000);
    expect(health.a!.last_error).toContain('rate limit');
  });

  it('takes an overdue account out until an admin updates the member', async () => {
    const c = await twoMembers();
    fake.accounts.get('ark-a')!.overdue = true;
    try {
      const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'overdue' });
      expect(res.status).toBe(200);
      expect(fake.imageCalls.at(-1)!.apiKey).toBe('ark-b');
      expect((await healthOf(c.groupId)).a!.account_disabled).toEqual({ reason: expect.stringContaining('overdue balance'), since: expect.any(String) });
      const next = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'still overdue' });
      expect([next.status, fake.imageCalls.at(-1)!.apiKey]).toEqual([200, 'ark-b']);
    } finally {
      fake.accounts.get('ark-a')!.overdue = false;
    }
  });

  it('leaves a member whose account has not activated a model out for that model only, and says why in its health', async () => {
    const c = await customer([
      { name: 'a', key: 'ark-no-15', priority: 10 },
      { name: 'b', key: 'ark-b', priority: 0 },
    ]);
    const submitsBy = (key: string) => fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/tasks') && r.headers.authorization === `Bearer ${key}`).length;
    const first = await createVideo(c.key, { model: SEEDANCE_15 });
    expect(first.status).toBe(202);
    expect((await waitVideoFinished(server, c.key, first.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(first.body.id)).apiKey).toBe('ark-b');
    expect(await holdOf(server.db, first.body.id)).toMatchObject({ status: 'captured', captured: 5 * micro(0.0528) });
    const health = (await healthOf(c.groupId)).a!;
    expect(health.model_faults).toEqual([{ model: SEEDANCE_15, kind: 'model_not_open', reason: expect.stringContaining('HTTP 404 ModelNotOpen'), since: expect.any(String), until: null }]);
    expect(health).toMatchObject({ cooldown_until: null, credentials_rejected: false, account_disabled: null });

    // The member is not asked for the model again...
    const refusals = submitsBy('ark-no-15');
    const second = await createVideo(c.key, { model: SEEDANCE_15 });
    expect((await waitVideoFinished(server, c.key, second.body.id)).task.status).toBe('completed');
    expect(submitsBy('ark-no-15')).toBe(refusals);
    // ...and keeps serving its other models.
    const other = await createVideo(c.key, { model: SEEDANCE_PRO });
    expect((await waitVideoFinished(server, c.key, other.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(other.body.id)).apiKey).toBe('ark-no-15');
  });

  // Rows of Volcengine's error-code table (https://www.volcengine.com/docs/82379/1299023).
  const imagePostsBy = (key: string) => fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/images/generations') && r.headers.authorization === `Bearer ${key}`).length;

  it('fails a failure of Ark\'s risk-detection service (400 ContentSecurityDetectionError) over to the second member instead of refusing the request', async () => {
    const c = await twoMembers();
    fake.errorNext('images', 'ContentSecurityDetectionError');
    const asked = imagePostsBy('ark-a');
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'risk service down' });
    expect(res.status).toBe(200);
    expect(imagePostsBy('ark-a')).toBe(asked + 1);
    expect(fake.imageCalls.at(-1)!.apiKey).toBe('ark-b');
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: micro(0.03) });
    const health = (await healthOf(c.groupId)).a!;
    expect(health).toMatchObject({ credentials_rejected: false, account_disabled: null, model_faults: [] });
    expect(health.last_error).toContain('Internal error');
  });

  it.each([
    ['OperationDenied.ServiceNotOpen', 'HTTP 403 OperationDenied.ServiceNotOpen'],
    ['SetLimitExceeded', 'HTTP 429 SetLimitExceeded'],
    ['QuotaExceeded:free-trial', 'HTTP 429 QuotaExceeded'],
  ] as const)('leaves a member out for one model only on %s, its credentials and other models untouched', async (name, said) => {
    const c = await twoMembers();
    fake.errorNext('images', name);
    const res = await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'model not open' });
    expect(res.status).toBe(200);
    expect(fake.imageCalls.at(-1)!.apiKey).toBe('ark-b');
    const health = (await healthOf(c.groupId)).a!;
    expect(health.model_faults).toEqual([{ model: SEEDREAM_40, kind: 'model_not_open', reason: expect.stringContaining(said), since: expect.any(String), until: null }]);
    expect(health).toMatchObject({ cooldown_until: null, credentials_rejected: false, account_disabled: null });
    // Not asked for that model again, and still serving the others.
    const asked = imagePostsBy('ark-a');
    expect((await post(c.key, '/v1/images/generations', { model: SEEDREAM_40, prompt: 'again' })).status).toBe(200);
    expect(imagePostsBy('ark-a')).toBe(asked);
    expect((await post(c.key, '/v1/images/generations', { model: SEEDREAM_45, prompt: 'another model' })).status).toBe(200);
    expect(fake.imageCalls.at(-1)!.apiKey).toBe('ark-a');
  });

  it('cools a member by the pool\'s backoff, not the quota cooldown, on QuotaExceeded for too many queued tasks', async () => {
    const c = await twoMembers();
    fake.errorNext('submit', 'QuotaExceeded:queued-tasks');
    const created = await createVideo(c.key);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(created.body.id)).apiKey).toBe('ark-b');
    const health = (await healthOf(c.groupId)).a!;
    expect(health.cooldown_reason).toBe('rate_limited');
    // The first strike's backoff, a second (the quota cooldown is minutes).
    expect(Date.parse(health.cooldown_until!) - Date.now()).toBeLessThanOrEqual(1000);
  });

  it('fails a Seedance submit over to the second member on a 429', async () => {
    const c = await twoMembers();
    fake.rateLimitNext('submit');
    const created = await createVideo(c.key);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(created.body.id)).apiKey).toBe('ark-b');
    expect((await healthOf(c.groupId)).a!.cooldown_reason).toBe('rate_limited');
  });
});

async function createVideo(key: string, overrides: Record<string, unknown> = {}) {
  return post(key, '/v1/videos/generations', { client_request_id: `ark-${Date.now()}-${++seq}`, prompt: 'a paper boat on a river', model: SEEDANCE_PRO, seconds: 5, aspectRatio: '16:9', resolution: '720p', ...overrides });
}

/** The Seedance task a video task was submitted as (once its id is saved). */
async function upstreamTask(videoTaskId: string) {
  const id = await until(async () => (await server.db.selectFrom('videoTasks').select('upstreamJobId').where('id', '=', videoTaskId).executeTakeFirstOrThrow()).upstreamJobId ?? undefined, 10_000, 'the upstream task id');
  const task = fake.tasks.get(id);
  if (!task) throw new Error(`no Seedance task ${id}`);
  return task;
}

describe('seedance', () => {
  let frame: string;
  beforeAll(async () => {
    frame = dataUrl(await png(640, 360));
  });

  it('runs a video with first and last frames: content roles, the parameters, the download without the key, charged per second', async () => {
    const c = await customer();
    const created = await createVideo(c.key, { model: SEEDANCE_15, firstFrame: frame, lastFrame: frame });
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    const upstream = await upstreamTask(created.body.id);
    expect(upstream.id).toMatch(/^cgt-/);
    expect(upstream.images.map((i) => `${i.role} ${i.mimeType} ${i.width}x${i.height}`)).toEqual(['first_frame image/png 640x360', 'last_frame image/png 640x360']);
    const { content, ...params } = upstream.body;
    expect((content as Json[])[0]).toEqual({ type: 'text', text: 'a paper boat on a river' });
    // Audio is 1.5 pro's default; no seed or camera_fixed: the contract has neither. What is left
    // of the task's hour of lifetime is less than Ark's shortest queue lifetime, so that is sent.
    expect(params).toEqual({ model: SEEDANCE_15, resolution: '720p', ratio: '16:9', duration: 5, generate_audio: true, watermark: false, execution_expires_after: 3600 });
    const url = new URL(task.video_url!);
    const bytes = Buffer.from(await (await fetch(`${server.directUrl}${url.pathname}${url.search}`)).arrayBuffer());
    expect(bytes.subarray(4, 8).toString('latin1')).toBe('ftyp');
    expect(fake.storageSawAuth).toBe(0);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 5 * micro(0.0528) });
  });

  it('sends reference images with role reference_image', async () => {
    const c = await customer();
    const created = await createVideo(c.key, { model: SEEDANCE_20, seconds: 4, referenceImages: [frame, frame, frame], generate_audio: false });
    expect(created.status).toBe(202);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    const upstream = await upstreamTask(created.body.id);
    expect(upstream.model).toBe(SEEDANCE_20);
    expect(upstream.images.map((i) => i.role)).toEqual(['reference_image', 'reference_image', 'reference_image']);
    expect(upstream.body).toMatchObject({ duration: 4, generate_audio: false });
  });

  it('refuses what a model cannot do before any upstream call, charging nothing', async () => {
    const c = await customer();
    const balance = await balanceOf(c.accountId);
    const submits = fake.tasks.size;
    const cases: [Record<string, unknown>, string][] = [
      [{ model: SEEDANCE_LITE_I2V, resolution: '1080p', referenceImages: [frame] }, 'unsupported_resolution'],
      [{ model: SEEDANCE_FAST, firstFrame: frame, lastFrame: frame }, 'last_frame_not_supported'],
      [{ model: SEEDANCE_PRO, generate_audio: true }, 'audio_not_supported'],
      [{ model: SEEDANCE_15, seconds: 3 }, 'unsupported_duration'],
      [{ model: SEEDANCE_20, resolution: '1080p' }, 'unsupported_resolution'],
      [{ model: SEEDANCE_PRO, referenceImages: [frame] }, 'too_many_reference_images'],
      [{ model: SEEDANCE_PRO, negativePrompt: 'rain' }, 'unsupported_by_upstream'],
    ];
    for (const [body, code] of cases) {
      const res = await createVideo(c.key, body);
      expect([res.status, res.body.error?.code], JSON.stringify(body).slice(0, 100)).toEqual([400, code]);
    }
    expect(fake.tasks.size).toBe(submits);
    expect(await balanceOf(c.accountId)).toBe(balance);
  });

  it('fails and refunds a text-only task of the image-to-video lite model without calling the upstream (the catalog cannot require an image)', async () => {
    const c = await customer();
    const submits = fake.tasks.size;
    const created = await createVideo(c.key, { model: SEEDANCE_LITE_I2V });
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error?.message]).toEqual(['failed', 'Seedance accepts a first frame or reference images on its image-to-video model.']);
    expect(fake.tasks.size).toBe(submits);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('fails a task refused under the content policy, and one that expired upstream, refunding both', async () => {
    const c = await customer();
    const balance = await balanceOf(c.accountId);
    const refused = await createVideo(c.key, { prompt: 'a storm [ark:unsafe-video]' });
    const expired = await createVideo(c.key, { prompt: 'a queue [ark:expire]' });
    const a = (await waitVideoFinished(server, c.key, refused.body.id)).task;
    expect([a.status, a.error?.message]).toEqual(['failed', expect.stringContaining('sensitive information')]);
    const b = (await waitVideoFinished(server, c.key, expired.body.id)).task;
    expect([b.status, b.error?.message]).toEqual(['failed', expect.stringContaining('expired')]);
    const codes = await server.db.selectFrom('videoTasks').select(['id', 'errorCode']).where('id', 'in', [refused.body.id, expired.body.id]).execute();
    expect(Object.fromEntries(codes.map((r) => [r.id, r.errorCode]))).toEqual({ [refused.body.id]: 'content_policy_violation', [expired.body.id]: 'upstream_error' });
    for (const id of [refused.body.id, expired.body.id]) expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
    expect(await balanceOf(c.accountId)).toBe(balance);
  });

  it('fails and refunds a task whose result URL expired before it was downloaded', async () => {
    const c = await customer();
    // The link is dead the moment the task succeeds (as 24 hours later).
    fake.urlTtlMs = 0;
    const created = await createVideo(c.key);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error?.message]).toEqual(['failed', expect.stringMatching(/link to the video expired.*24 hours/)]);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('cancels a queued task upstream when its task fails by its deadline, and leaves a running one to finish (Ark cannot stop it)', async () => {
    const c = await customer();
    const queued = await createVideo(c.key, { prompt: 'a long queue [ark:stay-queued]' });
    const running = await createVideo(c.key, { prompt: 'a long render [ark:stay-running]' });
    const queuedId = (await upstreamTask(queued.body.id)).id;
    const runningId = (await upstreamTask(running.body.id)).id;
    await until(() => fake.statusOf(runningId) === 'running', 5000, 'the task to run');
    await server.db.updateTable('videoTasks').set({ deadlineAt: new Date(Date.now() - 1000), nextRunAt: new Date() }).where('id', 'in', [queued.body.id, running.body.id]).execute();
    for (const id of [queued.body.id, running.body.id]) {
      const { task } = await waitVideoFinished(server, c.key, id);
      expect([task.status, task.error?.message]).toEqual(['failed', 'The task exceeded its maximum lifetime and was refunded.']);
      expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
    }
    await until(() => fake.statusOf(queuedId) === 'cancelled', 5000, 'the queued task to be cancelled');
    await until(() => server.logs.some((l) => l.includes(runningId) && l.includes('could not cancel the upstream job') && l.includes('cannot cancel a running Seedance task')), 5000, 'the warning');
    expect(fake.statusOf(runningId)).toBe('running');
  });
});
