/**
 * The `gemini` adapters through the public API against the fake Gemini API (test/fakes/gemini.ts):
 * Nano Banana images (official sizes, imageConfig, thought parts, edits within the input limit,
 * HTTP-200 blocks, n > 1 bounded by the member's concurrency, completed-only streams, re-encoding)
 * and Veo (the SDK's wire shapes, operations, filtered and failed results, the 302 download, the
 * catalog's duration constraints), and the pool around them: RetryInfo 429s fail over to the second
 * member and cool the first down, per-day quotas for an hour.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startGeminiFake, type GeminiFake } from '../fakes/gemini.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, waitVideoFinished } from '../support/tasks.ts';
import { NANO_BANANA, NANO_BANANA_PRO, VEO_31, addUpstreamMember } from '../support/upstreams.ts';

let server: TestServer;
let fake: GeminiFake;
let seq = 0;

beforeAll(async () => {
  fake = await startGeminiFake({ apiKeys: ['gm-a', 'gm-b'] });
  server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000' } });
  await seedCatalog(server.db, [NANO_BANANA, NANO_BANANA_PRO, VEO_31]);
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});
beforeEach(() => {
  fake.faults.clear();
  fake.holdMs = 0;
});

type MemberSpec = { name: string; key: string; priority?: number; concurrencyLimit?: number };

/** A customer whose group has Gemini members (the first one preferred unless priorities say otherwise). */
async function customer(members: MemberSpec[] = [{ name: 'a', key: 'gm-a' }], balance = 100) {
  const account = await createAccount(server.db, { balance });
  const group = await createGroup(server.db);
  const ids: Record<string, string> = {};
  for (const m of members) {
    ids[m.name] = (
      await addUpstreamMember(server.db, server.secretKey, {
        groupId: group.id,
        name: m.name,
        provider: 'gemini',
        baseUrl: `${fake.url}/v1beta`,
        credentials: { api_key: m.key },
        models: [NANO_BANANA.id, NANO_BANANA_PRO.id, VEO_31.id],
        priority: m.priority ?? 0,
        concurrencyLimit: m.concurrencyLimit ?? null,
      })
    ).id;
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, groupId: group.id, key: key.key, ids };
}

