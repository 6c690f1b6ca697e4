/**
 * Regression tests for the hardening findings, each through HTTP: malformed input never gets a
 * 5xx (NUL characters, undecodable content encodings, bad images), the outbound-URL guard
 * normalizes hosts, a reused client_request_id of another request is a conflict, and large bodies
 * held in memory (multipart edits) wait for a slot instead of piling up.
 */
import { request } from 'node:http';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import { randomBytes } from 'node:crypto';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { accountState, until } from '../support/tasks.ts';

type Json = Record<string, any>;
let server: TestServer;
let key: string;
let customer: Awaited<ReturnType<typeof createCustomer>>;
let png64: Buffer;

beforeAll(async () => {
  server = await startTestServer({ env: { LARGE_BODY_BYTES: '200000', LARGE_BODY_BUDGET_BYTES: '400000', LARGE_BODY_WAIT_MS: '400' } });
  await seedCatalog(server.db);
  customer = await createCustomer(server.db, { balance: 100 });
  key = customer.key;
  png64 = await sharp({ create: { width: 64, height: 64, channels: 3, background: '#3366aa' } }).png().toBuffer();
});
afterAll(async () => server?.close());

let seq = 0;
const crid = () => `hard-${Date.now()}-${++seq}`;
const videoBody = (extra: Record<string, unknown> = {}) => ({ client_request_id: crid(), prompt: 'a fox', model: 'local-video-1', seconds: 4, aspectRatio: '16:9', resolution: '720p', ...extra });
const dataUrl = (buf: Buffer) => `data:image/png;base64,${buf.toString('base64')}`;

async function send(path: string, init: { method?: string; body?: RequestInit['body']; headers?: Record<string, string> } = {}) {
  const res = await fetch(`${server.directUrl}${path}`, { method: init.method ?? 'POST', headers: { Authorization: `Bearer ${key}`, ...init.headers }, body: init.body });
  const text = await res.text();
  let body: Json = {};
  try {
    body = JSON.parse(text) as Json;
  } catch {
    // not JSON
  }
  return { status: res.status, headers: res.headers, body };
}
const postJson = (path: string, payload: unknown, headers: Record<string, string> = {}) =>
  send(path, { body: JSON.stringify(payload), headers: { 'Content-Type': 'application/json', ...headers } });

function multipart(fields: Record<string, string>, files: [string, Buffer][]) {
  const form = new FormData();
  for (const [k, v] of Object.entries(fields)) form.append(k, v);
  for (const [name, buf] of files) form.append(name, new Blob([buf], { type: 'image/png' }), `${name}.png`);
  return send('/v1/images/edits', { body: form });
}

const NUL = '\u0000';

describe('NUL characters are refused with 400 nul_character, naming the field', () => {
  it.each([
    ['image prompt', '/v1/images/generations', { model: 'local-image-1', prompt: `a${NUL}b` }, 'prompt'],
    ['image model', '/v1/images/generations', { model: `local-image-1${NUL}`, prompt: 'x' }, 'model'],
    ['JSON edit image reference', '/v1/images/edits', { model: 'local-image-1', prompt: 'x', images: [`file_${NUL}`] }, 'images[0]'],
    ['video prompt', '/v1/videos/generations', videoBody({ prompt: `a${NUL}` }), 'prompt'],
    ['video model', '/v1/videos/generations', videoBody({ model: `m${NUL}` }), 'model'],
    ['negative_prompt', '/v1/videos/generations', videoBody({ negative_prompt: NUL }), 'negative_prompt'],
    ['client_request_id', '/v1/videos/generations', videoBody({ client_request_id: `c${NUL}` }), 'client_request_id'],
    ['callback_url', '/api/v1/videos/generations', videoBody({ callback_url: `https://example.com/${NUL}` }), 'callback_url'],
    ['reference video URL', '/v1/videos/generations', videoBody({ reference_videos: [`https://example.com/${NUL}.mp4`] }), 'reference_videos[0]'],
    ['an unknown member', '/v1/videos/generations', videoBody({ [`x${NUL}`]: 1 }), `x${NUL}`],
  ])('%s', async (_name, path, payload, param) => {
    const res = await postJson(path, payload);
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ code: 'nul_character', param, type: 'invalid_request_error' });
  });

  it('in a multipart field', async () => {
    const res = await multipart({ model: 'local-image-1', prompt: `x${NUL}y` }, [['image', png64]]);
    expect([res.status, res.body.error?.code, res.body.error?.param]).toEqual([400, 'nul_character', 'prompt']);
  });

  it('in a path id or a query parameter', async () => {
    for (const path of ['/v1/videos/%00', '/v1/images/img_%00', '/v1/videos/vid_a%00b']) {
      const res = await send(path, { method: 'GET' });
      expect([res.status, res.body.error?.code]).toEqual([400, 'nul_character']);
    }
    const file = await send('/v1/files/file_x?expires=1&signature=a%00b', { method: 'GET' });
    expect([file.status, file.body.error?.code, file.body.error?.param]).toEqual([400, 'nul_character', 'signature']);
  });

  it('and nothing was created or held', async () => {
    expect(await accountState(server.db, customer.accountId, customer.apiKeyId)).toMatchObject({ tasks: 0, holds: [] });
  });
});

