/**
 * The Gemini fake against upstream-apis.md §3, §3.6, §4 and the §8 checklist, spoken to with plain
 * fetch (never through an adapter): auth answers, the official size table, thought parts, HTTP-200
 * blocks, SSE frames without event names, RetryInfo rate limits without Retry-After, both Veo
 * image shapes and duration types, the 8 s rules, operations and the 302 download.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGeminiFake, type GeminiFake } from '../fakes/gemini.ts';

let fake: GeminiFake;
beforeAll(async () => {
  fake = await startGeminiFake();
});
afterAll(async () => fake.close());

const KEY = { 'x-goog-api-key': 'gm-test', 'content-type': 'application/json' };
let png: string;
beforeAll(async () => {
  png = (await sharp({ create: { width: 64, height: 36, channels: 3, background: '#336699' } }).png().toBuffer()).toString('base64');
});

async function generate(model: string, body: unknown, init: { headers?: Record<string, string>; stream?: boolean } = {}) {
  const method = init.stream ? 'streamGenerateContent?alt=sse' : 'generateContent';
  return fetch(`${fake.url}/v1beta/models/${model}:${method}`, { method: 'POST', headers: init.headers ?? KEY, body: JSON.stringify(body) });
}

const ask = (prompt: string, imageConfig?: Record<string, unknown>, extraParts: unknown[] = []) => ({
  contents: [{ role: 'user', parts: [{ text: prompt }, ...extraParts] }],
  generationConfig: { responseModalities: ['TEXT', 'IMAGE'], ...(imageConfig && { imageConfig }) },
});

async function sizeOf(b64: string) {
  const meta = await sharp(Buffer.from(b64, 'base64')).metadata();
  return `${meta.width}x${meta.height}`;
}

describe('Gemini fake: images', () => {
  it('answers an unknown key with 400 API_KEY_INVALID and a missing key with 403', async () => {
    const bad = await generate('gemini-2.5-flash-image', ask('x'), { headers: { 'x-goog-api-key': 'nope', 'content-type': 'application/json' } });
    expect(bad.status).toBe(400);
    const body = (await bad.json()) as { error: { status: string; details: { reason?: string }[] } };
    expect(body.error.status).toBe('INVALID_ARGUMENT');
    expect(body.error.details[0]!.reason).toBe('API_KEY_INVALID');
    const none = await generate('gemini-2.5-flash-image', ask('x'), { headers: { 'content-type': 'application/json' } });
    expect(none.status).toBe(403);
    // ?key= is accepted too.
    const query = await fetch(`${fake.url}/v1beta/models/gemini-2.5-flash-image:generateContent?key=gm-test`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask('x')) });
    expect(query.status).toBe(200);
  });

  it('refuses a known key with §3.6\'s 401 UNAUTHENTICATED or 403 PERMISSION_DENIED when told to', async () => {
    const other = await startGeminiFake({ apiKeys: ['gm-one', 'gm-two'] });
    try {
      const call = (key: string) => fetch(`${other.url}/v1beta/models/gemini-2.5-flash-image:generateContent`, { method: 'POST', headers: { 'x-goog-api-key': key, 'content-type': 'application/json' }, body: JSON.stringify(ask('x')) });
      other.refuseKey('gm-one', 401);
      other.refuseKey('gm-two', 403);
      const unauthenticated = await call('gm-one');
      expect(unauthenticated.status).toBe(401);
      expect(((await unauthenticated.json()) as any).error).toMatchObject({ code: 401, status: 'UNAUTHENTICATED' });
      const denied = await call('gm-two');
      expect(denied.status).toBe(403);
      const deniedBody = (await denied.json()) as any;
      expect(deniedBody.error).toMatchObject({ code: 403, status: 'PERMISSION_DENIED' });
      // Google's text quotes the key: an adapter must never pass it on.
      expect(deniedBody.error.message).toContain('gm-two');
      expect(other.calls).toHaveLength(0);
      other.refuseKey('gm-one', undefined);
      expect((await call('gm-one')).status).toBe(200);
      // An unknown key answered as UNAUTHENTICATED instead of API_KEY_INVALID.
      other.unknownKeyStatus = 401;
      expect(((await (await call('gm-nope')).json()) as any).error.status).toBe('UNAUTHENTICATED');
    } finally {
      await other.close();
    }
  });

  it('renders the official pixel table: 1:1 is 1024x1024, 3 Pro 2K 16:9 is 2752x1536', async () => {
    const flash = (await (await generate('gemini-2.5-flash-image', ask('a banana'))).json()) as any;
    const parts = flash.candidates[0].content.parts;
    expect(parts[0].text).toBeTypeOf('string');
    expect(await sizeOf(parts.at(-1).inlineData.data)).toBe('1024x1024');
    expect(parts.at(-1).thoughtSignature).toBeTypeOf('string');
    expect(flash.candidates[0].finishReason).toBe('STOP');
    expect(flash.usageMetadata.candidatesTokenCount).toBe(1290);
    const wide = (await (await generate('gemini-2.5-flash-image', ask('wide', { aspectRatio: '16:9' }))).json()) as any;
    expect(await sizeOf(wide.candidates[0].content.parts.at(-1).inlineData.data)).toBe('1344x768');
    const pro = (await (await generate('gemini-3-pro-image-preview', ask('pro', { aspectRatio: '16:9', imageSize: '2K' }))).json()) as any;
    const proParts = pro.candidates[0].content.parts;
    // Two interim thought images (no signature), then the final one.
    expect(proParts.filter((p: any) => p.thought === true)).toHaveLength(2);
    expect(proParts.filter((p: any) => p.thought === true).every((p: any) => p.thoughtSignature === undefined)).toBe(true);
    expect(await sizeOf(proParts.at(-1).inlineData.data)).toBe('2752x1536');
  });

  it('takes no imageSize at all on 2.5 Flash, not even 1K (§3.2)', async () => {
    const res = await generate('gemini-2.5-flash-image', ask('x', { imageSize: '1K' }));
    expect(res.status).toBe(400);
    const body = (await res.json()) as any;
    expect(body.error.status).toBe('INVALID_ARGUMENT');
    expect(body.error.details[0].fieldViolations[0].field).toBe('generation_config.image_config.image_size');
    expect((await generate('gemini-2.5-flash-image', ask('x', { aspectRatio: '16:9' }))).status).toBe(200);
  });

  it('renders 3.1 Flash\'s extreme ratios and its 512 size (half the 1K grid); 512 is 3.1 Flash only', async () => {
    const size = async (imageConfig: Record<string, unknown>) => {
      const res = await generate('gemini-3.1-flash-image-preview', ask('wide', imageConfig));
      expect(res.status, JSON.stringify(imageConfig)).toBe(200);
      return sizeOf(((await res.json()) as any).candidates[0].content.parts.at(-1).inlineData.data);
    };
    expect(await size({ aspectRatio: '1:4' })).toBe('512x2064');
    expect(await size({ aspectRatio: '8:1', imageSize: '2K' })).toBe('5856x704');
    expect(await size({ aspectRatio: '16:9', imageSize: '512' })).toBe('688x384');
    expect(await size({ aspectRatio: '1:1', imageSize: '512' })).toBe('512x512');
    const tokens = (((await (await generate('gemini-3.1-flash-image-preview', ask('t', { imageSize: '512' }))).json()) as any).usageMetadata.candidatesTokenCount);
    expect(tokens).toBe(747);
    expect((await generate('gemini-3-pro-image-preview', ask('x', { imageSize: '512' }))).status).toBe(400);
    expect((await generate('gemini-3-pro-image-preview', ask('x', { aspectRatio: '1:8' }))).status).toBe(400);
    expect((await generate('gemini-3.1-flash-image-preview', ask('x', { imageSize: '0.5K' }))).status).toBe(400);
  });

  it('refuses lowercase sizes, 2K on 2.5 Flash, unknown ratios and Vertex-only fields', async () => {
    expect((await generate('gemini-3-pro-image-preview', ask('x', { imageSize: '2k' }))).status).toBe(400);
    expect((await generate('gemini-2.5-flash-image', ask('x', { imageSize: '2K' }))).status).toBe(400);
    expect((await generate('gemini-2.5-flash-image', ask('x', { aspectRatio: '1:4' }))).status).toBe(400);
    expect((await generate('gemini-3.1-flash-image-preview', ask('x', { aspectRatio: '1:4' }))).status).toBe(200);
    const vertex = await generate('gemini-2.5-flash-image', ask('x', { outputMimeType: 'image/jpeg' }));
    expect(vertex.status).toBe(400);
    expect(((await vertex.json()) as any).error.message).toContain('Unknown name "outputMimeType"');
  });

  it('accepts snake_case inline_data, follows the input ratio, and limits input images per model', async () => {
    const edit = (await (await generate('gemini-2.5-flash-image', ask('edit', undefined, [{ inline_data: { mime_type: 'image/png', data: png } }]))).json()) as any;
    // 64x36 is nearest to 16:9.
    expect(await sizeOf(edit.candidates[0].content.parts.at(-1).inlineData.data)).toBe('1344x768');
    expect(fake.calls.at(-1)!.images).toEqual([{ mimeType: 'image/png', width: 64, height: 36, bytes: expect.any(Number) }]);
    const four = Array.from({ length: 4 }, () => ({ inlineData: { mimeType: 'image/png', data: png } }));
    expect((await generate('gemini-2.5-flash-image', ask('too many', undefined, four))).status).toBe(400);
    expect((await generate('gemini-3-pro-image-preview', ask('fine', undefined, four))).status).toBe(200);
  });

  it('answers blocks and text-only at HTTP 200', async () => {
    const prompt = (await (await generate('gemini-2.5-flash-image', ask('block-prompt'))).json()) as any;
    expect(prompt.promptFeedback.blockReason).toBe('SAFETY');
    expect(prompt.candidates).toBeUndefined();
    const image = (await (await generate('gemini-2.5-flash-image', ask('block-image'))).json()) as any;
    expect(image.candidates[0].finishReason).toBe('IMAGE_SAFETY');
    expect(image.candidates[0].content.parts).toEqual([]);
    const text = (await (await generate('gemini-2.5-flash-image', ask('text-only'))).json()) as any;
    expect(text.candidates[0].content.parts.every((p: any) => p.inlineData === undefined)).toBe(true);
    const none = await generate('gemini-2.5-flash-image', ask('no-image'));
    expect(none.status).toBe(200);
    const noneBody = (await none.json()) as any;
    expect(noneBody.candidates).toEqual([{ finishReason: 'NO_IMAGE', index: 0 }]);
    expect(fake.calls.at(-1)!.outcome).toBe('no-image');
  });

  it('streams bare data: frames with whole images, no event names and no [DONE]', async () => {
    fake.sseFraming = 'crlf';
    try {
      const res = await generate('gemini-3-pro-image-preview', ask('stream me'), { stream: true });
      expect(res.headers.get('content-type')).toBe('text/event-stream');
      const text = await res.text();
      expect(text).not.toContain('event:');
      expect(text).not.toContain('[DONE]');
      const frames = text.split(/\r\n\r\n/).filter(Boolean).map((f) => JSON.parse(f.replace(/^data: /, '')));
      expect(frames).toHaveLength(4); // text, two thoughts, the final image
      expect(frames.at(-1).candidates[0].finishReason).toBe('STOP');
      expect(await sizeOf(frames.at(-1).candidates[0].content.parts[0].inlineData.data)).toBe('1024x1024');
    } finally {
      fake.sseFraming = 'alternate';
    }
  });

  it('ends SSE frames with \\n\\n or \\r\\n\\r\\n, alternating per stream by default (§3.1: the SDK splits on both)', async () => {
    const texts: string[] = [];
    for (let i = 0; i < 2; i++) texts.push(await (await generate('gemini-2.5-flash-image', ask('framing'), { stream: true })).text());
    expect(fake.calls.slice(-2).map((c) => c.framing).sort()).toEqual(['crlf', 'lf']);
    const lf = texts[fake.calls.at(-2)!.framing === 'lf' ? 0 : 1]!;
    const crlf = texts[fake.calls.at(-2)!.framing === 'lf' ? 1 : 0]!;
    expect(lf).not.toContain('\r');
    expect(lf.split('\n\n').filter(Boolean)).toHaveLength(2); // the text, then the image with finishReason
    expect(crlf.split('\r\n\r\n').filter(Boolean)).toHaveLength(2);
    expect(crlf.replace(/\r\n/g, '')).not.toMatch(/[\r\n]/);
    fake.sseFraming = 'lf';
    try {
      await (await generate('gemini-2.5-flash-image', ask('framing'), { stream: true })).text();
      await (await generate('gemini-2.5-flash-image', ask('framing'), { stream: true })).text();
      expect(fake.calls.slice(-2).map((c) => c.framing)).toEqual(['lf', 'lf']);
    } finally {
      fake.sseFraming = 'alternate';
    }
  });

  it('breaks a stream off with an error frame after its 200 when told to (§3.1)', async () => {
    fake.streamErrorNext(1);
    const res = await generate('gemini-3-pro-image-preview', ask('breaks'), { stream: true });
    expect(res.status).toBe(200);
    const frames = (await res.text()).split(/\r?\n\r?\n/).filter(Boolean).map((f) => JSON.parse(f.replace(/^data: /, '')));
    expect(frames).toHaveLength(2);
    expect(frames[0].candidates[0].content.parts[0].text).toBeTypeOf('string');
    expect(frames[1]).toEqual({ error: { code: 500, message: expect.any(String), status: 'INTERNAL' } });
    expect(fake.calls.at(-1)!.streamError).toMatchObject({ status: 'INTERNAL' });
    // Only the next stream: a plain call is not affected, the one after streams whole.
    fake.streamErrorNext(0, { code: 429, message: 'Resource has been exhausted (e.g. check quota).', status: 'RESOURCE_EXHAUSTED' });
    expect((await generate('gemini-2.5-flash-image', ask('plain'))).status).toBe(200);
    const first = (await (await generate('gemini-2.5-flash-image', ask('stream'), { stream: true })).text()).split(/\r?\n\r?\n/).filter(Boolean);
    expect(first.map((f) => JSON.parse(f.replace(/^data: /, '')))).toEqual([{ error: { code: 429, message: expect.any(String), status: 'RESOURCE_EXHAUSTED' } }]);
    const whole = (await (await generate('gemini-2.5-flash-image', ask('stream'), { stream: true })).text()).split(/\r?\n\r?\n/).filter(Boolean);
    expect(whole).toHaveLength(2);
  });

  it('rate-limits with RetryInfo in the body and no Retry-After header; per-day quotas say PerDay', async () => {
    fake.rateLimitNext('generate', 17);
    const minute = await generate('gemini-2.5-flash-image', ask('x'));
    expect(minute.status).toBe(429);
    expect(minute.headers.get('retry-after')).toBeNull();
    const body = (await minute.json()) as any;
    expect(body.error.status).toBe('RESOURCE_EXHAUSTED');
    expect(body.error.details.find((d: any) => d['@type'].endsWith('RetryInfo')).retryDelay).toBe('17s');
    expect(body.error.details.find((d: any) => d['@type'].endsWith('QuotaFailure')).violations[0].quotaId).toContain('PerMinute');
    fake.rateLimitNext('generate', 3600, { perDay: true });
    const day = (await (await generate('gemini-2.5-flash-image', ask('x'))).json()) as any;
    expect(day.error.details[0].violations[0].quotaId).toContain('PerDay');
    fake.serverErrorNext('generate');
    const busy = (await (await generate('gemini-2.5-flash-image', ask('x'))).json()) as any;
    expect(busy.error).toMatchObject({ code: 503, status: 'UNAVAILABLE' });
    expect(busy.error.details).toBeUndefined();
  });
});

describe('Gemini fake: Veo', () => {
  const submit = (model: string, instance: unknown, parameters: unknown = {}) =>
    fetch(`${fake.url}/v1beta/models/${model}:predictLongRunning`, { method: 'POST', headers: KEY, body: JSON.stringify({ instances: [instance], parameters }) });

  it('accepts both image shapes and a string or number duration, and enforces the 8 s rules', async () => {
    const sdk = await submit('veo-3.1-generate-preview', { prompt: 'p', image: { bytesBase64Encoded: png, mimeType: 'image/png' } }, { durationSeconds: 6 });
    expect(sdk.status).toBe(200);
    const doc = await submit('veo-3.1-generate-preview', { prompt: 'p', image: { inlineData: { mimeType: 'image/png', data: png } } }, { durationSeconds: '4' });
    expect(doc.status).toBe(200);
    const ops = [...fake.operations.values()].slice(-2);
    expect(ops.map((o) => [o.image!.shape, o.durationSeconds])).toEqual([
      ['bytesBase64Encoded', 6],
      ['inlineData', 4],
    ]);
    expect((await submit('veo-3.1-generate-preview', { prompt: 'p' }, { resolution: '1080p', durationSeconds: 6 })).status).toBe(400);
    expect((await submit('veo-3.1-generate-preview', { prompt: 'p' }, { resolution: '1080p', durationSeconds: 8 })).status).toBe(200);
    const refs = Array.from({ length: 3 }, () => ({ image: { bytesBase64Encoded: png, mimeType: 'image/png' }, referenceType: 'asset' }));
    expect((await submit('veo-3.1-generate-preview', { prompt: 'p', referenceImages: refs }, { durationSeconds: 4 })).status).toBe(400);
    expect((await submit('veo-3.1-generate-preview', { prompt: 'p', referenceImages: refs }, { durationSeconds: 8 })).status).toBe(200);
    expect((await submit('veo-3.0-generate-001', { prompt: 'p', referenceImages: refs.slice(0, 1) }, { durationSeconds: 8 })).status).toBe(400);
    expect((await submit('veo-3.1-generate-preview', { prompt: 'p', lastFrame: { bytesBase64Encoded: png, mimeType: 'image/png' } })).status).toBe(400);
    expect((await submit('veo-3.1-generate-preview', { prompt: 'p' }, { generateAudio: true })).status).toBe(400);
    expect((await submit('veo-3.1-generate-preview', { prompt: 'p' }, { durationSeconds: 5 })).status).toBe(400);
  });

  it('runs an operation: done false, then a sample whose download redirects to storage without the key', async () => {
    const res = await submit('veo-3.1-fast-generate-preview', { prompt: 'a cat' }, { durationSeconds: 4 });
    const { name } = (await res.json()) as { name: string };
    expect(name).toMatch(/^models\/veo-3.1-fast-generate-preview\/operations\/\w+$/);
    const poll = async () => (await (await fetch(`${fake.url}/v1beta/${name}`, { headers: KEY })).json()) as any;
    expect(await poll()).toEqual({ name, done: false });
    const done = await poll();
    const uri = done.response.generateVideoResponse.generatedSamples[0].video.uri as string;
    expect(done.response['@type']).toContain('PredictLongRunningResponse');
    const redirect = await fetch(uri, { headers: KEY, redirect: 'manual' });
    expect(redirect.status).toBe(302);
    const location = redirect.headers.get('location')!;
    expect(new URL(location).origin).toBe(fake.storageUrl);
    const bytes = Buffer.from(await (await fetch(location)).arrayBuffer());
    expect(bytes.subarray(4, 8).toString('latin1')).toBe('ftyp');
    expect(fake.operations.get(name)!.storageSawKey).toBe(false);
  });

  it('finishes filtered operations without samples and failed ones with a gRPC code', async () => {
    const op = async (prompt: string) => {
      const { name } = (await (await submit('veo-3.0-generate-001', { prompt }, { durationSeconds: 8 })).json()) as { name: string };
      await fetch(`${fake.url}/v1beta/${name}`, { headers: KEY });
      return (await (await fetch(`${fake.url}/v1beta/${name}`, { headers: KEY })).json()) as any;
    };
    const filtered = await op('veo-filter');
    expect(filtered.done).toBe(true);
    expect(filtered.response.generateVideoResponse.raiMediaFilteredCount).toBe(1);
    expect(filtered.response.generateVideoResponse.generatedSamples).toBeUndefined();
    const failed = await op('veo-fail');
    expect(failed.error).toEqual({ code: 13, message: expect.any(String) });
  });
});