/** Two members, `a` tried first (higher priority), `b` the spare. */
const twoMembers = () => customer([
  { name: 'a', key: 'gm-a', priority: 10 },
  { name: 'b', key: 'gm-b', priority: 0 },
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
  return { status: res.status, body: json, text, taskId: res.headers.get('x-task-id'), retryAfter: res.headers.get('retry-after') };
}

const imageMeta = async (b64: string) => sharp(Buffer.from(b64, 'base64')).metadata();
const png = (w: number, h: number, alpha = 1) => sharp({ create: { width: w, height: h, channels: 4, background: { r: 200, g: 40, b: 40, alpha } } }).png().toBuffer();
const dataUrl = (b: Buffer) => `data:image/png;base64,${b.toString('base64')}`;

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

describe('gemini images', () => {
  it('sends generateContent with the key and imageConfig, and returns Google\'s official 1K size', async () => {
    const c = await customer();
    const before = fake.calls.length;
    const res = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'a nano banana dish' });
    expect(res.status).toBe(200);
    const call = fake.calls[before]!;
    expect(call).toMatchObject({ model: 'gemini-2.5-flash-image', apiKey: 'gm-a', prompt: 'a nano banana dish', imageConfig: { aspectRatio: '1:1' }, responseModalities: ['TEXT', 'IMAGE'] });
    // 1K is the default: no imageSize (2.5 Flash refuses any other).
    expect(call.imageConfig).not.toHaveProperty('imageSize');
    expect(await imageMeta(res.body.data[0].b64_json)).toMatchObject({ width: 1024, height: 1024, format: 'png' });
    expect(res.body.size).toBe('1024x1024');

    // A size from Google's table selects its ratio.
    const wide = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'wide', size: '1344x768' });
    expect(wide.status).toBe(200);
    expect(fake.calls.at(-1)!.imageConfig).toEqual({ aspectRatio: '16:9' });
    expect(await imageMeta(wide.body.data[0].b64_json)).toMatchObject({ width: 1344, height: 768 });
  });

  it('asks 3 Pro for an uppercase imageSize and skips its thought images', async () => {
    const c = await customer();
    const res = await post(c.key, '/v1/images/generations', { model: NANO_BANANA_PRO.id, prompt: 'a castle', aspectRatio: '16:9', resolution: '2K' });
    expect(res.status).toBe(200);
    expect(fake.calls.at(-1)!.imageConfig).toEqual({ aspectRatio: '16:9', imageSize: '2K' });
    // The answer had two quarter-size thought images before the final one: the final one is returned.
    expect(await imageMeta(res.body.data[0].b64_json)).toMatchObject({ width: 2752, height: 1536 });
    const hold = await holdOf(server.db, res.taskId!);
    expect(hold).toMatchObject({ status: 'captured', captured: Math.round(0.134 * 1_000_000) });
  });

  it('re-encodes to the output format Gemini cannot produce', async () => {
    const c = await customer();
    const res = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'jpeg please', output_format: 'jpeg', output_compression: 60 });
    expect(res.status).toBe(200);
    expect(fake.calls.at(-1)!.imageConfig).not.toHaveProperty('outputMimeType');
    expect(await imageMeta(res.body.data[0].b64_json)).toMatchObject({ format: 'jpeg', width: 1024, height: 1024 });
  });

  it('edits with the input images and the mask as inline parts, within the model\'s input limit', async () => {
    const c = await customer();
    const input = await png(640, 360);
    const mask = await png(640, 360, 0);
    const before = fake.counts.generate;
    const ok = await post(c.key, '/v1/images/edits', { model: NANO_BANANA.id, prompt: 'add a hat', images: [dataUrl(input), dataUrl(input)], mask: dataUrl(mask) });
    expect(ok.status).toBe(200);
    const call = fake.calls.at(-1)!;
    // Two images and the mask: three inline parts, 2.5 Flash's limit.
    expect(call.images.map((i) => `${i.width}x${i.height}`)).toEqual(['640x360', '640x360', '640x360']);
    expect(call.prompt).toContain('mask');

    // Three images and a mask are four: refused before any upstream call, nothing held.
    const balance = await balanceOf(c.accountId);
    const tooMany = await post(c.key, '/v1/images/edits', { model: NANO_BANANA.id, prompt: 'add a hat', images: [dataUrl(input), dataUrl(input), dataUrl(input)], mask: dataUrl(mask) });
    expect([tooMany.status, tooMany.body.error?.code]).toEqual([400, 'too_many_images']);
    expect(tooMany.body.error.message).toContain('3');
    expect(fake.counts.generate).toBe(before + 1);
    expect(await balanceOf(c.accountId)).toBe(balance);
    // 3 Pro takes 14.
    const pro = await post(c.key, '/v1/images/edits', { model: NANO_BANANA_PRO.id, prompt: 'add a hat', images: [dataUrl(input), dataUrl(input), dataUrl(input)], mask: dataUrl(mask) });
    expect(pro.status).toBe(200);
    expect(fake.calls.at(-1)!.images).toHaveLength(4);
  });

  it('sends a GIF input as a PNG of its first frame: Gemini takes no GIF, and refuses GIF bytes labelled image/png', async () => {
    const c = await customer();
    // An animated GIF: a red frame, then a blue one.
    const frame = (background: string) => sharp({ create: { width: 96, height: 64, channels: 3, background } }).png().toBuffer();
    const gif = await sharp([await frame('#ff0000'), await frame('#0000ff')], { join: { animated: true } }).gif().toBuffer();
    expect(gif.subarray(0, 6).toString('latin1')).toBe('GIF89a');
    const res = await post(c.key, '/v1/images/edits', { model: NANO_BANANA.id, prompt: 'add a hat', images: [`data:image/gif;base64,${gif.toString('base64')}`] });
    expect([res.status, res.body.error]).toEqual([200, undefined]);
    const call = fake.calls.at(-1)!;
    expect([call.prompt, call.status]).toEqual(['add a hat', 200]);
    const sent = ((call.request.json as Json).contents[0].parts as Json[]).map((p) => p.inlineData).filter(Boolean);
    expect(sent.map((d) => d.mimeType)).toEqual(['image/png']);
    const bytes = Buffer.from(sent[0].data as string, 'base64');
    expect(bytes.subarray(0, 8).toString('hex')).toBe('89504e470d0a1a0a');
    // The first frame only, at its own size, and red.
    expect(await sharp(bytes).metadata()).toMatchObject({ format: 'png', width: 96, height: 64 });
    const { channels } = await sharp(bytes).stats();
    expect(channels.slice(0, 3).map((ch) => Math.round(ch.mean))).toEqual([255, 0, 0]);
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: Math.round(0.039 * 1_000_000) });

    // What the adapter used to send: the fake refuses it as Google does (400 INVALID_ARGUMENT).
    const raw = await fetch(`${fake.url}/v1beta/models/gemini-2.5-flash-image:generateContent`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-goog-api-key': 'gm-a' },
      body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'add a hat' }, { inlineData: { mimeType: 'image/png', data: gif.toString('base64') } }] }] }),
    });
    const refused = (await raw.json()) as Json;
    expect([raw.status, refused.error?.code, refused.error?.status]).toEqual([400, 400, 'INVALID_ARGUMENT']);
    expect(refused.error.message).toContain('image/gif');
  });

  it('turns HTTP-200 blocks into content_policy_violation and "no image" into upstream_error, charging nothing', async () => {
    const c = await customer();
    const balance = await balanceOf(c.accountId);
    const prompt = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'block-prompt please' });
    expect(prompt.body.error?.code).toBe('content_policy_violation');
    expect(prompt.body.error.message).toContain('SAFETY');
    const image = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'block-image please' });
    expect(image.body.error?.code).toBe('content_policy_violation');
    expect(image.body.error.message).toContain('IMAGE_SAFETY');
    const text = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'text-only please' });
    expect([text.status, text.body.error?.code]).toEqual([502, 'upstream_error']);
    for (const r of [prompt, image, text]) expect(await holdOf(server.db, r.taskId!)).toMatchObject({ status: 'released', captured: 0 });
    expect(await balanceOf(c.accountId)).toBe(balance);
    // A content block is about the prompt, not the member: it does not cool down.
    expect((await healthOf(c.groupId)).a).toMatchObject({ cooldown_until: null });
  });

  it('runs n > 1 as parallel calls, never more than the member\'s concurrency limit at once', async () => {
    const c = await customer([{ name: 'a', key: 'gm-a', concurrencyLimit: 2 }]);
    fake.holdMs = 150;
    fake.maxInFlight = 0;
    const res = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'three bananas', n: 3 });
    expect(res.status).toBe(200);
    expect(res.body.data).toHaveLength(3);
    expect(fake.maxInFlight).toBe(2);
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: 3 * Math.round(0.039 * 1_000_000) });
  });

  it('streams completed events only: Gemini has no partial images', async () => {
    const c = await customer();
    const res = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'streamed', stream: true, partial_images: 2, n: 2 });
    expect(res.status).toBe(200);
    const events = parseSse(res.text);
    expect(events.map((e) => `${e.event}:${e.data.image_index}`).sort()).toEqual(['image_generation.completed:0', 'image_generation.completed:1']);
    expect(await imageMeta(events[0]!.data.b64_json)).toMatchObject({ width: 1024, height: 1024 });
  });
});

