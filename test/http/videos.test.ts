import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAccount, createApiKey, createCustomer, createGroup, createMember, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { accountState as accountStateOf } from '../support/tasks.ts';

let server: TestServer;
let png: string;

beforeAll(async () => {
  server = await startTestServer({
    env: { MAX_MEDIA_INPUT_COUNT: '4', MAX_MEDIA_INPUT_BYTES: '200000', JSON_BODY_LIMIT_BYTES: '2000000' },
    // 'providers without an adapter' needs a kind this build cannot run: kling's adapters are taken out.
    overrides: { providers: { kling: { image: undefined, video: undefined } } },
  });
  await seedCatalog(server.db);
  const bytes = await sharp({ create: { width: 64, height: 36, channels: 3, background: '#3366aa' } }).png().toBuffer();
  png = `data:image/png;base64,${bytes.toString('base64')}`;
});
afterAll(async () => server?.close());

let seq = 0;
const crid = () => `req-${Date.now()}-${++seq}`;

/** A valid request for local-video-1 (per_second, 0.12/s at 720p). */
function body(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return { client_request_id: crid(), prompt: 'a red fox running through snow', model: 'local-video-1', seconds: 4, aspectRatio: '16:9', resolution: '720p', ...overrides };
}

async function post(key: string, payload: unknown, path = '/v1/videos/generations') {
  const res = await fetch(`${server.directUrl}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(payload),
  });
  return { status: res.status, headers: res.headers, body: (await res.json()) as Record<string, any> };
}

const accountState = (accountId: string, apiKeyId: string) => accountStateOf(server.db, accountId, apiKeyId);

describe('GET /v1/videos/capabilities (§2.7)', () => {
  it('lists only models the key can see, with billing rows, quote tokens, limits and no-store', async () => {
    const c = await createCustomer(server.db, { models: ['local-video-1', 'local-video-audio', 'local-image-1'] });
    const { data, response } = await server.client(c.key).GET('/v1/videos/capabilities');
    expect(response.status).toBe(200);
    expect(response.headers.get('cache-control')).toBe('no-store');
    expect(data?.limits).toEqual({ maxMediaInputCount: 4, maxMediaInputBytes: 200000 });
    expect(data?.items.map((i) => i.model)).toEqual(['local-video-1', 'local-video-audio']);
    const v1 = data!.items[0]!;
    expect(v1).toMatchObject({
      displayName: expect.any(String),
      durations: [2, 4, 6, 8],
      aspectRatios: ['16:9', '9:16', '1:1'],
      resolutions: ['360p', '480p', '720p'],
      input: { frames: 'first-and-optional-last', referenceImages: { maxCount: 10, configurable: true }, framesAndReferencesMutuallyExclusive: true },
      audio: { supported: true, defaultEnabled: false },
      configuredReachable: true,
    });
    expect(v1.billing.map((b) => b.resolution)).toEqual(['360p', '480p', '720p']);
    expect(v1.billing[2]).toMatchObject({ kind: 'current_quote', mode: 'per_second', unit: 'second', unitPrice: 0.12, creditsPerSecond: 0.12 });
    expect(v1.billing[2]!.quoteToken).toMatch(/^q1\./);
    const audio = data!.items[1]!;
    expect(audio.audio).toEqual({ supported: true, defaultEnabled: true, alwaysOn: false });
    expect(audio.durationConstraints).toEqual([]);
    expect(audio.billing[0]).toEqual({ kind: 'current_quote', resolution: '480p', mode: 'per_item', unit: 'item', unitPrice: 1, quoteToken: expect.any(String) });
    expect(JSON.stringify(data)).not.toMatch(/mem_|credential/);
  });

  it('does not list a model that only a disabled member serves (§4.7: only models visible to the key), and creating it is 503 no_reachable_member', async () => {
    const account = await createAccount(server.db);
    const group = await createGroup(server.db);
    await createMember(server.db, group.id, { models: ['local-video-lite'], enabled: false });
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    const { data } = await server.client(key.key).GET('/v1/videos/capabilities');
    expect(data?.items).toEqual([]);
    expect((await server.client(key.key).GET('/v1/models')).data?.data).toEqual([]);
    const res = await post(key.key, body({ model: 'local-video-lite', resolution: '360p', seconds: 2, aspectRatio: '1:1' }));
    // The group lists it, but no enabled member serves it (as for images: ErrorCode's no_reachable_member).
    expect(res.status).toBe(503);
    expect(res.body.error.code).toBe('no_reachable_member');
  });
});

describe('POST /v1/videos/generations (§4.6)', () => {
  it('creates a queued task with 202, the create shape and a billing snapshot, and holds the quote', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const { data, response } = await server.client(c.key).POST('/v1/videos/generations', { body: body() as never });
    expect(response.status).toBe(202);
    expect(response.headers.get('cache-control')).toBe('no-store');
    expect(data).toEqual({
      object: 'video.task',
      id: expect.stringMatching(/^vid_/),
      task_id: data!.id,
      generation_id: data!.id,
      status: 'queued',
      model: 'local-video-1',
      duration: 4,
      duration_seconds: 4,
      aspectRatio: '16:9',
      aspect_ratio: '16:9',
      resolution: '720p',
      generateAudio: false,
      generate_audio: false,
      billing: { kind: 'snapshot', mode: 'per_second', unit: 'second', unitPrice: 0.12, creditsPerSecond: 0.12, durationSeconds: 4, quotedCredits: 0.48, actualCredits: 0 },
    });
    const state = await accountState(c.accountId, c.apiKeyId);
    expect(state).toMatchObject({ balance: 9_520_000, creditsUsed: 480_000, tasks: 1 });
    expect(state.holds).toEqual([{ amount: 480_000, status: 'held' }]);
  });

  it('bills per_item models once, and uses the model audio default', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await post(c.key, body({ model: 'local-video-audio', seconds: 8, resolution: '480p' }));
    expect(res.status).toBe(202);
    expect(res.body.generate_audio).toBe(true);
    expect(res.body.billing).toEqual({ kind: 'snapshot', mode: 'per_item', unit: 'item', unitPrice: 1, durationSeconds: 8, quotedCredits: 1, actualCredits: 0 });
  });

  it('is also reachable at /api/v1/videos/generations', async () => {
    const c = await createCustomer(server.db);
    const res = await post(c.key, body(), '/api/v1/videos/generations');
    expect(res.status).toBe(202);
    expect(res.body.object).toBe('video.task');
  });

  it('POST /v1/videos is not a creation endpoint', async () => {
    const c = await createCustomer(server.db);
    const res = await post(c.key, body(), '/v1/videos');
    expect(res.status).toBe(404);
    expect(res.body.error.code).toBe('video_creation_endpoint_moved');
    expect(res.body.error.message).toContain('/v1/videos/generations');
    expect((await accountState(c.accountId, c.apiKeyId)).tasks).toBe(0);
  });

  it('accepts every alias spelling and a decimal integer string for seconds', async () => {
    const c = await createCustomer(server.db);
    const res = await post(c.key, {
      clientRequestIdRequired: crid(),
      prompt: 'x',
      model: 'local-video-1',
      seconds: '6',
      duration: 6,
      duration_seconds: 6,
      aspect_ratio: '9:16',
      aspectRatio: '9:16',
      resolution: '360p',
      generateAudio: true,
      negativePrompt: 'blur',
      negative_prompt: 'blur',
    });
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ duration: 6, aspectRatio: '9:16', generateAudio: true });
  });

  const rejections: [string, Record<string, unknown>, number, string, string | null][] = [
    ['disagreeing duration aliases', { seconds: 4, duration: 6 }, 400, 'alias_conflict', 'duration'],
    ['disagreeing ratio aliases', { aspect_ratio: '9:16' }, 400, 'alias_conflict', 'aspect_ratio'],
    ['disagreeing client_request_id aliases', { clientRequestIdRequired: 'other' }, 400, 'alias_conflict', 'clientRequestIdRequired'],
    ['an unsupported duration', { seconds: 5 }, 400, 'unsupported_duration', 'seconds'],
    ['an unsupported ratio', { aspectRatio: '4:3' }, 400, 'unsupported_aspect_ratio', 'aspectRatio'],
    ['an unsupported resolution', { resolution: '1080p' }, 400, 'unsupported_resolution', 'resolution'],
    ['an upper-case resolution', { resolution: '720P' }, 400, 'invalid_request', 'resolution'],
    ['a composite model id', { model: 'local-video-1-8s-720p' }, 400, 'composite_model_id', 'model'],
    ['a composite model id with a ratio', { model: 'local-video-1_16:9' }, 400, 'composite_model_id', 'model'],
    ['an unknown model', { model: 'no-such-model' }, 404, 'model_not_found', 'model'],
    ['an image model', { model: 'local-image-1' }, 404, 'model_not_found', 'model'],
    ['audio on a model without audio', { model: 'local-video-lite', resolution: '360p', seconds: 2, generate_audio: true }, 400, 'audio_not_supported', 'generate_audio'],
    ['lastFrame without firstFrame', { lastFrame: 'PNG' }, 400, 'last_frame_requires_first_frame', 'lastFrame'],
    ['frames with reference images', { firstFrame: 'PNG', referenceImages: ['PNG'] }, 400, 'frames_with_reference_images', 'referenceImages'],
    ['frames on a none model', { model: 'local-video-lite', resolution: '360p', seconds: 2, firstFrame: 'PNG' }, 400, 'frames_not_supported', 'firstFrame'],
    ['a last frame on a first-only model', { model: 'local-video-audio', resolution: '480p', firstFrame: 'PNG', lastFrame: 'PNG' }, 400, 'last_frame_not_supported', 'lastFrame'],
    ['more media inputs than the limit', { referenceImages: ['PNG', 'PNG', 'PNG', 'PNG', 'PNG'] }, 413, 'too_many_media_inputs', null],
    ['an image that is neither a data URL, a file id nor an https URL', { firstFrame: 'ftp://example.com/a.png' }, 400, 'invalid_data_url', 'firstFrame'],
    ['corrupt base64', { firstFrame: 'data:image/png;base64,@@@notbase64' }, 400, 'invalid_data_url', 'firstFrame'],
    // The gateway's name for an image the body carried is no value of its own (it would stand for that image).
    ['an identity of staged bytes sent as a value', { firstFrame: 'PNG', lastFrame: `sha256:${'0'.repeat(64)}` }, 400, 'invalid_data_url', 'lastFrame'],
    ['a composite model id after a colon', { model: 'local-video-1:720p' }, 400, 'composite_model_id', 'model'],
    ['undecodable image bytes', { firstFrame: `data:image/png;base64,${Buffer.from('not an image at all').toString('base64')}` }, 400, 'invalid_image', 'firstFrame'],
    ['a non-https reference video', { reference_videos: ['http://example.com/v.mp4'] }, 400, 'invalid_media_url', 'reference_videos[0]'],
    ['a non-https callback', { callback_url: 'http://example.com/hook' }, 400, 'invalid_callback_url', 'callback_url'],
    ['a loopback callback', { callback_url: 'https://127.0.0.1/hook' }, 400, 'invalid_callback_url', 'callback_url'],
    ['a localhost callback', { callbackUrl: 'https://localhost:8443/hook' }, 400, 'invalid_callback_url', 'callback_url'],
    ['a private-network callback', { callback_url: 'https://10.1.2.3/hook' }, 400, 'invalid_callback_url', 'callback_url'],
    ['a link-local (metadata) callback', { callback_url: 'https://169.254.169.254/latest' }, 400, 'invalid_callback_url', 'callback_url'],
    ['an IPv6 loopback callback', { callback_url: 'https://[::1]/hook' }, 400, 'invalid_callback_url', 'callback_url'],
    ['a prompt over 32,000 characters', { prompt: 'x'.repeat(32_001) }, 400, 'invalid_request', 'prompt'],
    ['a negative prompt over 8,000 characters', { negative_prompt: 'x'.repeat(8001) }, 400, 'invalid_request', 'negative_prompt'],
    ['a client_request_id over 128 characters', { client_request_id: 'x'.repeat(129) }, 400, 'invalid_request', 'client_request_id'],
    ['seconds as a non-integer string', { seconds: '4.5' }, 400, 'invalid_request', 'seconds'],
    ['an unknown field', { colour: 'red' }, 400, 'invalid_request', 'colour'],
  ];

  it.each(rejections)('rejects %s with %i %s and creates or holds nothing', async (_name, overrides, status, code, param) => {
    const c = await createCustomer(server.db);
    const payload = body(overrides);
    for (const k of ['firstFrame', 'lastFrame']) if (payload[k] === 'PNG') payload[k] = png;
    if (Array.isArray(payload.referenceImages)) payload.referenceImages = (payload.referenceImages as string[]).map((v) => (v === 'PNG' ? png : v));
    const res = await post(c.key, payload);
    expect(res.status).toBe(status);
    expect(res.body.error.code).toBe(code);
    if (param !== null) expect(res.body.error.param).toBe(param);
    const state = await accountState(c.accountId, c.apiKeyId);
    expect(state).toMatchObject({ balance: 100_000_000, creditsUsed: 0, tasks: 0, holds: [] });
  });

  it("takes seconds as a decimal integer string, leading zeros included; a value of neither form is told both forms", async () => {
    const c = await createCustomer(server.db);
    const padded = await post(c.key, body({ seconds: '04' }));
    expect(padded.status).toBe(202);
    expect(padded.body.billing).toMatchObject({ durationSeconds: 4, quotedCredits: 0.48 });
    // The same duration under the alias agrees with it.
    expect((await post(c.key, body({ seconds: '004', duration: 4 }))).status).toBe(202);
    for (const seconds of ['4.5', '0', '00', 'four', 0, 4.5]) {
      const res = await post(c.key, body({ seconds }));
      expect([res.status, res.body.error.code, res.body.error.param]).toEqual([400, 'invalid_request', 'seconds']);
    }
    const res = await post(c.key, body({ seconds: '4.5' }));
    expect(res.body.error.message).toBe(`Invalid 'seconds': must be integer, or must match pattern "^0*[1-9][0-9]*$".`);
  });

  it('accepts a prompt, negative prompt and client_request_id of exactly their maximum length in characters, multibyte ones included', async () => {
    const c = await createCustomer(server.db);
    // 'é' is 2 bytes of UTF-8 and '🎬' 4 bytes (2 UTF-16 code units): each is one character of the limit.
    const ofLength = (n: number) => `é🎬${'x'.repeat(n - 2)}`;
    const fields = { prompt: ofLength(32_000), negative_prompt: ofLength(8000), client_request_id: ofLength(128) };
    const res = await post(c.key, body(fields));
    expect(res.status).toBe(202);
    const row = await server.db.selectFrom('videoTasks').select(['prompt', 'negativePrompt', 'clientRequestId']).where('id', '=', res.body.id).executeTakeFirstOrThrow();
    expect(row).toEqual({ prompt: fields.prompt, negativePrompt: fields.negative_prompt, clientRequestId: fields.client_request_id });
  });

  it('rejects more reference images than the model allows', async () => {
    const c = await createCustomer(server.db);
    const res = await post(c.key, body({ model: 'local-video-audio', resolution: '480p', referenceImages: [png, png, png, png].slice(0, 4) }));
    // 4 media inputs is at the configured count limit; the model allows 3.
    expect(res.status).toBe(400);
    expect(res.body.error.code).toBe('too_many_reference_images');
  });

  it("answers a model of the other kind with 404 model_not_found naming the endpoint it belongs to, and one the key cannot see as unknown", async () => {
    const c = await createCustomer(server.db);
    const asVideo = await post(c.key, body({ model: 'local-image-1' }));
    expect([asVideo.status, asVideo.body.error.code, asVideo.body.error.param]).toEqual([404, 'model_not_found', 'model']);
    expect(asVideo.body.error.message).toBe("'local-image-1' is an image model, not a video model: make images with POST /v1/images/generations (or /v1/images/edits).");
    const asImage = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'local-video-1', prompt: 'a fox' }),
    });
    const image = (await asImage.json()) as { error: { code: string; message: string } };
    expect([asImage.status, image.error.code, image.error.message]).toEqual([404, 'model_not_found', "'local-video-1' is a video model, not an image model: make videos with POST /v1/videos/generations."]);
    // A model of the other kind this key's group does not list stays unknown.
    const group = await createGroup(server.db);
    await createMember(server.db, group.id, { models: ['local-video-1'] });
    const videoOnly = await createApiKey(server.db, { accountId: c.accountId, groupId: group.id });
    const unknown = await post(videoOnly.key, body({ model: 'local-image-1' }));
    expect([unknown.status, unknown.body.error.message]).toEqual([404, "Video model 'local-image-1' does not exist or is not available to this key."]);
  });

  it('counts the same reference images under both spellings once against the media input limit', async () => {
    const c = await createCustomer(server.db);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const form = new FormData();
      form.append('purpose', 'input');
      form.append('file', new Blob([Buffer.from(png.split(',')[1]!, 'base64')], { type: 'image/png' }), `ref-${i}.png`);
      const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
      ids.push(((await res.json()) as { id: string }).id);
    }
    // Three inputs (the model's reference-image limit), under the limit of 4, spelled twice.
    const both = await post(c.key, body({ model: 'local-video-audio', resolution: '480p', referenceImages: ids, reference_images: ids }));
    expect([both.status, both.body.error?.code]).toEqual([202, undefined]);
    // Two that disagree are one field that disagrees with itself, not five inputs.
    const other = await post(c.key, body({ model: 'local-video-audio', resolution: '480p', referenceImages: ids, reference_images: [ids[0], ids[1], ids[0]] }));
    expect([other.status, other.body.error?.code]).toEqual([400, 'alias_conflict']);
  });

  it('enforces the media byte limit', async () => {
    const c = await createCustomer(server.db);
    const big = await sharp({ create: { width: 400, height: 400, channels: 3, background: '#123456' } })
      .png({ compressionLevel: 0 })
      .toBuffer();
    const res = await post(c.key, body({ firstFrame: `data:image/png;base64,${big.toString('base64')}` }));
    expect(res.status).toBe(413);
    expect(res.body.error.code).toBe('media_total_too_large');
  });

  it('refuses a body larger than the server takes with 413 body_too_large, never a crash', async () => {
    const c = await createCustomer(server.db);
    // Media inputs have limits of their own; the rest of the JSON has the body limit.
    const res = await post(c.key, body({ pad: 'A'.repeat(2_100_000) }));
    expect(res.status).toBe(413);
    expect(res.body.error.code).toBe('body_too_large');
    expect((await accountState(c.accountId, c.apiKeyId)).tasks).toBe(0);
    const health = await fetch(`${server.directUrl}/healthz`);
    expect(health.status).toBe(200);
  });

  it('follows an administrator changing the reference-image limit and the price', async () => {
    const c = await createCustomer(server.db, { models: ['local-video-1'] });
    const before = await server.client(c.key).GET('/v1/videos/capabilities');
    const oldToken = before.data!.items[0]!.billing.find((b) => b.resolution === '360p')!.quoteToken;
    const admin = server.admin();
    const patched = await admin.PATCH('/admin/v1/models/{model_id}', {
      params: { path: { model_id: 'local-video-1' } },
      body: {
        reference_image_max_count: 1,
        pricing: [
          { resolution: '360p', quality: null, mode: 'per_second', unit_price: 0.07 },
          { resolution: '480p', quality: null, mode: 'per_second', unit_price: 0.08 },
          { resolution: '720p', quality: null, mode: 'per_second', unit_price: 0.12 },
        ],
      },
    });
    expect(patched.response.status).toBe(200);
    try {
      const after = await server.client(c.key).GET('/v1/videos/capabilities');
      expect(after.data!.items[0]!.input.referenceImages).toEqual({ maxCount: 1, configurable: true });
      expect(after.data!.items[0]!.billing.find((b) => b.resolution === '360p')!.unitPrice).toBe(0.07);
      const tooMany = await post(c.key, body({ resolution: '360p', referenceImages: [png, png] }));
      expect(tooMany.status).toBe(400);
      expect(tooMany.body.error.code).toBe('too_many_reference_images');
      const stale = await post(c.key, body({ resolution: '360p', quote_token: oldToken }));
      expect(stale.status).toBe(409);
      expect(stale.body.currentQuote.unitPrice).toBe(0.07);
    } finally {
      await admin.PATCH('/admin/v1/models/{model_id}', {
        params: { path: { model_id: 'local-video-1' } },
        body: {
          reference_image_max_count: 10,
          pricing: [
            { resolution: '360p', quality: null, mode: 'per_second', unit_price: 0.05 },
            { resolution: '480p', quality: null, mode: 'per_second', unit_price: 0.08 },
            { resolution: '720p', quality: null, mode: 'per_second', unit_price: 0.12 },
          ],
        },
      });
    }
  });

  it('accepts frames and reference images as data URLs and reports only mode and count on lookup', async () => {
    const c = await createCustomer(server.db);
    const frames = await post(c.key, body({ firstFrame: png, lastFrame: png }));
    expect(frames.status).toBe(202);
    const refs = await post(c.key, body({ referenceImages: [png, png], reference_videos: ['https://example.com/v.mp4'] }));
    expect(refs.status).toBe(202);
    const a = await server.client(c.key).GET('/v1/videos/{id}', { params: { path: { id: frames.body.id } } });
    expect(a.data?.input).toEqual({ mode: 'first_and_last_frame', count: 2 });
    const b = await server.client(c.key).GET('/v1/videos/{id}', { params: { path: { id: refs.body.id } } });
    // The image inputs only (the contract: "Number of image inputs"): the reference video is not one.
    expect(b.data?.input).toEqual({ mode: 'reference_images', count: 2 });
    const textWithMedia = await post(c.key, body({ reference_videos: ['https://example.com/v.mp4'], reference_audios: ['https://example.com/a.mp3'] }));
    expect(textWithMedia.status).toBe(202);
    const t = await server.client(c.key).GET('/v1/videos/{id}', { params: { path: { id: textWithMedia.body.id } } });
    expect(t.data?.input).toEqual({ mode: 'text', count: 0 });
    expect(JSON.stringify(a.data)).not.toContain('base64');
  });
});

describe('quotes', () => {
  async function quoteFor(key: string, model: string, resolution: string) {
    const { data } = await server.client(key).GET('/v1/videos/capabilities');
    return data!.items.find((i) => i.model === model)!.billing.find((b) => b.resolution === resolution)!;
  }

  it('accepts a current quote token', async () => {
    const c = await createCustomer(server.db);
    const q = await quoteFor(c.key, 'local-video-1', '720p');
    const res = await post(c.key, body({ quote_token: q.quoteToken }));
    expect(res.status).toBe(202);
  });

  it('rejects a token of another key, model or resolution with 400 quote_mismatch, and garbage with quote_invalid', async () => {
    const c = await createCustomer(server.db);
    const other = await createCustomer(server.db);
    const otherKeys = await quoteFor(other.key, 'local-video-1', '720p');
    const otherRes = await quoteFor(c.key, 'local-video-1', '480p');
    const otherModel = await quoteFor(c.key, 'local-video-audio', '720p');
    for (const token of [otherKeys.quoteToken, otherRes.quoteToken, otherModel.quoteToken]) {
      const res = await post(c.key, body({ quote_token: token }));
      expect(res.status).toBe(400);
      expect(res.body.error.code).toBe('quote_mismatch');
    }
    const forged = otherKeys.quoteToken.slice(0, -3) + 'abc';
    for (const token of ['nonsense', forged]) {
      const res = await post(c.key, body({ quoteToken: token }));
      expect(res.body.error.code).toBe('quote_invalid');
    }
    expect((await accountState(c.accountId, c.apiKeyId)).tasks).toBe(0);
  });

  it('answers 409 quote_stale with the latest currentQuote after a price change, and nothing is held', async () => {
    const c = await createCustomer(server.db, { models: ['local-video-lite'] });
    const q = await quoteFor(c.key, 'local-video-lite', '360p');
    await server.db.updateTable('modelPrices').set({ unitPrice: 30_000 }).where('modelId', '=', 'local-video-lite').execute();
    try {
      const res = await post(c.key, body({ model: 'local-video-lite', resolution: '360p', seconds: 2, quote_token: q.quoteToken }));
      expect(res.status).toBe(409);
      expect(res.body.error).toMatchObject({ code: 'quote_stale', type: 'conflict_error' });
      // Its currentQuote is bound to the key: never cached (product spec §4).
      expect(res.headers.get('cache-control')).toBe('no-store');
      expect(res.body.currentQuote).toMatchObject({ kind: 'current_quote', resolution: '360p', mode: 'per_second', unitPrice: 0.03, creditsPerSecond: 0.03 });
      expect(await accountState(c.accountId, c.apiKeyId)).toMatchObject({ balance: 100_000_000, creditsUsed: 0, tasks: 0 });
      const retry = await post(c.key, body({ model: 'local-video-lite', resolution: '360p', seconds: 2, quote_token: res.body.currentQuote.quoteToken }));
      expect(retry.status).toBe(202);
      expect(retry.body.billing.quotedCredits).toBe(0.06);
    } finally {
      await server.db.updateTable('modelPrices').set({ unitPrice: 20_000 }).where('modelId', '=', 'local-video-lite').execute();
    }
  });

  it('answers 409 quote_expired for an expired token', async () => {
    const short = await startTestServer({ env: { QUOTE_TTL_SECONDS: '1' } });
    try {
      await seedCatalog(short.db);
      const c = await createCustomer(short.db);
      const { data } = await short.client(c.key).GET('/v1/videos/capabilities');
      const token = data!.items[0]!.billing.find((b) => b.resolution === '720p')!.quoteToken;
      await new Promise((r) => setTimeout(r, 2100));
      const res = await fetch(`${short.directUrl}/v1/videos/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
        body: JSON.stringify(body({ quote_token: token })),
      });
      const json = (await res.json()) as Record<string, any>;
      expect(res.status).toBe(409);
      expect(json.error.code).toBe('quote_expired');
      expect(json.currentQuote.quoteToken).not.toBe(token);
    } finally {
      await short.close();
    }
  });
});

