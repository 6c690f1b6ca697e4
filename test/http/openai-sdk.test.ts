/**
 * Compatibility of the image, file and video endpoints with the official OpenAI SDK (`openai` v6):
 * every call goes through the SDK against the server itself (`directUrl`; the SDK cannot use the
 * harness's lane fetch) and must parse with the SDK's own types.
 */
import OpenAI, { toFile } from 'openai';
import type { ImageEditStreamEvent, ImageGenStreamEvent } from 'openai/resources/images';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
let client: OpenAI;

const PROMPT = 'A lighthouse on a cliff at dusk, oil painting';

function sdk(apiKey: string): OpenAI {
  return new OpenAI({ apiKey, baseURL: `${server.directUrl}/v1`, maxRetries: 0 });
}

async function decode(b64: string | undefined): Promise<{ format: string | undefined; width: number | undefined; height: number | undefined }> {
  expect(typeof b64).toBe('string');
  const meta = await sharp(Buffer.from(b64!, 'base64')).metadata();
  return { format: meta.format, width: meta.width, height: meta.height };
}

/** A 512x512 opaque PNG input. */
async function inputPng(color: { r: number; g: number; b: number }): Promise<Buffer> {
  return sharp({ create: { width: 512, height: 512, channels: 3, background: color } }).png().toBuffer();
}

/** A 512x512 RGBA mask, opaque except a transparent 256x256 square in the middle. */
async function maskPng(): Promise<Buffer> {
  const size = 512;
  const raw = Buffer.alloc(size * size * 4);
  for (let y = 0; y < size; y++) {
    for (let x = 0; x < size; x++) {
      const i = (y * size + x) * 4;
      const inside = x >= 128 && x < 384 && y >= 128 && y < 384;
      raw[i] = 0;
      raw[i + 1] = 0;
      raw[i + 2] = 0;
      raw[i + 3] = inside ? 0 : 255;
    }
  }
  return sharp(raw, { raw: { width: size, height: size, channels: 4 } }).png().toBuffer();
}

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
  const customer = await createCustomer(server.db, { balance: 500 });
  client = sdk(customer.key);
});
afterAll(async () => server?.close());

describe('OpenAI SDK: images.generate', () => {
  it('returns b64_json by default, a PNG of the model default size 1248x1248', async () => {
    const res = await client.images.generate({ model: 'local-image-1', prompt: PROMPT });
    expect(res.data).toHaveLength(1);
    expect(res.data?.[0]?.url).toBeUndefined();
    expect(await decode(res.data?.[0]?.b64_json)).toEqual({ format: 'png', width: 1248, height: 1248 });
  });

  it('returns a downloadable signed url with response_format url and a table 2.8 size', async () => {
    const res = await client.images.generate({ model: 'local-image-1', prompt: PROMPT, response_format: 'url', size: '1248x832' });
    const url = res.data?.[0]?.url;
    expect(typeof url).toBe('string');
    expect(res.data?.[0]?.b64_json).toBeUndefined();
    // The harness listens on port 0, so PUBLIC_BASE_URL defaults to http://localhost:0: keep the
    // signed path and query and fetch them from the server itself (as video-engine.test.ts does).
    const signed = new URL(url!);
    expect(signed.pathname).toMatch(/^\/v1\/files\/file_[0-9A-Za-z]+$/);
    expect(signed.searchParams.get('signature')).toBeTruthy();
    const download = await fetch(`${server.directUrl}${signed.pathname}${signed.search}`);
    expect(download.status).toBe(200);
    expect(download.headers.get('content-type')).toMatch(/^image\/png/);
    const meta = await sharp(Buffer.from(await download.arrayBuffer())).metadata();
    expect({ format: meta.format, width: meta.width, height: meta.height }).toEqual({ format: 'png', width: 1248, height: 832 });
  });

  it('returns n images', async () => {
    const res = await client.images.generate({ model: 'local-image-1', prompt: PROMPT, n: 2 });
    expect(res.data).toHaveLength(2);
    for (const item of res.data ?? []) expect(await decode(item.b64_json)).toEqual({ format: 'png', width: 1248, height: 1248 });
  });

  it('exposes X-Task-Id through withResponse()', async () => {
    const { data, response } = await client.images.generate({ model: 'local-image-1', prompt: PROMPT }).withResponse();
    expect(data.data).toHaveLength(1);
    expect(response.status).toBe(200);
    expect(response.headers.get('x-task-id')).toMatch(/^img_/);
  });
});

