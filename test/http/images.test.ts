/**
 * Images end to end on the local provider (product spec §2.3, §2.4, §2.8, §4.3–§4.5, §6.1): pixel
 * sizes and formats read back with sharp, every rejection with its code, billing per image with
 * hold/capture/release, image tasks, async, streaming and its disconnects.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { LedgerRepository } from '../../server/repositories/ledger.repository.ts';

const holdAndInsertTask = LedgerRepository.prototype.holdAndInsertTask;
import { createApiKey, createCustomer, createGroup, createMember, seedCatalog } from '../support/factories.ts';
import { holdOf } from '../support/tasks.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({ workers: true });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

type Json = Record<string, any>;

async function post(key: string, path: string, body: unknown, headers: Record<string, string> = {}, on: TestServer = server) {
  const res = await fetch(`${on.directUrl}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, body: (res.headers.get('content-type')?.includes('json') ? JSON.parse(text) : {}) as Json };
}

const generate = (key: string, body: Json, headers: Record<string, string> = {}) => post(key, '/v1/images/generations', { prompt: 'a cat in a hat', model: 'local-image-1', ...body }, headers);

async function meta(b64: string) {
  const m = await sharp(Buffer.from(b64, 'base64')).metadata();
  return { format: m.format, width: m.width, height: m.height, hasAlpha: m.hasAlpha };
}

async function ledgerOf(taskId: string) {
  const hold = await holdOf(server.db, taskId);
  const task = await server.db.selectFrom('imageTasks').select(['status', 'delivered', 'actualCredits', 'quotedCredits']).where('id', '=', taskId).executeTakeFirst();
  return { hold, task };
}

function parseSse(text: string): { event: string; data: Json }[] {
  return text
    .split('\n\n')
    .filter((f) => f.trim())
    .map((frame) => {
      const event = /^event: (.+)$/m.exec(frame)?.[1] ?? '';
      const data = JSON.parse(/^data: (.+)$/m.exec(frame)?.[1] ?? '{}') as Json;
      return { event, data };
    });
}

async function png(width: number, height: number, color = '#336699', alpha = 1) {
  return sharp({ create: { width, height, channels: 4, background: { r: 0x33, g: 0x66, b: 0x99, alpha } } })
    .png()
    .toBuffer()
    .then((b) => (color ? b : b));
}

describe('POST /v1/images/generations', () => {
  it('returns a b64 PNG of table size 1K 1:1 by default, with X-Task-Id, and bills one image', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, {});
    expect(res.status).toBe(200);
    const taskId = res.headers.get('x-task-id')!;
    expect(taskId).toMatch(/^img_/);
    expect(res.body).toMatchObject({ created: expect.any(Number), output_format: 'png', size: '1248x1248', background: 'opaque' });
    expect(res.body.data).toHaveLength(1);
    expect(await meta(res.body.data[0].b64_json)).toMatchObject({ format: 'png', width: 1248, height: 1248 });
    expect(await ledgerOf(taskId)).toEqual({
      hold: { amount: 1_000_000, status: 'captured', captured: 1_000_000 },
      task: { status: 'completed', delivered: 1, actualCredits: 1_000_000, quotedCredits: 1_000_000 },
    });
    const account = await server.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', c.accountId).executeTakeFirstOrThrow();
    expect(account).toEqual({ balance: 9_000_000, totalSpent: 1_000_000 });
  });

  it.each([
    [{ aspectRatio: '16:9', resolution: '2K', output_format: 'jpeg' }, 'jpeg', 2048, 1152, 2],
    [{ aspect_ratio: '3:4', resolution: '1K', output_format: 'webp' }, 'webp', 944, 1248, 1],
    [{ aspectRatio: '21:9', resolution: '4K' }, 'png', 3840, 1648, 4],
    [{ size: '2048x1152' }, 'png', 2048, 1152, 2],
    [{ size: '1024x1024' }, 'png', 1024, 1024, 1],
    [{ size: '3840x1280' }, 'png', 3840, 1280, 4],
  ])('renders %o exactly as %s %ix%i and bills %i credits', async (params, format, width, height, credits) => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, params);
    expect(res.status).toBe(200);
    expect(await meta(res.body.data[0].b64_json)).toMatchObject({ format, width, height });
    expect((await ledgerOf(res.headers.get('x-task-id')!)).hold?.captured).toBe(credits * 1_000_000);
  });

  it('generates n images and bills n × price', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { n: 3 });
    expect(res.body.data).toHaveLength(3);
    const images = res.body.data.map((d: Json) => d.b64_json as string);
    expect(new Set(images).size).toBe(3);
    expect((await ledgerOf(res.headers.get('x-task-id')!)).hold).toEqual({ amount: 3_000_000, status: 'captured', captured: 3_000_000 });
  });

  it('prices quality tiers on the model that has them', async () => {
    const c = await createCustomer(server.db, { balance: 20 });
    for (const [quality, credits] of [['low', 1], ['medium', 2], ['high', 4], ['auto', 4]] as const) {
      const res = await generate(c.key, { model: 'local-image-pro', quality });
      expect(res.status).toBe(200);
      expect(res.body.quality).toBe(quality === 'auto' ? 'high' : quality);
      expect((await ledgerOf(res.headers.get('x-task-id')!)).hold?.captured).toBe(credits * 1_000_000);
    }
  });

  it('applies output_compression to jpeg and webp', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const none = await generate(c.key, { output_format: 'jpeg', output_compression: 0 });
    const max = await generate(c.key, { output_format: 'jpeg', output_compression: 95 });
    expect(Buffer.from(max.body.data[0].b64_json, 'base64').length).toBeLessThan(Buffer.from(none.body.data[0].b64_json, 'base64').length);
  });

  it('renders a transparent background on a model that supports it', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { model: 'local-image-pro', background: 'transparent', output_format: 'webp' });
    expect(res.status).toBe(200);
    expect(res.body.background).toBe('transparent');
    const buf = Buffer.from(res.body.data[0].b64_json, 'base64');
    const { data, info } = await sharp(buf).ensureAlpha().raw().toBuffer({ resolveWithObject: true });
    expect(info.channels).toBe(4);
    expect(data[3]).toBe(0); // top-left pixel fully transparent
  });

  it('returns a signed URL for response_format=url, served with the right Content-Type', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { response_format: 'url', output_format: 'webp' });
    const url = new URL(res.body.data[0].url);
    expect(res.body.data[0]).not.toHaveProperty('b64_json');
    const file = await fetch(`${server.directUrl}${url.pathname}${url.search}`);
    expect(file.status).toBe(200);
    expect(file.headers.get('content-type')).toBe('image/webp');
    expect((await sharp(Buffer.from(await file.arrayBuffer())).metadata()).width).toBe(1248);
  });

  const rejections: [string, Json, number, string, string | null][] = [
    ['an unknown model', { model: 'nope' }, 404, 'model_not_found', 'model'],
    ['a video model', { model: 'local-video-1' }, 404, 'model_not_found', 'model'],
    ['disagreeing ratio aliases', { aspectRatio: '16:9', aspect_ratio: '9:16' }, 400, 'alias_conflict', 'aspect_ratio'],
    ['an unsupported resolution', { resolution: '8K' }, 400, 'unsupported_resolution', 'resolution'],
    ['an unsupported ratio', { aspectRatio: '5:4' }, 400, 'unsupported_aspect_ratio', 'aspectRatio'],
    ['quality on a model without it', { quality: 'high' }, 400, 'quality_not_supported', 'quality'],
    ['compression with png', { output_compression: 50 }, 400, 'output_compression_requires_jpeg_or_webp', 'output_compression'],
    ['transparency on a model without it', { background: 'transparent' }, 400, 'background_not_supported', 'background'],
    ['transparency with jpeg', { model: 'local-image-pro', background: 'transparent', output_format: 'jpeg' }, 400, 'transparent_background_requires_png_or_webp', 'background'],
    ['a size edge below 256', { size: '240x3000' }, 400, 'invalid_size', 'size'],
    ['a size edge above 3840', { size: '3856x1024' }, 400, 'invalid_size', 'size'],
    ['too few pixels', { size: '768x768' }, 400, 'invalid_size', 'size'],
    ['a ratio over 3:1', { size: '3840x1264' }, 400, 'invalid_size', 'size'],
    ['edges not multiples of 16', { size: '1000x1000' }, 400, 'invalid_size', 'size'],
    ['a size disagreeing with aspectRatio', { size: '2048x1152', aspectRatio: '1:1' }, 400, 'size_conflict', 'size'],
    ['a size disagreeing with resolution', { size: '2048x1152', resolution: '1K' }, 400, 'size_conflict', 'size'],
    ['n over 10', { n: 11 }, 400, 'invalid_request', 'n'],
    ['output_compression over 100', { output_format: 'jpeg', output_compression: 101 }, 400, 'invalid_request', 'output_compression'],
    ['a prompt over 32,000 characters', { prompt: 'p'.repeat(32_001) }, 400, 'invalid_request', 'prompt'],
    ['an unknown response_format', { response_format: 'binary' }, 400, 'invalid_request', 'response_format'],
  ];

  it.each(rejections)('rejects %s with %i %s and charges nothing', async (_name, body, status, code, param) => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, body);
    expect(res.status).toBe(status);
    expect(res.body.error.code).toBe(code);
    if (param) expect(res.body.error.param).toBe(param);
    const tasks = await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).execute();
    expect(tasks).toEqual([]);
  });

  it('rejects size in favour of aspectRatio + resolution when the operator says so', async () => {
    const strict = await startTestServer({ env: { IMAGE_SIZE_PARAM: 'reject' } });
    try {
      await seedCatalog(strict.db);
      const c = await createCustomer(strict.db, { balance: 10 });
      for (const size of ['auto', '1248x1248', '1024x1024']) {
        const res = await fetch(`${strict.directUrl}/v1/images/generations`, {
          method: 'POST',
          headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
          body: JSON.stringify({ prompt: 'x', model: 'local-image-1', size }),
        });
        expect(res.status).toBe(400);
        expect(((await res.json()) as Json).error.code).toBe('size_not_accepted');
      }
      // An edit's `size: auto` too (multipart; it once kept the input's size instead), and nothing is charged.
      const form = new FormData();
      form.append('prompt', 'x');
      form.append('model', 'local-image-1');
      form.append('size', 'auto');
      form.append('image', new Blob([await sharp({ create: { width: 64, height: 64, channels: 3, background: '#336699' } }).png().toBuffer()], { type: 'image/png' }), 'a.png');
      const edit = await fetch(`${strict.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
      expect([edit.status, ((await edit.json()) as Json).error.code]).toEqual([400, 'size_not_accepted']);
      expect((await strict.db.selectFrom('accounts').select('balance').where('id', '=', c.accountId).executeTakeFirstOrThrow()).balance).toBe(10_000_000);
    } finally {
      await strict.close();
    }
  });

  it('rejects with 402 before any work when credits do not cover n × price', async () => {
    const c = await createCustomer(server.db, { balance: 2 });
    const res = await generate(c.key, { n: 3 });
    expect(res.status).toBe(402);
    expect(res.body.error.code).toBe('insufficient_balance');
    const limited = await createCustomer(server.db, { balance: 100, creditLimit: 1 });
    const quota = await generate(limited.key, { n: 2 });
    expect(quota.body.error.code).toBe('key_quota_exceeded');
  });

  it('answers 503 capability_disabled while image generation is switched off', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    await server.db.updateTable('capabilitySwitches').set({ enabled: false }).where('name', '=', 'image_generation').execute();
    try {
      const res = await generate(c.key, {});
      expect(res.status).toBe(503);
      expect(res.body.error.code).toBe('capability_disabled');
    } finally {
      await server.db.updateTable('capabilitySwitches').set({ enabled: true }).execute();
    }
  });
});

describe('image tasks (§2.4)', () => {
  it('GET returns the completed task with its data to the owner only', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const other = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { response_format: 'url' });
    const id = res.headers.get('x-task-id')!;
    const { data, response } = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: id } } });
    expect(response.status).toBe(200);
    expect(data).toMatchObject({ id, object: 'image.task', status: 'completed', model: 'local-image-1', completed: expect.any(Number), completed_at: expect.any(String) });
    expect(data!.data![0]!.url).toMatch(/\/v1\/files\/file_/);
    for (const [key, taskId] of [
      [other.key, id],
      [c.key, 'img_unknown'],
    ] as const) {
      const r = await server.client(key).GET('/v1/images/{task_id}', { params: { path: { task_id: taskId } } });
      expect(r.response.status).toBe(404);
      expect(r.error?.error.code).toBe('task_not_found');
    }
  });

  it('Prefer: respond-async answers 202 with a processing task that completes in the background', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { n: 2 }, { Prefer: 'respond-async' });
    expect(res.status).toBe(202);
    const id = res.headers.get('x-task-id')!;
    expect(res.headers.get('location')).toBe(`/v1/images/${id}`);
    expect(res.body).toMatchObject({ id, object: 'image.task', status: 'processing' });
    expect(res.body).not.toHaveProperty('completed');
    expect(res.body).not.toHaveProperty('data');
    let task: Json = res.body;
    for (let i = 0; i < 100 && task.status === 'processing'; i++) {
      await new Promise((r) => setTimeout(r, 100));
      task = (await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: id } } })).data as Json;
    }
    expect(task.status).toBe('completed');
    expect(task.data).toHaveLength(2);
    expect(await meta(task.data[0].b64_json)).toMatchObject({ width: 1248, height: 1248 });
    expect((await ledgerOf(id)).hold).toEqual({ amount: 2_000_000, status: 'captured', captured: 2_000_000 });
  });
});

describe('how the hold commits (HoldCommit)', () => {
  it('a synchronous or streamed image holds without waiting for the disk flush; a respond-async one, which the client polls, waits for it', async () => {
    const commits = new Map<string, unknown>();
    const spy = vi.spyOn(LedgerRepository.prototype, 'holdAndInsertTask').mockImplementation(async function (this: LedgerRepository, ...args) {
      commits.set(args[0].taskId, args[3]);
      return holdAndInsertTask.apply(this, args);
    });
    try {
      const c = await createCustomer(server.db, { balance: 10 });
      const sync = await generate(c.key, {});
      const streamed = await generate(c.key, { stream: true, partial_images: 1 });
      const queued = await generate(c.key, {}, { Prefer: 'respond-async' });
      expect([sync.status, streamed.status, queued.status]).toEqual([200, 200, 202]);
      expect(commits.get(sync.headers.get('x-task-id')!)).toBe('unflushed');
      expect(commits.get(streamed.headers.get('x-task-id')!)).toBe('unflushed');
      expect(commits.get(queued.headers.get('x-task-id')!)).toBe('flushed');
      // The sync answer came after its settlement: its task and capture are there to read.
      expect((await ledgerOf(sync.headers.get('x-task-id')!)).hold).toMatchObject({ status: 'captured' });
    } finally {
      spy.mockRestore();
    }
  });
});

describe('requests arriving together (group commit, db/statement-batcher.ts)', () => {
  it('share their hold and settlement statements and are each billed exactly: the balance covers 10 of 12', async () => {
    const ledger = server.ctx.repositories.ledger;
    const before = ledger.holdBatchStats();
    const c = await createCustomer(server.db, { balance: 10 });
    const answers = await Promise.all(Array.from({ length: 12 }, () => generate(c.key, { size: '1024x1024' })));
    const ok = answers.filter((a) => a.status === 200);
    expect(ok).toHaveLength(10);
    expect(answers.filter((a) => a.status === 402).map((a) => a.body.error.code)).toEqual(['insufficient_balance', 'insufficient_balance']);
    for (const a of ok) {
      expect(a.body.data).toHaveLength(1);
      expect(await ledgerOf(a.headers.get('x-task-id')!)).toEqual({
        hold: { amount: 1_000_000, status: 'captured', captured: 1_000_000 },
        task: { status: 'completed', delivered: 1, actualCredits: 1_000_000, quotedCredits: 1_000_000 },
      });
    }
    const account = await server.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', c.accountId).executeTakeFirstOrThrow();
    expect(account).toEqual({ balance: 0, totalSpent: 10_000_000 });
    // Every one of these holds went through the hold batcher (batched, alone, or alone after a refused batch).
    const after = ledger.holdBatchStats();
    expect(after.batched + after.singles - before.batched - before.singles).toBe(12);
    // /metrics shows the same counts.
    const metric = async (name: string) => Number(new RegExp(`${name}\\{statement="hold"\\} (\\d+)`).exec(await server.ctx.metrics.registry.getSingleMetricAsString(name))?.[1]);
    expect(await metric('mediagate_db_batched_requests_total')).toBe(after.batched);
    expect(await metric('mediagate_db_unbatched_requests_total')).toBe(after.singles);
  });
});

describe('streaming (§6.1)', () => {
  it('streams partial images and completed events per image, OpenAI-compatible', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { stream: true, partial_images: 2, n: 2 });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    const taskId = res.headers.get('x-task-id')!;
    const events = parseSse(res.text);
    expect(events.map((e) => `${e.event}:${e.data.image_index}:${e.data.partial_image_index ?? '-'}`)).toEqual([
      'image_generation.partial_image:0:0',
      'image_generation.partial_image:0:1',
      'image_generation.completed:0:-',
      'image_generation.partial_image:1:0',
      'image_generation.partial_image:1:1',
      'image_generation.completed:1:-',
    ]);
    for (const e of events) expect(e.data.type).toBe(e.event);
    expect(events[0]!.data).toMatchObject({ size: 'auto', quality: 'auto', background: 'auto', output_format: 'png', created_at: expect.any(Number) });
    expect(events[2]!.data).toMatchObject({ size: '1248x1248', background: 'opaque', output_format: 'png', usage: { total_tokens: 0 } });
    expect(await meta(events[2]!.data.b64_json)).toMatchObject({ format: 'png', width: 1248, height: 1248 });
    expect(await meta(events[0]!.data.b64_json)).toMatchObject({ width: 1248, height: 1248 });
    expect((await ledgerOf(taskId)).hold).toEqual({ amount: 2_000_000, status: 'captured', captured: 2_000_000 });
  });

  it('streams when Accept is text/event-stream, and delivers URLs for response_format=url', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { response_format: 'url' }, { Accept: 'text/event-stream' });
    const events = parseSse(res.text);
    expect(events.map((e) => e.event)).toEqual(['image_generation.completed']);
    expect(events[0]!.data.url).toMatch(/\/v1\/files\/file_/);
    expect(events[0]!.data).not.toHaveProperty('b64_json');
  });

  it('reads Accept as media types are read: in any case, and never streams what it refuses with q=0', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const mixed = await generate(c.key, {}, { Accept: 'application/json, Text/Event-Stream' });
    expect([mixed.status, mixed.headers.get('content-type')]).toEqual([200, 'text/event-stream; charset=utf-8']);
    const refused = await generate(c.key, {}, { Accept: 'application/json, text/event-stream;q=0' });
    expect(refused.status).toBe(200);
    expect(refused.headers.get('content-type')).toMatch(/^application\/json/);
    expect(refused.body.data).toHaveLength(1);
  });

  it('answers errors before the stream begins with the JSON error body', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { stream: true, model: 'nope' });
    expect(res.status).toBe(404);
    expect(res.body.error.code).toBe('model_not_found');
  });
});

describe('POST /v1/images/edits', () => {
  async function multipart(key: string, fields: Record<string, string>, files: [string, Buffer, string][]) {
    const form = new FormData();
    for (const [k, v] of Object.entries(fields)) form.append(k, v);
    for (const [name, buf, filename] of files) form.append(name, new Blob([buf], { type: 'image/png' }), filename);
    const res = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form });
    const text = await res.text();
    return { status: res.status, headers: res.headers, text, body: (res.headers.get('content-type')?.includes('json') ? JSON.parse(text) : {}) as Json };
  }

  it('edits an uploaded image inside the mask only, keeping its size', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const input = await sharp({ create: { width: 512, height: 384, channels: 3, background: '#20a020' } }).png().toBuffer();
    // Opaque mask with a transparent square in the middle: only the square is edited.
    const raw = Buffer.alloc(512 * 384 * 4);
    for (let y = 0; y < 384; y++)
      for (let x = 0; x < 512; x++) raw[(y * 512 + x) * 4 + 3] = x >= 156 && x < 356 && y >= 92 && y < 292 ? 0 : 255;
    const mask = await sharp(raw, { raw: { width: 512, height: 384, channels: 4 } }).png().toBuffer();
    const res = await multipart(c.key, { prompt: 'paint it', model: 'local-image-1' }, [
      ['image', input, 'in.png'],
      ['mask', mask, 'mask.png'],
    ]);
    expect(res.status).toBe(200);
    expect(res.headers.get('x-task-id')).toMatch(/^img_/);
    const out = Buffer.from(res.body.data[0].b64_json, 'base64');
    expect((await sharp(out).metadata()).width).toBe(512);
    const { data, info } = await sharp(out).removeAlpha().raw().toBuffer({ resolveWithObject: true });
    const px = (x: number, y: number) => Array.from(data.subarray((y * info.width + x) * 3, (y * info.width + x) * 3 + 3));
    const near = (a: number[], b: number[]) => a.every((v, i) => Math.abs(v - b[i]!) <= 6);
    expect(near(px(10, 10), [0x20, 0xa0, 0x20])).toBe(true);
    expect(near(px(256, 192), [0x20, 0xa0, 0x20])).toBe(false);
  });

  it('keeps the input size for size auto, and scales an oversized input into the size limits', async () => {
    const c = await createCustomer(server.db, { balance: 20 });
    const auto = await multipart(c.key, { prompt: 'x', model: 'local-image-1', size: 'auto' }, [['image', await png(640, 480), 'a.png']]);
    expect(await meta(auto.body.data[0].b64_json)).toMatchObject({ width: 640, height: 480 });
    const huge = await sharp({ create: { width: 4000, height: 3000, channels: 3, background: '#444444' } }).png().toBuffer();
    const big = await multipart(c.key, { prompt: 'x', model: 'local-image-1' }, [['image', huge, 'big.png']]);
    expect(big.status).toBe(200);
    const m = await meta(big.body.data[0].b64_json);
    expect(m.width! * m.height!).toBeLessThanOrEqual(8_294_400);
    expect(m.width! / m.height!).toBeCloseTo(4 / 3, 2);
    // Billed at the 4K tier (4 credits) by its pixel count.
    expect((await ledgerOf(big.headers.get('x-task-id')!)).hold?.captured).toBe(4_000_000);
  });

  it('accepts image[] and image_* fields, up to 16 files', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const a = await png(300, 300);
    const res = await multipart(c.key, { prompt: 'x', model: 'local-image-1', n: '2', output_format: 'jpeg' }, [
      ['image[]', a, 'a.png'],
      ['image[]', a, 'b.png'],
      ['image_3', a, 'c.png'],
    ]);
    expect(res.status).toBe(200);
    expect(res.body.data).toHaveLength(2);
    expect(await meta(res.body.data[1].b64_json)).toMatchObject({ format: 'jpeg', width: 300, height: 300 });
  });

  it('rejects 17 files, a mask of another size, an undecodable image and a missing image', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const a = await png(300, 300);
    const many = await multipart(c.key, { prompt: 'x', model: 'local-image-1' }, Array.from({ length: 17 }, (_, i) => ['image[]', a, `${i}.png`] as [string, Buffer, string]));
    expect([many.status, many.body.error.code]).toEqual([400, 'too_many_images']);
    const mismatch = await multipart(c.key, { prompt: 'x', model: 'local-image-1' }, [
      ['image', a, 'a.png'],
      ['mask', await png(200, 200, '', 0), 'm.png'],
    ]);
    expect([mismatch.status, mismatch.body.error.code, mismatch.body.error.param]).toEqual([400, 'mask_size_mismatch', 'mask']);
    const garbage = await multipart(c.key, { prompt: 'x', model: 'local-image-1' }, [['image', Buffer.from('not an image'), 'a.png']]);
    expect([garbage.status, garbage.body.error.code]).toEqual([400, 'invalid_image']);
    const none = await multipart(c.key, { prompt: 'x', model: 'local-image-1' }, []);
    expect([none.status, none.body.error.param]).toEqual([400, 'image']);
    const tasks = await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).execute();
    expect(tasks).toEqual([]);
  });

  it('accepts JSON edits with data URLs and ids of this account’s files, not another account’s', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const other = await createCustomer(server.db, { balance: 10 });
    const dataUrl = `data:image/png;base64,${(await png(320, 240)).toString('base64')}`;
    const byUrl = await post(c.key, '/v1/images/edits', { prompt: 'x', model: 'local-image-1', images: [dataUrl], response_format: 'url' });
    expect(byUrl.status).toBe(200);
    const fileId = new URL(byUrl.body.data[0].url).pathname.split('/').pop()!;
    const byId = await post(c.key, '/v1/images/edits', { prompt: 'again', model: 'local-image-1', images: [fileId] });
    expect(byId.status).toBe(200);
    expect(await meta(byId.body.data[0].b64_json)).toMatchObject({ width: 320, height: 240 });
    const foreign = await post(other.key, '/v1/images/edits', { prompt: 'x', model: 'local-image-1', images: [fileId] });
    expect([foreign.status, foreign.body.error.code, foreign.body.error.param]).toEqual([404, 'file_not_found', 'images[0]']);
    const bad = await post(c.key, '/v1/images/edits', { prompt: 'x', model: 'local-image-1', images: ['ftp://example.com/x.png'] });
    expect([bad.status, bad.body.error.code]).toEqual([400, 'invalid_data_url']);
  });

  it('streams image_edit events', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await multipart(c.key, { prompt: 'x', model: 'local-image-1', stream: 'true', partial_images: '1' }, [['image', await png(256, 256), 'a.png']]);
    expect(parseSse(res.text).map((e) => e.event)).toEqual(['image_edit.partial_image', 'image_edit.completed']);
  });

  it('answers 503 capability_disabled while image editing is switched off', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    await server.db.updateTable('capabilitySwitches').set({ enabled: false }).where('name', '=', 'image_edit').execute();
    try {
      const res = await multipart(c.key, { prompt: 'x', model: 'local-image-1' }, [['image', await png(256, 256), 'a.png']]);
      expect([res.status, res.body.error.code]).toEqual([503, 'capability_disabled']);
    } finally {
      await server.db.updateTable('capabilitySwitches').set({ enabled: true }).execute();
    }
  });
});

describe('log lines (http/access-log.ts logWith)', () => {
  const linesOf = (taskId: string) => server.logs.map((l) => JSON.parse(l) as Json).filter((l) => l.taskId === taskId);

  it('a synchronous image request writes one line at info: its request line, with its task, model and charge', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    for (const body of [{ n: 2 }, { n: 1, stream: true }]) {
      const res = await generate(c.key, body, { 'X-Request-Id': `one-line-${body.n}` });
      expect(res.status).toBe(200);
      const taskId = res.headers.get('x-task-id')!;
      // The access line is written when the response closes, just after the client has it.
      for (let i = 0; i < 50 && linesOf(taskId).length === 0; i++) await new Promise((r) => setTimeout(r, 20));
      const lines = linesOf(taskId);
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatchObject({
        msg: 'request',
        reqId: `one-line-${body.n}`,
        operation: 'createImage',
        status: 200,
        taskId,
        model: 'local-image-1',
        n: body.n,
        delivered: body.n,
        capturedMicroCredits: body.n * 1_000_000,
      });
    }
  });

  it('a respond-async task still logs its creation and its completion, which happen apart from its request', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { n: 1 }, { Prefer: 'respond-async' });
    expect(res.status).toBe(202);
    const taskId = res.headers.get('x-task-id')!;
    for (let i = 0; i < 100 && !linesOf(taskId).some((l) => l.msg === 'image task completed'); i++) await new Promise((r) => setTimeout(r, 50));
    const messages = linesOf(taskId).map((l) => l.msg);
    expect(messages).toEqual(expect.arrayContaining(['image task created', 'request', 'image task completed']));
    expect(linesOf(taskId).find((l) => l.msg === 'request')).toMatchObject({ status: 202, taskId, n: 1 });
    expect(linesOf(taskId).find((l) => l.msg === 'image task completed')).toMatchObject({ delivered: 1, capturedMicroCredits: 1_000_000 });
  });
});

describe('a free image model (a price of 0)', () => {
  it('completes synchronously, charges nothing and says so on its request line', async () => {
    const free = await startTestServer();
    try {
      await seedCatalog(free.db);
      await free.db.updateTable('modelPrices').set({ unitPrice: 0 }).where('modelId', '=', 'local-image-1').execute();
      const c = await createCustomer(free.db, { balance: 10 });
      const res = await post(c.key, '/v1/images/generations', { prompt: 'a free cat', model: 'local-image-1', n: 2 }, {}, free);
      expect(res.status).toBe(200);
      expect(res.body.data).toHaveLength(2);
      const taskId = res.headers.get('x-task-id')!;
      const task = await free.db.selectFrom('imageTasks').select(['status', 'delivered', 'actualCredits']).where('id', '=', taskId).executeTakeFirstOrThrow();
      expect(task).toEqual({ status: 'completed', delivered: 2, actualCredits: 0 });
      const account = await free.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', c.accountId).executeTakeFirstOrThrow();
      expect(account).toEqual({ balance: 10_000_000, totalSpent: 0 });
      let line: Json | undefined;
      for (let i = 0; i < 50 && !line; i++) {
        line = free.logs.map((l) => JSON.parse(l) as Json).find((l) => l.taskId === taskId && l.msg === 'request');
        if (!line) await new Promise((r) => setTimeout(r, 20));
      }
      expect(line).toMatchObject({ status: 200, delivered: 2, capturedMicroCredits: 0 });
    } finally {
      await free.close();
    }
  });
});

describe('GET /v1/images/capabilities', () => {
  it('lists the image models the key can see, what each takes and its prices per tier, no-store', async () => {
    const c = await createCustomer(server.db);
    const res = await fetch(`${server.directUrl}/v1/images/capabilities`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(res.status).toBe(200);
    expect(res.headers.get('cache-control')).toBe('no-store');
    const { items } = (await res.json()) as { items: Record<string, any>[] };
    expect(items.map((i) => i.model)).toEqual(['local-image-1', 'local-image-pro']);
    expect(items[0]).toEqual({
      model: 'local-image-1',
      displayName: 'Local Image 1',
      operations: ['generation', 'edit'],
      resolutions: ['1K', '2K', '4K'],
      aspectRatios: ['1:1', '3:2', '2:3', '16:9', '9:16', '4:3', '3:4', '21:9'],
      outputFormats: ['png', 'jpeg', 'webp'],
      qualities: [],
      transparentBackground: false,
      maxN: 10,
      maxInputImages: 16,
      billing: [
        { resolution: '1K', quality: null, mode: 'per_item', unit: 'image', unitPrice: 1 },
        { resolution: '2K', quality: null, mode: 'per_item', unit: 'image', unitPrice: 2 },
        { resolution: '4K', quality: null, mode: 'per_item', unit: 'image', unitPrice: 4 },
      ],
      configuredReachable: true,
    });
    expect(items[1]).toMatchObject({ qualities: ['low', 'medium', 'high'], transparentBackground: true });
    expect(items[1]!.billing.slice(0, 3)).toEqual([
      { resolution: '1K', quality: 'low', mode: 'per_item', unit: 'image', unitPrice: 1 },
      { resolution: '1K', quality: 'medium', mode: 'per_item', unit: 'image', unitPrice: 2 },
      { resolution: '1K', quality: 'high', mode: 'per_item', unit: 'image', unitPrice: 4 },
    ]);
  });

  it("follows the operator: a price change at once, editing switched off drops 'edit', a group that lists no image model lists none", async () => {
    const c = await createCustomer(server.db);
    const read = async (key = c.key) => ((await (await fetch(`${server.directUrl}/v1/images/capabilities`, { headers: { Authorization: `Bearer ${key}` } })).json()) as { items: Record<string, any>[] }).items;
    await server.db.updateTable('modelPrices').set({ unitPrice: 1_500_000 }).where('modelId', '=', 'local-image-1').where('resolution', '=', '1K').execute();
    try {
      expect((await read())[0]!.billing[0]).toMatchObject({ resolution: '1K', unitPrice: 1.5 });
    } finally {
      await server.db.updateTable('modelPrices').set({ unitPrice: 1_000_000 }).where('modelId', '=', 'local-image-1').where('resolution', '=', '1K').execute();
    }
    await server.db.updateTable('capabilitySwitches').set({ enabled: false }).where('name', '=', 'image_edit').execute();
    try {
      expect((await read()).map((i) => i.operations)).toEqual([['generation'], ['generation']]);
    } finally {
      await server.db.updateTable('capabilitySwitches').set({ enabled: true }).where('name', '=', 'image_edit').execute();
    }
    const group = await createGroup(server.db);
    await createMember(server.db, group.id, { models: ['local-video-1'] });
    const videoOnly = await createApiKey(server.db, { accountId: c.accountId, groupId: group.id });
    expect(await read(videoOnly.key)).toEqual([]);
  });
});
