/**
 * Images over the gateway's pixel limit (MAX_IMAGE_PIXELS, 50 MP) are not decoded: an interlaced
 * PNG (or a progressive JPEG) is held whole while libvips decodes it, so a 1 MB file could cost
 * gigabytes. Its header is read first: a client's input over the limit is the client's 400
 * `invalid_image` ("too large"), naming the input, before anything is held or stored, whichever
 * way it comes (a multipart edit, a JSON edit's data URL, an upload, a video frame); an upstream's
 * answer over it is the upstream's retryable failure. A 48 MP phone photo still passes.
 */
import { randomUUID } from 'node:crypto';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fitImage } from '../../server/providers/image-output.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { imageParams } from '../support/image-params.ts';
import { until } from '../support/tasks.ts';

type Json = Record<string, any>;
let server: TestServer;
/** 9000x9000 (81 MP), interlaced (Adam7): about 1 MB, under every byte limit. */
let interlaced: Buffer;

beforeAll(async () => {
  interlaced = await sharp({ create: { width: 9000, height: 9000, channels: 3, background: '#336699' } }).png({ progressive: true }).toBuffer();
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => {
  await server?.close();
});

const TOO_LARGE = /too large: 9000x9000 pixels, at most 50,000,000 pixels/;
const dataUrl = (type: string, b: Buffer) => `data:${type};base64,${b.toString('base64')}`;

async function post(key: string, path: string, payload: unknown) {
  const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(payload) });
  return { status: res.status, body: (await res.json()) as Json };
}

async function multipartEdit(key: string, fields: Record<string, string>, files: [string, Buffer, string, string][]) {
  const form = new FormData();
  for (const [k, v] of Object.entries(fields)) form.append(k, v);
  for (const [name, buf, filename, type] of files) form.append(name, new Blob([buf], { type }), filename);
  const res = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form });
  return { status: res.status, body: (await res.json()) as Json };
}

async function upload(key: string, file: Buffer, type: string, name: string) {
  const form = new FormData();
  form.append('purpose', 'input');
  form.append('file', new Blob([file], { type }), name);
  const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form });
  return { status: res.status, body: (await res.json()) as Json };
}

function expectTooLarge(res: { status: number; body: Json }, param: string) {
  expect([res.status, res.body.error?.code, res.body.error?.param], JSON.stringify(res.body).slice(0, 300)).toEqual([400, 'invalid_image', param]);
  expect(res.body.error.message).toMatch(TOO_LARGE);
}

/** No task, no hold, the balance untouched, and (once refused inputs are cleaned up) no file. */
async function expectNothingLeft(c: { accountId: string }, balance: number) {
  expect(await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  expect(await server.db.selectFrom('videoTasks').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  expect(await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  const account = await server.db.selectFrom('accounts').select('balance').where('id', '=', c.accountId).executeTakeFirstOrThrow();
  expect(Number(account.balance)).toBe(balance * 1_000_000);
  await until(async () => (await server.db.selectFrom('files').select('id').where('accountId', '=', c.accountId).execute()).length === 0, 3000, 'refused inputs to be removed');
}

describe('an input image over the pixel limit', () => {
  it('is refused as a multipart edit: 400 invalid_image naming the part, nothing held', async () => {
    expect(await sharp(interlaced).metadata()).toMatchObject({ width: 9000, height: 9000, isProgressive: true });
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await multipartEdit(c.key, { prompt: 'paint it', model: 'local-image-1' }, [['image', interlaced, 'big.png', 'image/png']]);
    expectTooLarge(res, 'image');
    await expectNothingLeft(c, 10);
  });

  it('is refused as a JSON edit data URL and as a video frame, naming the input', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const small = await sharp({ create: { width: 64, height: 64, channels: 3, background: '#20a020' } }).png().toBuffer();
    const edit = await post(c.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'x', images: [dataUrl('image/png', small), dataUrl('image/png', interlaced)] });
    expectTooLarge(edit, 'images[1]');
    const video = await post(c.key, '/v1/videos/generations', {
      client_request_id: randomUUID(),
      prompt: 'a fox',
      model: 'local-video-1',
      seconds: 2,
      aspectRatio: '16:9',
      resolution: '360p',
      firstFrame: dataUrl('image/png', interlaced),
    });
    expectTooLarge(video, 'firstFrame');
    await expectNothingLeft(c, 10);
  });

  it('is refused as an upload (POST /v1/files), storing nothing', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    expectTooLarge(await upload(c.key, interlaced, 'image/png', 'big.png'), 'file');
    await expectNothingLeft(c, 10);
  });
});

describe('an input image within the pixel limit', () => {
  it('a 48 MP photo (8000x6000) is uploaded and edited, kept at its size scaled into the size limits', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const photo = await sharp({ create: { width: 8000, height: 6000, channels: 3, background: '#808040' } }).jpeg({ progressive: true }).toBuffer();
    const up = await upload(c.key, photo, 'image/jpeg', 'photo.jpg');
    expect(up.status, JSON.stringify(up.body)).toBe(201);
    expect([up.body.width, up.body.height, up.body.content_type]).toEqual([8000, 6000, 'image/jpeg']);
    const res = await post(c.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'x', images: [up.body.id] });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const out = await sharp(Buffer.from(res.body.data[0].b64_json, 'base64')).metadata();
    expect(out.width! / out.height!).toBeCloseTo(4 / 3, 2);
  });
});

describe('an upstream answer over the pixel limit', () => {
  it("is not decoded: the upstream's retryable failure", async () => {
    const err = await fitImage(interlaced, imageParams({ width: 1024, height: 1024 })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    expect([(err as ProviderError).kind, (err as ProviderError).message]).toEqual(['retryable', expect.stringMatching(/too large to decode \(9000x9000 pixels/)]);
  });
});