describe('OpenAI SDK: images.edit (multipart)', () => {
  it('edits one image with a mask and keeps the input size', async () => {
    const res = await client.images.edit({
      model: 'local-image-1',
      prompt: 'Replace the middle with a starry sky',
      image: await toFile(await inputPng({ r: 200, g: 40, b: 40 }), 'in.png', { type: 'image/png' }),
      mask: await toFile(await maskPng(), 'mask.png', { type: 'image/png' }),
    });
    expect(res.data).toHaveLength(1);
    expect(await decode(res.data?.[0]?.b64_json)).toEqual({ format: 'png', width: 512, height: 512 });
  });

  it('accepts several images (sent by the SDK as image[] parts)', async () => {
    const res = await client.images.edit({
      model: 'local-image-1',
      prompt: 'Combine both pictures',
      image: [
        await toFile(await inputPng({ r: 200, g: 40, b: 40 }), 'a.png', { type: 'image/png' }),
        await toFile(await inputPng({ r: 40, g: 40, b: 200 }), 'b.png', { type: 'image/png' }),
      ],
    });
    expect(res.data).toHaveLength(1);
    // Without size, an edit keeps the size of the first input.
    expect(await decode(res.data?.[0]?.b64_json)).toEqual({ format: 'png', width: 512, height: 512 });
  });
});

describe('OpenAI SDK: streaming', () => {
  it('streams partial images then the completed image of a generation', async () => {
    const stream = await client.images.generate({ model: 'local-image-1', prompt: PROMPT, stream: true, partial_images: 2 });
    const events: ImageGenStreamEvent[] = [];
    for await (const event of stream) events.push(event);
    expect(events.map((e) => e.type)).toEqual(['image_generation.partial_image', 'image_generation.partial_image', 'image_generation.completed']);
    const [p0, p1, done] = events;
    expect(p0?.type === 'image_generation.partial_image' && p0.partial_image_index).toBe(0);
    expect(p1?.type === 'image_generation.partial_image' && p1.partial_image_index).toBe(1);
    for (const e of events) expect(await decode(e.b64_json)).toEqual({ format: 'png', width: 1248, height: 1248 });
    if (done?.type !== 'image_generation.completed') throw new Error('no completed event');
    expect(done.output_format).toBe('png');
    expect(done.size).toBe('1248x1248');
    expect(typeof done.usage.total_tokens).toBe('number');
  });

  it('streams a partial image then the completed image of an edit', async () => {
    const stream = await client.images.edit({
      model: 'local-image-1',
      prompt: 'Replace the middle with a starry sky',
      image: await toFile(await inputPng({ r: 200, g: 40, b: 40 }), 'in.png', { type: 'image/png' }),
      stream: true,
      partial_images: 1,
    });
    const events: ImageEditStreamEvent[] = [];
    for await (const event of stream) events.push(event);
    expect(events.map((e) => e.type)).toEqual(['image_edit.partial_image', 'image_edit.completed']);
    const [partial] = events;
    expect(partial?.type === 'image_edit.partial_image' && partial.partial_image_index).toBe(0);
    for (const e of events) expect(await decode(e.b64_json)).toEqual({ format: 'png', width: 512, height: 512 });
  });
});