describe('a query parameter written with brackets', () => {
  it.each([
    ['/v1/videos?status[a]=b', 'status'],
    ['/v1/images?status[x]=completed', 'status'],
    ['/v1/videos?status%5B%5D=queued', 'status'],
    ['/v1/files?limit=2&purpose[0]=user_data', 'purpose'],
  ])('%s is 400 invalid_request naming it, never a 500', async (path, param) => {
    const res = await send(path, { method: 'GET' });
    expect([res.status, res.body.error?.code, res.body.error?.param, res.body.error?.type]).toEqual([400, 'invalid_request', param, 'invalid_request_error']);
  });

  it('on the operator API too', async () => {
    for (const path of ['/admin/v1/tasks?status[a]=b', '/admin/v1/webhook-deliveries?status[a]=b', '/admin/v1/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z&group_by[a]=model']) {
      const res = await send(path, { method: 'GET', headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
      expect([res.status, res.body.error?.code], path).toEqual([400, 'invalid_request']);
    }
  });

  it('a list written as the contract says still works', async () => {
    expect((await send('/v1/videos?status=queued,completed', { method: 'GET' })).status).toBe(200);
  });
});

describe('content encodings', () => {
  const generation = JSON.stringify({ model: 'local-image-1', prompt: 'x', n: 1, response_format: 'url' });

  it.each(['gzip', 'deflate', 'br'])('a %s body that does not decode is 400 invalid_content_encoding on every POST', async (encoding) => {
    for (const path of ['/v1/images/generations', '/v1/images/edits', '/v1/videos/generations', '/api/v1/videos/generations']) {
      const truncated = gzipSync(Buffer.from(generation)).subarray(0, 12);
      const res = await send(path, { body: encoding === 'gzip' ? truncated : Buffer.from('definitely not compressed'), headers: { 'Content-Type': 'application/json', 'Content-Encoding': encoding } });
      expect([path, res.status, res.body.error?.code]).toEqual([path, 400, 'invalid_content_encoding']);
    }
  });

  it('decodes valid gzip, deflate and br bodies', async () => {
    for (const [encoding, body] of [
      ['gzip', gzipSync(generation)],
      ['deflate', deflateSync(generation)],
      ['br', brotliCompressSync(generation)],
    ] as const) {
      const res = await send('/v1/images/generations', { body, headers: { 'Content-Type': 'application/json', 'Content-Encoding': encoding } });
      expect([encoding, res.status]).toEqual([encoding, 200]);
    }
  });

  it('a JSON body in a charset other than UTF-8 is 415 on every route alike, before anything is read or held; UTF-8 named as such passes', async () => {
    const state = async () => ({
      ...(await accountState(server.db, customer.accountId, customer.apiKeyId)),
      images: (await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', customer.accountId).execute()).length,
    });
    const before = await state();
    const generation = JSON.stringify({ model: 'local-image-1', prompt: 'a cat' });
    const cases: [string, string][] = [
      ['/v1/images/generations', generation],
      ['/v1/images/edits', JSON.stringify({ model: 'local-image-1', prompt: 'x', image: dataUrl(await sharp({ create: { width: 8, height: 8, channels: 3, background: '#fff' } }).png().toBuffer()) })],
      ['/v1/videos/generations', JSON.stringify(videoBody())],
    ];
    for (const [path, body] of cases) {
      for (const type of ['application/json; charset=ISO-8859-1', 'application/json;charset="latin1"', 'application/json; charset=utf-16', 'application/json; charset=utf8']) {
        const res = await send(path, { body, headers: { 'Content-Type': type } });
        expect([path, type, res.status, res.body.error?.code]).toEqual([path, type, 415, 'unsupported_media_type']);
        expect(res.body.error?.message).toMatch(/^Unsupported charset '(iso-8859-1|latin1|utf-16|utf8)': a JSON body is read as UTF-8/);
      }
    }
    // The admin API and the /api/v1 prefix, a PATCH and a `+json` type alike.
    const latin1 = { 'Content-Type': 'application/merge-patch+json; charset=latin1' };
    const patch = await send(`/admin/v1/accounts/${customer.accountId}`, { method: 'PATCH', body: JSON.stringify({ name: 'renamed' }), headers: { ...latin1, Authorization: `Bearer ${ADMIN_TOKEN}` } });
    expect([patch.status, patch.body.error?.code]).toEqual([415, 'unsupported_media_type']);
    const prefixed = await send('/api/v1/videos/generations', { body: JSON.stringify(videoBody()), headers: latin1 });
    expect([prefixed.status, prefixed.body.error?.code]).toEqual([415, 'unsupported_media_type']);
    expect(await state()).toEqual(before);
    // A request without a body is not read: its Content-Type does not matter.
    expect((await send('/v1/credits', { method: 'GET', headers: { 'Content-Type': 'application/json; charset=latin1' } })).status).toBe(200);
    // UTF-8, however the parameter is written (a charset inside another parameter's quotes is none).
    for (const type of ['application/json; charset=UTF-8', 'application/json;charset="utf-8"', 'application/json; charset="utf\\-8"', 'application/json; charset=utf-8; foo=bar', 'application/json; foo="a;charset=latin1"']) {
      const res = await send('/v1/images/generations', { body: generation, headers: { 'Content-Type': type } });
      expect([type, res.status]).toEqual([type, 200]);
    }
    const video = await send('/v1/videos/generations', { body: JSON.stringify(videoBody()), headers: { 'Content-Type': 'application/json; charset=utf-8' } });
    expect(video.status).toBe(202);
  });

  it('an unsupported encoding, or any encoding on a multipart body, is 415', async () => {
    const zstd = await send('/v1/images/generations', { body: 'x', headers: { 'Content-Type': 'application/json', 'Content-Encoding': 'zstd' } });
    expect([zstd.status, zstd.body.error?.code]).toEqual([415, 'unsupported_media_type']);
    const form = new FormData();
    form.append('model', 'local-image-1');
    form.append('prompt', 'x');
    const encoded = new Request('http://x', { method: 'POST', body: form });
    const res = await send('/v1/images/edits', {
      body: gzipSync(Buffer.from(await encoded.arrayBuffer())),
      headers: { 'Content-Type': encoded.headers.get('content-type')!, 'Content-Encoding': 'gzip' },
    });
    expect([res.status, res.body.error?.code]).toEqual([415, 'unsupported_media_type']);
  });
});

describe('bad images are 400 invalid_image before any provider call, and nothing is charged', () => {
  let truncated: Buffer;
  let tiny: Buffer;
  beforeAll(async () => {
    const noisy = await sharp(Buffer.from(Array.from({ length: 200 * 150 * 3 }, (_, i) => (i * 7919) % 256)), { raw: { width: 200, height: 150, channels: 3 } }).png().toBuffer();
    truncated = noisy.subarray(0, Math.floor(noisy.length / 2));
    tiny = await sharp({ create: { width: 1, height: 1, channels: 4, background: '#ff0000' } }).png().toBuffer();
  });

  it('in a multipart edit: an empty part, a truncated PNG, a 1×1 PNG', async () => {
    const before = await accountState(server.db, customer.accountId, customer.apiKeyId);
    for (const [name, image] of [
      ['empty', Buffer.alloc(0)],
      ['truncated', truncated],
      ['1x1', tiny],
    ] as const) {
      const res = await multipart({ model: 'local-image-1', prompt: 'x' }, [['image', image]]);
      expect([name, res.status, res.body.error?.code, res.body.error?.param]).toEqual([name, 400, 'invalid_image', 'image']);
    }
    const mask = await multipart({ model: 'local-image-1', prompt: 'x' }, [
      ['image', png64],
      ['mask', truncated],
    ]);
    expect([mask.status, mask.body.error?.code, mask.body.error?.param]).toEqual([400, 'invalid_image', 'mask']);
    expect(await accountState(server.db, customer.accountId, customer.apiKeyId)).toEqual(before);
    const tasks = await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', customer.accountId).where('operation', '=', 'edit').execute();
    expect(tasks).toEqual([]);
  });

  it('in a JSON edit and in video frames', async () => {
    const edit = await postJson('/v1/images/edits', { model: 'local-image-1', prompt: 'x', images: [dataUrl(truncated)] });
    expect([edit.status, edit.body.error?.code, edit.body.error?.param]).toEqual([400, 'invalid_image', 'images[0]']);
    const frame = await postJson('/v1/videos/generations', videoBody({ firstFrame: dataUrl(png64), lastFrame: dataUrl(tiny) }));
    expect([frame.status, frame.body.error?.code, frame.body.error?.param]).toEqual([400, 'invalid_image', 'lastFrame']);
    // The valid first frame, stored while the body was read, is removed once the request is over.
    const inputsLeft = () => server.db.selectFrom('files').select('id').where('accountId', '=', customer.accountId).where('purpose', '=', 'input').where('taskId', 'is', null).execute();
    await until(async () => (await inputsLeft()).length === 0, 3000, 'the staged inputs to be removed');
  });

  it('a small but valid image (16×16) is edited', async () => {
    const small = await sharp({ create: { width: 16, height: 16, channels: 3, background: '#00ff00' } }).png().toBuffer();
    const res = await multipart({ model: 'local-image-1', prompt: 'x' }, [['image', small]]);
    expect(res.status).toBe(200);
  });
});

describe('callback_url: one guard normalizes the host before classifying it', () => {
  it.each([
    'https://localhost./',
    'https://metadata.google.internal./computeMetadata/v1/',
    'https://LOCALHOST/',
    'https:///path',
    'https:example.com',
    'https://example.com:0/',
    'https://127.1/',
    'https://0x7f.0.0.1/',
    'https://2130706433/',
    'https://[::ffff:127.0.0.1]/',
    'https://[::1]/',
    'https://10.1.2.3/',
    'https://169.254.169.254/latest/meta-data/',
    'https://100.64.0.1/',
    'https://[fd00::1]/',
    'https://intranet/',
    'https://printer.local/',
    'https://user:pass@example.com/',
    'http://example.com/',
  ])('refuses %s', async (url) => {
    const res = await postJson('/v1/videos/generations', videoBody({ callback_url: url }));
    expect([res.status, res.body.error?.code, res.body.error?.param]).toEqual([400, 'invalid_callback_url', 'callback_url']);
  });

  it('tells a developer whose receiver is on this machine which setting allows it, and no one else', async () => {
    for (const url of ['http://localhost:4000/mediagate', 'https://127.0.0.1/hook', 'https://localhost:8443/hook', 'http://[::1]:4000/hook']) {
      const res = await postJson('/v1/videos/generations', videoBody({ callback_url: url }));
      expect([url, res.status, res.body.error?.message]).toEqual([url, 400, expect.stringContaining('needs the server started with ALLOW_PRIVATE_TARGETS=1')]);
    }
    for (const url of ['http://example.com/hook', 'https://10.1.2.3/hook', 'https://intranet/hook']) {
      const res = await postJson('/v1/videos/generations', videoBody({ callback_url: url }));
      expect([url, res.status, res.body.error?.message]).toEqual([url, 400, expect.not.stringContaining('ALLOW_PRIVATE_TARGETS')]);
    }
  });

  it('accepts a public https URL, also written with an IDN host or a trailing dot', async () => {
    for (const url of ['https://hooks.example.com/mediagate', 'https://bücher.example/hook', 'https://example.com./hook']) {
      const res = await postJson('/v1/videos/generations', videoBody({ callback_url: url }));
      expect([url, res.status]).toEqual([url, 202]);
    }
  });
});

describe('idempotency: a reused client_request_id', () => {
  it('returns the original task for the same request (aliases may differ; quote_token does not count)', async () => {
    const id = crid();
    const first = await postJson('/v1/videos/generations', videoBody({ client_request_id: id }));
    expect(first.status).toBe(202);
    const same = await postJson('/v1/videos/generations', { clientRequestIdRequired: id, prompt: 'a fox', model: 'local-video-1', duration: 4, aspect_ratio: '16:9', resolution: '720p' });
    expect([same.status, same.body.id]).toEqual([202, first.body.id]);
    const withToken = await postJson('/v1/videos/generations', videoBody({ client_request_id: id, quote_token: 'q1.whatever.sig' }));
    expect([withToken.status, withToken.body.id]).toEqual([202, first.body.id]);
  });

  it.each([
    ['prompt', { prompt: 'a wolf' }],
    ['duration', { seconds: 8 }],
    ['resolution', { resolution: '480p' }],
    ['audio', { generate_audio: true }],
    // Compared as sent (the contract): local-video-1's default is off, but leaving it out is another request.
    ['audio, sent at the model\'s default', { generate_audio: false }],
    ['callback_url', { callback_url: 'https://hooks.example.com/x' }],
    ['a frame', { firstFrame: 'data:image/png;base64,AAAA' }],
  ])('is 409 idempotency_conflict when the %s differs, and changes nothing', async (_name, change) => {
    const id = crid();
    const first = await postJson('/v1/videos/generations', videoBody({ client_request_id: id }));
    const before = await accountState(server.db, customer.accountId, customer.apiKeyId);
    const other = await postJson('/v1/videos/generations', videoBody({ client_request_id: id, ...change }));
    expect(other.status).toBe(409);
    expect(other.body.error).toMatchObject({ code: 'idempotency_conflict', param: 'client_request_id', type: 'conflict_error' });
    expect(other.body.error.message).toContain(first.body.id);
    // The error is as uncacheable as the task endpoints' answers (product spec §4).
    expect(other.headers.get('cache-control')).toBe('no-store');
    expect(await accountState(server.db, customer.accountId, customer.apiKeyId)).toEqual(before);
  });
});

describe('large bodies wait for a slot', () => {
  /** A multipart edit of `bytes` (multipart edits are held in memory, so they take the large-body budget). */
  function multipartEdit(bytes: number): { payload: Buffer; contentType: string } {
    const boundary = 'mg-hardening-boundary';
    const head = Buffer.from(
      `--${boundary}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nx\r\n` +
        `--${boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nlocal-image-1\r\n` +
        `--${boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\nContent-Type: image/png\r\n\r\n`,
    );
    const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
    return { payload: Buffer.concat([head, Buffer.alloc(bytes, 7), tail]), contentType: `multipart/form-data; boundary=${boundary}` };
  }

  const budgetInUse = () => server.ctx.services.largeBodies.inUse;

  /**
   * Starts a large multipart edit of `as` that sends only its first bytes and then stalls; resolves
   * once the server holds its Content-Length of the large-body budget, at most its account's share.
   */
  async function stalledLargeBody(as = key): Promise<{ done: Promise<number>; finish: () => void }> {
    const before = budgetInUse();
    const url = new URL(`${server.directUrl}/v1/images/edits`);
    const { payload, contentType } = multipartEdit(250_000);
    let finish: () => void = () => undefined;
    const done = new Promise<number>((resolve, reject) => {
      const req = request(
        { host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { Authorization: `Bearer ${as}`, 'Content-Type': contentType, 'Content-Length': payload.length } },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      req.on('error', reject);
      req.write(payload.subarray(0, 1000));
      finish = () => req.end(payload.subarray(1000));
    });
    const takes = Math.min(payload.length, server.ctx.services.largeBodies.opts.budgetBytes);
    await until(() => budgetInUse() === before + takes, 5_000, 'the stalled upload to hold its length of the budget');
    return { done, finish: () => finish() };
  }

  it("a large multipart body past its account's share is 429 too_many_in_flight, past the budget 503 server_busy, with Retry-After, while small requests pass", async () => {
    const first = await stalledLargeBody();
    const small = await send('/v1/credits', { method: 'GET' });
    expect(small.status).toBe(200);
    const big = multipartEdit(300_000);
    // The account already holds a large body: its next one would pass its share (half the budget), refused at once.
    const own = await send('/v1/images/edits', { body: big.payload, headers: { 'Content-Type': big.contentType } });
    expect([own.status, own.body.error.code, own.headers.get('retry-after')]).toEqual([429, 'too_many_in_flight', '1']);
    // Another account's large body does not fit what is left of the budget: it waits, then 503.
    const late = await createCustomer(server.db, { balance: 100 });
    const second = await send('/v1/images/edits', { body: big.payload, headers: { 'Content-Type': big.contentType, Authorization: `Bearer ${late.key}` } });
    expect(second.status).toBe(503);
    expect(second.body.error.code).toBe('server_busy');
    expect(second.headers.get('retry-after')).toBe('1');
    // Streamed bodies (video creation) never wait: their memory does not grow with their size.
    const video = await postJson('/v1/videos/generations', videoBody({ pad: 'z'.repeat(300_000) }));
    expect([video.status, video.body.error?.code]).toEqual([400, 'invalid_request']);
    first.finish();
    // The stalled body is read once finished (400: its image is not an image), and the slot is free again.
    expect(await first.done).toBe(400);
    const third = await send('/v1/images/edits', { body: big.payload, headers: { 'Content-Type': big.contentType } });
    expect([third.status, third.body.error?.code]).toEqual([400, 'invalid_image']);
  });

  it('a small JSON edit naming large stored files takes their bytes of the budget: 503 while it is taken, then it runs', async () => {
    // Noise: a PNG of about 270 KB, over LARGE_BODY_BYTES (200 KB), uploaded once.
    const noisy = await sharp(randomBytes(300 * 300 * 3), { raw: { width: 300, height: 300, channels: 3 } }).png().toBuffer();
    expect(noisy.length).toBeGreaterThan(200_000);
    const form = new FormData();
    form.append('purpose', 'input');
    form.append('file', new Blob([noisy], { type: 'image/png' }), 'big.png');
    const up = await send('/v1/files', { body: form });
    expect(up.status).toBe(201);
    const edit = { model: 'local-image-1', prompt: 'x', images: [up.body.id] };
    // A stalled multipart edit holds 250 KB of the 400 KB: the named file's bytes do not fit.
    const first = await stalledLargeBody();
    const busy = await postJson('/v1/images/edits', edit);
    expect([busy.status, busy.body.error?.code, busy.headers.get('retry-after')]).toEqual([503, 'server_busy', '1']);
    first.finish();
    expect(await first.done).toBe(400);
    // The named file is read once, to check it, and those bytes go upstream: not read again.
    const reads = vi.spyOn(server.ctx.services.files, 'readAll');
    try {
      const ran = await postJson('/v1/images/edits', edit);
      expect(ran.status, JSON.stringify(ran.body)).toBe(200);
      expect(reads.mock.calls.filter(([id]) => id === up.body.id)).toHaveLength(1);
    } finally {
      reads.mockRestore();
    }
  });

  it('a JSON edit whose data URL is over the large-body size takes its share of the budget once (its body is not counted as well)', async () => {
    // Noise: a PNG of about 270 KB; as a data URL the body is about 360 KB. Body and input together
    // (630 KB) would not fit the 400 KB budget, so counting both made the edit wait for itself.
    const noisy = await sharp(randomBytes(300 * 300 * 3), { raw: { width: 300, height: 300, channels: 3 } }).png().toBuffer();
    const edit = { model: 'local-image-1', prompt: 'x', images: [`data:image/png;base64,${noisy.toString('base64')}`] };
    expect(JSON.stringify(edit).length).toBeGreaterThan(200_000);
    const ran = await postJson('/v1/images/edits', edit);
    expect(ran.status, JSON.stringify(ran.body)).toBe(200);
    expect(budgetInUse()).toBe(0);
  });

  it('a large body that is not JSON is 400 invalid_json', async () => {
    const res = await send('/v1/videos/generations', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: `{"prompt":"${'x'.repeat(300_000)}` });
    expect([res.status, res.body.error.code]).toEqual([400, 'invalid_json']);
  });
});