describe('gemini rate limits and the pool', () => {
  it('fails a 429 RetryInfo over to the second member, once charged, and cools the first for the retryDelay', async () => {
    const c = await twoMembers();
    fake.rateLimitNext('generate', 30);
    const before = fake.calls.length;
    const res = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'failover' });
    expect(res.status).toBe(200);
    // The 429 came before the fake logs a call: the only logged call is b's.
    expect(fake.calls.slice(before).map((x) => x.apiKey)).toEqual(['gm-b']);
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: Math.round(0.039 * 1_000_000) });
    const health = await healthOf(c.groupId);
    expect(health.a!.cooldown_reason).toBe('rate_limited');
    // The cooldown and the error are written by one statement, with one now(): exactly the retryDelay apart.
    expect(Date.parse(health.a!.cooldown_until!) - Date.parse(health.a!.last_error_at!)).toBe(30_000);
    // While a cools down, b takes everything.
    const next = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'while cooling' });
    expect([next.status, fake.calls.at(-1)!.apiKey]).toEqual([200, 'gm-b']);
  });

  it('cools a member whose daily quota is used up for at least an hour', async () => {
    const c = await twoMembers();
    fake.rateLimitNext('generate', 20, { perDay: true });
    const res = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'daily' });
    expect(res.status).toBe(200);
    const health = await healthOf(c.groupId);
    expect(health.a!.cooldown_reason).toBe('quota_exhausted');
    expect(Date.parse(health.a!.cooldown_until!) - Date.now()).toBeGreaterThan(59 * 60_000);
  });

  it('fails a Veo submit over to the second member on a RetryInfo 429', async () => {
    const c = await twoMembers();
    fake.rateLimitNext('submit', 40);
    const created = await createVideo(c.key);
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    const op = await operationOf(created.body.id);
    expect(op.apiKey).toBe('gm-b');
    expect((await healthOf(c.groupId)).a!.cooldown_reason).toBe('rate_limited');
  });
});