describe('credits gates', () => {
  it('rejects with 402 insufficient_balance and holds nothing', async () => {
    const c = await createCustomer(server.db, { balance: 0.4 });
    const res = await post(c.key, body());
    expect(res.status).toBe(402);
    expect(res.body.error).toMatchObject({ code: 'insufficient_balance', type: 'insufficient_credits' });
    expect(await accountState(c.accountId, c.apiKeyId)).toMatchObject({ balance: 400_000, creditsUsed: 0, tasks: 0, holds: [] });
  });

  it('rejects with 402 key_quota_exceeded and holds nothing', async () => {
    const c = await createCustomer(server.db, { balance: 100, creditLimit: 0.3 });
    const res = await post(c.key, body());
    expect(res.status).toBe(402);
    expect(res.body.error.code).toBe('key_quota_exceeded');
    expect(await accountState(c.accountId, c.apiKeyId)).toMatchObject({ balance: 100_000_000, creditsUsed: 0, tasks: 0 });
  });
});

describe('idempotency', () => {
  it('returns the original task and billing for a retry, even after a price change', async () => {
    const c = await createCustomer(server.db, { models: ['local-video-lite'] });
    const payload = body({ model: 'local-video-lite', resolution: '360p', seconds: 4 });
    const first = await post(c.key, payload);
    await server.db.updateTable('modelPrices').set({ unitPrice: 90_000 }).where('modelId', '=', 'local-video-lite').execute();
    try {
      const again = await post(c.key, payload);
      expect(again.status).toBe(202);
      expect(again.body).toEqual(first.body);
      expect(again.body.billing.unitPrice).toBe(0.02);
    } finally {
      await server.db.updateTable('modelPrices').set({ unitPrice: 20_000 }).where('modelId', '=', 'local-video-lite').execute();
    }
    expect((await accountState(c.accountId, c.apiKeyId)).holds).toHaveLength(1);
  });

  it('is scoped to the owning account: another account may reuse the same client_request_id', async () => {
    const a = await createCustomer(server.db);
    const b = await createCustomer(server.db);
    const id = crid();
    const ra = await post(a.key, body({ client_request_id: id }));
    const rb = await post(b.key, body({ client_request_id: id }));
    expect(ra.body.id).not.toBe(rb.body.id);
  });

  it('50 concurrent identical creates make one task and one hold, and fifty 202s with the same id', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const payload = body();
    const results = await Promise.all(Array.from({ length: 50 }, () => post(c.key, payload)));
    expect(results.map((r) => r.status)).toEqual(Array(50).fill(202));
    expect(new Set(results.map((r) => r.body.id)).size).toBe(1);
    const state = await accountState(c.accountId, c.apiKeyId);
    expect(state.tasks).toBe(1);
    expect(state.holds).toEqual([{ amount: 480_000, status: 'held' }]);
    expect(state.balance).toBe(100_000_000 - 480_000);
  });

  it.each([
    ['the last credits of the balance', { balance: 0.48 }, {}],
    ['the last credits of the key quota', { balance: 100, creditLimit: 0.48 }, {}],
    ['the one generation the key may have in flight', { balance: 100 }, { maxInFlight: 1 }],
  ])('concurrent identical creates that use up %s are all the one task: twins get 202, not the refusal the first one caused', async (_what, customer, key) => {
    const c = await createCustomer(server.db, customer);
    if ('maxInFlight' in key) await server.db.updateTable('apiKeys').set({ maxInFlight: key.maxInFlight }).where('id', '=', c.apiKeyId).execute();
    const payload = body();
    const results = await Promise.all(Array.from({ length: 10 }, () => post(c.key, payload)));
    expect(results.map((r) => [r.status, r.body.error?.code])).toEqual(Array(10).fill([202, undefined]));
    expect(new Set(results.map((r) => r.body.id)).size).toBe(1);
    const state = await accountState(c.accountId, c.apiKeyId);
    expect([state.tasks, state.holds]).toEqual([1, [{ amount: 480_000, status: 'held' }]]);
    // Another request is still refused for the limit it meets.
    const other = await post(c.key, body());
    expect(other.status).toBe('maxInFlight' in key ? 429 : 402);
  });
});