describe('OpenAI SDK: errors', () => {
  it('maps an unknown model to NotFoundError 404 model_not_found', async () => {
    const err = await client.images.generate({ model: 'no-such-model', prompt: PROMPT }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    const e = err as InstanceType<typeof OpenAI.NotFoundError>;
    expect(e.status).toBe(404);
    expect(e.code).toBe('model_not_found');
    expect(e.type).toBe('not_found_error');
  });

  it('maps a bad key to AuthenticationError 401', async () => {
    const bad = sdk('mg_0000000000000000000000000000000000');
    const err = await bad.images.generate({ model: 'local-image-1', prompt: PROMPT }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    const e = err as InstanceType<typeof OpenAI.AuthenticationError>;
    expect(e.status).toBe(401);
    expect(e.code).toBe('invalid_api_key');
  });

  it('maps an empty balance to APIError 402 insufficient_balance', async () => {
    const broke = await createCustomer(server.db, { balance: 0 });
    const err = await sdk(broke.key).images.generate({ model: 'local-image-1', prompt: PROMPT }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const e = err as InstanceType<typeof OpenAI.APIError>;
    expect(e.status).toBe(402);
    expect(e.code).toBe('insufficient_balance');
  });
});

describe('OpenAI SDK: files.* (issue 27, item 4)', () => {
  it('creates, lists (auto-paginating), retrieves, downloads and deletes files unchanged', async () => {
    const owner = await createCustomer(server.db, { balance: 100 });
    const files = sdk(owner.key).files;
    const bytes = await inputPng({ r: 10, g: 200, b: 30 });
    // Mediagate's purpose is `input`; the SDK's type names OpenAI's purposes only.
    const created = await files.create({ file: await toFile(bytes, 'frame.png', { type: 'image/png' }), purpose: 'input' as never });
    expect(created).toMatchObject({ object: 'file', purpose: 'input', filename: 'frame.png', bytes: bytes.length });
    const generated = await sdk(owner.key).images.generate({ model: 'local-image-1', prompt: PROMPT, response_format: 'url', n: 2 });
    const outputIds = (generated.data ?? []).map((d) => new URL(d.url!).pathname.split('/').pop()!);

    const listed: string[] = [];
    for await (const file of files.list({ limit: 2 })) listed.push(file.id);
    // Newest first; the two images were recorded by one statement (one instant): by id, descending.
    expect(listed).toEqual([...[...outputIds].sort().reverse(), created.id]);
    const first = await files.list({ limit: 2 });
    expect([first.data.length, first.has_more, first.hasNextPage()]).toEqual([2, true, true]);
    expect((await files.list({ purpose: 'input' })).data.map((f) => f.id)).toEqual([created.id]);

    const retrieved = await files.retrieve(created.id);
    expect(retrieved).toEqual({ ...created, task_id: null });
    const downloaded = await files.content(created.id);
    expect(downloaded.headers.get('content-type')).toBe('image/png');
    expect(Buffer.from(await downloaded.arrayBuffer()).equals(bytes)).toBe(true);

    expect(await files.delete(created.id)).toEqual({ id: created.id, object: 'file', deleted: true });
    const err = await files.retrieve(created.id).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect((err as InstanceType<typeof OpenAI.NotFoundError>).code).toBe('file_not_found');
  });
});

describe('OpenAI SDK: videos.* (issue 27, item 5)', () => {
  it('retrieves a task and lists tasks across pages; videos.create is refused (POST /v1/videos creates nothing)', async () => {
    const owner = await createCustomer(server.db, { balance: 100 });
    const created: string[] = [];
    for (let i = 0; i < 5; i++) {
      const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${owner.key}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ client_request_id: `sdk-${i}`, prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' }),
      });
      expect(res.status).toBe(202);
      created.push(((await res.json()) as { id: string }).id);
    }
    const videos = sdk(owner.key).videos;
    const one = await videos.retrieve(created[0]!);
    expect(one).toMatchObject({ id: created[0], status: 'queued' });

    const listed: string[] = [];
    for await (const video of videos.list({ limit: 2 })) listed.push(video.id);
    expect(listed).toEqual([...created].reverse());
    const first = await videos.list({ limit: 2, order: 'asc' });
    expect([first.data.map((v) => v.id), first.has_more]).toEqual([created.slice(0, 2), true]);
    expect((await first.getNextPage()).data.map((v) => v.id)).toEqual(created.slice(2, 4));

    const err = await videos.create({ prompt: 'a fox', model: 'sora-2' }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect((err as InstanceType<typeof OpenAI.NotFoundError>).code).toBe('video_creation_endpoint_moved');
    const tasks = await server.db.selectFrom('videoTasks').select('id').where('accountId', '=', owner.accountId).execute();
    expect(tasks).toHaveLength(5);
  });
});