describe('gemini 3.1 Flash size table (upstream-apis.md §3.1, §3.4)', () => {
  const NB2 = 'nano-banana-2';
  const PRO_WIDE = 'nano-banana-pro-misconfigured';
  let nb2: Awaited<ReturnType<typeof customer>> | undefined;

  /** The 3.1 Flash model created through the admin API (its size_table and `512` tier are contract values), and a customer of it. */
  async function nanoBanana2() {
    if (nb2) return nb2;
    const created = await server.admin().POST('/admin/v1/models', {
      body: {
        id: NB2,
        kind: 'image',
        display_name: 'Nano Banana 2 (Gemini 3.1 Flash Image)',
        image: {
          resolutions: ['1K', '512', '2K', '4K'],
          aspect_ratios: ['1:1', '16:9', '9:16', '1:4', '4:1', '1:8', '8:1'],
          output_formats: ['png', 'jpeg', 'webp'],
          supports_quality: false,
          supports_transparent_background: false,
          max_n: 4,
          size_table: 'gemini-3.1-flash-image',
          max_input_images: 14,
        },
        pricing: ['1K', '512', '2K', '4K'].map((resolution, i) => ({ resolution, quality: null, mode: 'per_item' as const, unit_price: [0.067, 0.045, 0.101, 0.151][i]! })),
      },
    });
    expect(created.response.status).toBe(201);
    expect(created.data!.image).toMatchObject({ size_table: 'gemini-3.1-flash-image', resolutions: ['1K', '512', '2K', '4K'] });
    const account = await createAccount(server.db, { balance: 100 });
    const group = await createGroup(server.db);
    await addUpstreamMember(server.db, server.secretKey, {
      groupId: group.id,
      name: 'a',
      provider: 'gemini',
      baseUrl: `${fake.url}/v1beta`,
      credentials: { api_key: 'gm-a' },
      models: [NB2, PRO_WIDE],
      modelMap: { [NB2]: 'gemini-3.1-flash-image-preview', [PRO_WIDE]: 'gemini-3-pro-image-preview' },
    });
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    nb2 = { accountId: account.id, groupId: group.id, key: key.key, ids: {} };
    return nb2;
  }

  it('renders the extreme ratios at Google\'s sizes and asks for the 512 tier as imageSize "512", billed at its own price', async () => {
    const c = await nanoBanana2();
    const tall = await post(c.key, '/v1/images/generations', { model: NB2, prompt: 'a very tall banana', aspectRatio: '1:8', resolution: '2K' });
    expect(tall.status).toBe(200);
    expect(fake.calls.at(-1)!).toMatchObject({ model: 'gemini-3.1-flash-image-preview', imageConfig: { aspectRatio: '1:8', imageSize: '2K' } });
    expect(tall.body.size).toBe('704x5856');
    expect(await imageMeta(tall.body.data[0].b64_json)).toMatchObject({ width: 704, height: 5856 });
    expect(await holdOf(server.db, tall.taskId!)).toMatchObject({ status: 'captured', captured: 101_000 });

    const small = await post(c.key, '/v1/images/generations', { model: NB2, prompt: 'a small banana', aspect_ratio: '16:9', resolution: '512' });
    expect(small.status).toBe(200);
    expect(fake.calls.at(-1)!.imageConfig).toEqual({ aspectRatio: '16:9', imageSize: '512' });
    expect(await imageMeta(small.body.data[0].b64_json)).toMatchObject({ width: 688, height: 384 });
    expect(await holdOf(server.db, small.taskId!)).toMatchObject({ status: 'captured', captured: 45_000 });

    // A size of the 3.1 table selects its tier and ratio: 2064x512 is 1K 4:1 (1K: no imageSize).
    const wide = await post(c.key, '/v1/images/generations', { model: NB2, prompt: 'a wide banana', size: '2064x512' });
    expect(wide.status).toBe(200);
    expect(fake.calls.at(-1)!.imageConfig).toEqual({ aspectRatio: '4:1' });
    expect(await imageMeta(wide.body.data[0].b64_json)).toMatchObject({ width: 2064, height: 512 });
    expect(await holdOf(server.db, wide.taskId!)).toMatchObject({ status: 'captured', captured: 67_000 });
  });

  it('refuses, before any charge or upstream call, a ratio or tier the model\'s Google table does not list', async () => {
    const c = await nanoBanana2();
    // An operator who gave a 3 Pro model 3.1 Flash's extras: its table still has no 1:4 and no 512.
    // The admin API refuses such a model...
    const image = { resolutions: ['1K', '512'], aspect_ratios: ['1:1', '1:4'], output_formats: ['png'], supports_quality: false, supports_transparent_background: false, max_n: 1, size_table: 'gemini-3-pro-image' };
    const pricing = [
      { resolution: '1K', quality: null, mode: 'per_item', unit_price: 0.134 },
      { resolution: '512', quality: null, mode: 'per_item', unit_price: 0.1 },
    ];
    const refused = await server.admin().POST('/admin/v1/models', { body: { id: PRO_WIDE, kind: 'image', display_name: 'Nano Banana Pro, misconfigured', image, pricing } as never });
    expect([refused.response.status, refused.error?.error.param]).toEqual([400, 'image.resolutions']);
    const ratioOnly = await server.admin().POST('/admin/v1/models', { body: { id: PRO_WIDE, kind: 'image', display_name: 'x', image: { ...image, resolutions: ['1K'] }, pricing: [pricing[0]] } as never });
    expect([ratioOnly.response.status, ratioOnly.error?.error.param]).toEqual([400, 'image.aspect_ratios']);
    // ...and a catalog written otherwise (older data, a direct insert) is still refused per request.
    await seedCatalog(server.db, [
      {
        id: PRO_WIDE,
        kind: 'image',
        displayName: 'Nano Banana Pro, misconfigured',
        capabilities: { resolutions: ['1K', '512'], aspectRatios: ['1:1', '1:4'], outputFormats: ['png'], supportsQuality: false, supportsTransparentBackground: false, maxN: 1, sizeTable: 'gemini-3-pro-image' },
        prices: [
          { resolution: '1K', quality: '', mode: 'per_item', unitPrice: 134_000 },
          { resolution: '512', quality: '', mode: 'per_item', unitPrice: 100_000 },
        ],
      },
    ]);
    const generates = fake.counts.generate;
    const balance = await balanceOf(c.accountId);
    const cases: [Record<string, unknown>, string, string][] = [
      [{ model: PRO_WIDE, aspectRatio: '1:4' }, 'unsupported_aspect_ratio', 'aspectRatio'],
      [{ model: PRO_WIDE, resolution: '512' }, 'unsupported_resolution', 'resolution'],
      [{ model: NB2, aspectRatio: '21:9' }, 'unsupported_aspect_ratio', 'aspectRatio'],
      [{ model: NB2, resolution: '8K' }, 'unsupported_resolution', 'resolution'],
      [{ model: NANO_BANANA.id, aspectRatio: '1:4' }, 'unsupported_aspect_ratio', 'aspectRatio'],
      [{ model: NANO_BANANA.id, resolution: '512' }, 'unsupported_resolution', 'resolution'],
    ];
    const other = await customer();
    for (const [body, code, param] of cases) {
      const key = body.model === NANO_BANANA.id ? other.key : c.key;
      const res = await post(key, '/v1/images/generations', { prompt: 'refused', ...body });
      expect([res.status, res.body.error?.code, res.body.error?.param], JSON.stringify(body)).toEqual([400, code, param]);
    }
    expect(fake.counts.generate).toBe(generates);
    expect(await balanceOf(c.accountId)).toBe(balance);
    expect(await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', other.accountId).execute()).toEqual([]);
  });
});

describe('gemini fake fidelity: streams, NO_IMAGE, imageSize, refused keys', () => {
  it('reads the stream with \\n\\n and with \\r\\n\\r\\n frame endings (§3.1)', async () => {
    const c = await customer();
    try {
      for (const framing of ['lf', 'crlf'] as const) {
        fake.sseFraming = framing;
        const res = await post(c.key, '/v1/images/generations', { model: NANO_BANANA_PRO.id, prompt: `framed ${framing}`, aspectRatio: '16:9' });
        expect(res.status, framing).toBe(200);
        expect(fake.calls.at(-1)!).toMatchObject({ stream: true, framing });
        // Three frames before the last (text, two thoughts): the final image is the one returned.
        expect(await imageMeta(res.body.data[0].b64_json)).toMatchObject({ width: 1376, height: 768 });
      }
    } finally {
      fake.sseFraming = 'alternate';
    }
  });

  it('turns an error frame after the 200 into a classified upstream error: 502 and nothing charged, or a failover on a 429', async () => {
    const c = await customer();
    const balance = await balanceOf(c.accountId);
    fake.streamErrorNext(1);
    const res = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'breaks off' });
    expect([res.status, res.body.error?.code]).toEqual([502, 'upstream_error']);
    expect(res.body.error.message).toContain('internal error');
    expect(fake.calls.at(-1)!.streamError).toMatchObject({ status: 'INTERNAL' });
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'released', captured: 0 });
    expect(await balanceOf(c.accountId)).toBe(balance);

    // A RESOURCE_EXHAUSTED frame is a rate limit: the spare member serves, charged once.
    const two = await twoMembers();
    fake.streamErrorNext(0, { code: 429, message: 'Resource has been exhausted (e.g. check quota).', status: 'RESOURCE_EXHAUSTED' });
    const before = fake.calls.length;
    const failover = await post(two.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'limited mid-stream' });
    expect(failover.status).toBe(200);
    expect(fake.calls.slice(before).map((x) => x.apiKey)).toEqual(['gm-a', 'gm-b']);
    expect(await holdOf(server.db, failover.taskId!)).toMatchObject({ status: 'captured', captured: Math.round(0.039 * 1_000_000) });
    expect((await healthOf(two.groupId)).a!.cooldown_reason).toBe('rate_limited');
  });

  it('turns finishReason NO_IMAGE into upstream_error "no image returned", charging nothing', async () => {
    const c = await customer();
    const balance = await balanceOf(c.accountId);
    const res = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: 'no-image please' });
    expect([res.status, res.body.error?.code]).toEqual([502, 'upstream_error']);
    expect(res.body.error.message).toContain('no image returned');
    expect(res.body.error.message).toContain('NO_IMAGE');
    expect(fake.calls.at(-1)!.outcome).toBe('no-image');
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'released', captured: 0 });
    expect(await balanceOf(c.accountId)).toBe(balance);
    // The model's answer, not the member's fault: no cooldown.
    expect((await healthOf(c.groupId)).a).toMatchObject({ cooldown_until: null, credentials_rejected: false });
  });

  it('never sends imageSize to gemini-2.5-flash-image, even for a tier it lacks (it renders 1K, resized here)', async () => {
    const account = await createAccount(server.db, { balance: 100 });
    const group = await createGroup(server.db);
    // An operator mapped the 3 Pro catalog model onto 2.5 Flash.
    await addUpstreamMember(server.db, server.secretKey, {
      groupId: group.id,
      provider: 'gemini',
      baseUrl: `${fake.url}/v1beta`,
      credentials: { api_key: 'gm-a' },
      models: [NANO_BANANA_PRO.id],
      modelMap: { [NANO_BANANA_PRO.id]: 'gemini-2.5-flash-image' },
    });
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    const res = await post(key.key, '/v1/images/generations', { model: NANO_BANANA_PRO.id, prompt: 'big banana', aspectRatio: '16:9', resolution: '2K' });
    expect(res.status).toBe(200);
    expect(fake.calls.at(-1)!).toMatchObject({ model: 'gemini-2.5-flash-image', imageConfig: { aspectRatio: '16:9' }, size: '1344x768' });
    expect(fake.calls.at(-1)!.imageConfig).not.toHaveProperty('imageSize');
    expect(await imageMeta(res.body.data[0].b64_json)).toMatchObject({ width: 2752, height: 1536 });
  });

  it('marks a member whose key Google refuses (401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 400 API_KEY_INVALID) as having rejected credentials', async () => {
    try {
      for (const refusal of [401, 403, 400] as const) {
        const c = await customer([
          { name: 'a', key: refusal === 400 ? 'gm-unknown' : 'gm-a', priority: 10 },
          { name: 'b', key: 'gm-b', priority: 0 },
        ]);
        if (refusal !== 400) fake.refuseKey('gm-a', refusal);
        const before = fake.requests.length;
        const first = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: `refused ${refusal}` });
        expect(first.status, String(refusal)).toBe(200);
        const second = await post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: `refused ${refusal} again` });
        expect(second.status).toBe(200);
        // The refused key was tried once; then only the spare.
        const keysSent = fake.requests.slice(before).map((r) => String(r.headers['x-goog-api-key']));
        expect(keysSent, String(refusal)).toEqual([refusal === 400 ? 'gm-unknown' : 'gm-a', 'gm-b', 'gm-b']);
        const health = await healthOf(c.groupId);
        expect([health.a!.credentials_rejected, health.b!.credentials_rejected], String(refusal)).toEqual([true, false]);
        expect(await holdOf(server.db, first.taskId!)).toMatchObject({ status: 'captured', captured: Math.round(0.039 * 1_000_000) });
        fake.refuseKey('gm-a', undefined);
      }
      // The 403 text quotes the key: it never reaches the logs.
      expect(server.logs.join('\n')).not.toContain('api_key:gm-a');
    } finally {
      fake.refuseKey('gm-a', undefined);
    }
  });
});