describe('a composite id of a model the key cannot use', () => {
  it("is 404 model_not_found like the model itself: the error never tells a key what other groups are sold or the operator disabled", async () => {
    const account = await createAccount(server.db);
    const mine = await createGroup(server.db);
    const theirs = await createGroup(server.db);
    await createMember(server.db, mine.id, { models: ['local-video-1'] });
    await createMember(server.db, theirs.id, { models: ['local-video-lite'] });
    const key = await createApiKey(server.db, { accountId: account.id, groupId: mine.id });
    const codes = async (model: string) => {
      const res = await post(key.key, body({ model }));
      return [model, res.status, res.body.error?.code];
    };
    expect(await codes('local-video-lite')).toEqual(['local-video-lite', 404, 'model_not_found']);
    expect(await codes('local-video-lite-4s')).toEqual(['local-video-lite-4s', 404, 'model_not_found']);
    expect(await codes('no-such-model-4s')).toEqual(['no-such-model-4s', 404, 'model_not_found']);
    // Its own model's composite id is still refused as one.
    expect(await codes('local-video-1-4s')).toEqual(['local-video-1-4s', 400, 'composite_model_id']);
  });
});

describe('providers without an adapter', () => {
  it('a member of a provider this build cannot run makes nothing reachable: not listed, not reachable, 503 on create', async () => {
    const account = await createAccount(server.db);
    const group = await createGroup(server.db);
    await createMember(server.db, group.id, { provider: 'kling', models: ['local-video-lite', 'local-image-1'], credentials: Buffer.from('sealed') });
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    expect((await server.client(key.key).GET('/v1/models')).data?.data).toEqual([]);
    const caps = await server.client(key.key).GET('/v1/videos/capabilities');
    expect(caps.data?.items.map((i) => [i.model, i.configuredReachable])).toEqual([['local-video-lite', false]]);
    const res = await post(key.key, body({ model: 'local-video-lite', resolution: '360p', seconds: 2, aspectRatio: '1:1' }));
    expect([res.status, res.body.error.code]).toEqual([503, 'no_reachable_member']);
    expect((await accountState(account.id, key.id)).tasks).toBe(0);
  });
});