async function createVideo(key: string, overrides: Record<string, unknown> = {}) {
  return post(key, '/v1/videos/generations', { client_request_id: `veo-${Date.now()}-${++seq}`, prompt: 'a paper boat on a river', model: VEO_31.id, seconds: 4, aspectRatio: '16:9', resolution: '720p', ...overrides });
}

async function operationOf(taskId: string) {
  const row = await server.db.selectFrom('videoTasks').select(['upstreamJobId']).where('id', '=', taskId).executeTakeFirstOrThrow();
  const op = fake.operations.get(row.upstreamJobId!);
  if (!op) throw new Error(`no operation ${row.upstreamJobId}`);
  return op;
}

describe('veo', () => {
  it('submits the SDK wire shape (numeric duration, no generateAudio), polls the operation and downloads through the 302', async () => {
    const c = await customer();
    const created = await createVideo(c.key, { negativePrompt: 'rain' });
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    const op = await operationOf(created.body.id);
    expect(op).toMatchObject({ model: 'veo-3.1-generate-preview', apiKey: 'gm-a', prompt: 'a paper boat on a river', durationSeconds: 4, downloads: 1, storageDownloads: 1, storageSawKey: false });
    expect(op.parameters).toEqual({ aspectRatio: '16:9', resolution: '720p', durationSeconds: 4, negativePrompt: 'rain' });
    expect(op.polls).toBeGreaterThanOrEqual(2);
    const url = new URL(task.video_url!);
    const bytes = Buffer.from(await (await fetch(`${server.directUrl}${url.pathname}${url.search}`)).arrayBuffer());
    expect([bytes.length, bytes.subarray(4, 8).toString('latin1')]).toEqual([48 * 1024, 'ftyp']);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 4 * Math.round(0.4 * 1_000_000) });
  });

  it('sends first and last frames and reference images as bytesBase64Encoded with referenceType ASSET', async () => {
    const c = await customer();
    const frame = dataUrl(await png(128, 72));
    const frames = await createVideo(c.key, { seconds: 8, firstFrame: frame, lastFrame: frame });
    expect(frames.status).toBe(202);
    expect((await waitVideoFinished(server, c.key, frames.body.id)).task.status).toBe('completed');
    const a = await operationOf(frames.body.id);
    expect([a.image?.shape, a.lastFrame?.shape, a.image?.width, a.durationSeconds]).toEqual(['bytesBase64Encoded', 'bytesBase64Encoded', 128, 8]);

    const refs = await createVideo(c.key, { seconds: 8, referenceImages: [frame, frame, frame] });
    expect(refs.status).toBe(202);
    expect((await waitVideoFinished(server, c.key, refs.body.id)).task.status).toBe('completed');
    const b = await operationOf(refs.body.id);
    expect(b.referenceImages.map((r) => [r.shape, r.referenceType])).toEqual(Array(3).fill(['bytesBase64Encoded', 'ASSET']));
  });

  it('refuses at creation, before any charge or upstream call, what Veo cannot run', async () => {
    const c = await customer();
    const submits = fake.counts.submit;
    const frame = dataUrl(await png(64, 36));
    const cases: [Record<string, unknown>, string][] = [
      [{ resolution: '1080p', seconds: 4 }, 'unsupported_duration'],
      [{ firstFrame: frame, lastFrame: frame, seconds: 6 }, 'unsupported_duration'],
      [{ referenceImages: [frame], seconds: 4 }, 'unsupported_duration'],
      [{ generate_audio: false }, 'audio_always_on'],
    ];
    for (const [overrides, code] of cases) {
      const res = await createVideo(c.key, overrides);
      expect([res.status, res.body.error?.code], JSON.stringify(overrides).slice(0, 60)).toEqual([400, code]);
    }
    expect(fake.counts.submit).toBe(submits);
    expect(await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  });

  it('publishes the constraints in /v1/videos/capabilities', async () => {
    const c = await customer();
    const { data } = await server.client(c.key).GET('/v1/videos/capabilities');
    const veo = data!.items.find((m) => m.model === VEO_31.id)!;
    expect(veo.audio).toMatchObject({ alwaysOn: true });
    expect(veo.durationConstraints).toEqual([
      { when: { resolutions: ['1080p', '4k'] }, durations: [8] },
      { when: { lastFrame: true }, durations: [8] },
      { when: { referenceImages: true }, durations: [8] },
    ]);
  });

  it('fails a filtered video with content_policy_violation and refunds it', async () => {
    const c = await customer();
    const created = await createVideo(c.key, { prompt: 'veo-filter this' });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('failed');
    expect(task.error).toMatchObject({ code: 'content_policy_violation' });
    expect(task.error!.message).toContain('You have not been charged');
    expect(task.billing).toMatchObject({ actualCredits: 0 });
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('fails, without submitting again, a submit answered 200 with an error envelope, and refunds it', async () => {
    const c = await customer();
    const submits = fake.counts.submit;
    // A relay's way of refusing: Google's error envelope, with status 200.
    fake.faults.push('submit', { status: 200, body: { error: { code: 400, message: 'Request contains an invalid argument.', status: 'INVALID_ARGUMENT' } } });
    const created = await createVideo(c.key);
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('failed');
    expect(task.error).toEqual({ code: 'upstream_rejected', message: 'Request contains an invalid argument.' });
    expect(fake.counts.submit - submits).toBe(1);
    const row = await server.db.selectFrom('videoTasks').select(['upstreamJobId']).where('id', '=', created.body.id).executeTakeFirstOrThrow();
    expect(row.upstreamJobId).toBeNull();
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('fails a video whose operation ended in an error, and refunds it', async () => {
    const c = await customer();
    const created = await createVideo(c.key, { prompt: 'veo-fail this' });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('failed');
    expect(task.error).toMatchObject({ code: 'upstream_error' });
    expect(task.error!.message).toContain('internal error');
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('blames the upstream, not the client, for an operation that ended in FAILED_PRECONDITION (gRPC 9), and refunds it', async () => {
    const c = await customer();
    const created = await createVideo(c.key, { prompt: 'veo-precondition this' });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('failed');
    expect(task.error).toMatchObject({ code: 'upstream_error' });
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });
});

describe('gemini images and member slots', () => {
  it('counts each parallel call against the member\'s limit: two n=2 requests on a limit of 2 run one after the other, each charged n × price', async () => {
    const c = await customer([{ name: 'a', key: 'gm-a', concurrencyLimit: 2 }]);
    fake.holdMs = 300;
    fake.maxInFlight = 0;
    const results = await Promise.all([1, 2].map((i) => post(c.key, '/v1/images/generations', { model: NANO_BANANA.id, prompt: `two bananas ${i}`, n: 2 })));
    expect(results.map((r) => [r.status, r.body.data?.length])).toEqual([
      [200, 2],
      [200, 2],
    ]);
    // Four calls in all, never more than two at once: the second request waited for the first's slots.
    expect(fake.maxInFlight).toBe(2);
    for (const r of results) {
      expect(await holdOf(server.db, r.taskId!)).toMatchObject({ status: 'captured', captured: 2 * Math.round(0.039 * 1_000_000) });
      const row = await server.db.selectFrom('imageTasks').select(['memberId', 'memberSlots']).where('id', '=', r.taskId!).executeTakeFirstOrThrow();
      expect(row).toEqual({ memberId: c.ids.a, memberSlots: 2 });
    }
  });
});