describe('Cache-Control on the video endpoints\' errors (§4: no-store on video task endpoints)', () => {
  it('is no-store on a refused listing, whether the validator or the service refuses it, and on a refused create', async () => {
    const c = await createCustomer(server.db);
    const other = await createCustomer(server.db);
    const foreign = await post(other.key, body());
    for (const query of ['limit=0', 'status=bogus', 'foo=1', `after=${foreign.body.id}`]) {
      const res = await fetch(`${server.directUrl}/v1/videos?${query}`, { headers: { Authorization: `Bearer ${c.key}` } });
      expect([query, res.status, res.headers.get('cache-control')]).toEqual([query, 400, 'no-store']);
    }
    const refused = await fetch(`${server.directUrl}/v1/videos/generations`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: 'x' }) });
    expect([refused.status, refused.headers.get('cache-control')]).toEqual([400, 'no-store']);
  });
});

describe('GET /v1/videos/{id} (§4.8)', () => {
  it('returns the lookup shape to the owner only; 404 for another account or an unknown id', async () => {
    const owner = await createCustomer(server.db);
    const stranger = await createCustomer(server.db);
    const created = await post(owner.key, body());
    const { data, response } = await server.client(owner.key).GET('/v1/videos/{id}', { params: { path: { id: created.body.id } } });
    expect(response.status).toBe(200);
    expect(response.headers.get('cache-control')).toBe('no-store');
    expect(data).toMatchObject({ ...created.body, input: { mode: 'text', count: 0 } });
    expect(data?.created_at).toMatch(/^\d{4}-\d\d-\d\dT/);
    expect(data).not.toHaveProperty('completed_at');
    expect(data).not.toHaveProperty('video_url');
    for (const [key, id] of [
      [stranger.key, created.body.id],
      [owner.key, 'vid_doesnotexist'],
    ] as const) {
      const res = await server.client(key).GET('/v1/videos/{id}', { params: { path: { id } } });
      expect(res.response.status).toBe(404);
      expect(res.error?.error.code).toBe('task_not_found');
    }
  });

  it('rejects ids longer than 128 characters', async () => {
    const c = await createCustomer(server.db);
    const res = await fetch(`${server.directUrl}/v1/videos/${'v'.repeat(129)}`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(res.status).toBe(400);
  });

  it('renders legacy tasks without inventing a price or quote', async () => {
    const c = await createCustomer(server.db);
    await server.db
      .insertInto('videoTasks')
      .values({
        id: 'vid_legacy1',
        accountId: c.accountId,
        apiKeyId: c.apiKeyId,
        groupId: c.groupId,
        clientRequestId: 'legacy-1',
        model: 'local-video-1',
        prompt: 'imported',
        durationSeconds: 5,
        aspectRatio: '16:9',
        resolution: '720p',
        generateAudio: false,
        inputMode: 'text',
        billingKind: 'legacy',
        actualCredits: 1_500_000,
        deadlineAt: new Date(Date.now() + 3600_000),
        status: 'queued',
      })
      .execute();
    const { data } = await server.client(c.key).GET('/v1/videos/{id}', { params: { path: { id: 'vid_legacy1' } } });
    expect(data?.billing).toEqual({ kind: 'legacy', unitPrice: null, quotedCredits: null, durationSeconds: 5, actualCredits: 1.5 });
  });
});
