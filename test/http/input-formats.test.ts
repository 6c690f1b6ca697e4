/**
 * Input images are PNG, JPEG, WebP or GIF wherever they enter: a multipart edit's files, a JSON
 * edit's data URLs, a video's frames and POST /v1/files. Anything else libvips reads (TIFF, SVG) is
 * `400 invalid_image`, told from its header, with nothing held, charged or kept; an upload is never
 * recorded as a type outside the File's `content_type`.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { accountState, until } from '../support/tasks.ts';

type Json = Record<string, any>;
type Customer = Awaited<ReturnType<typeof createCustomer>>;

let server: TestServer;
let tiff: Buffer;
let gif: Buffer;
/** An SVG whose filters keep libvips' renderer busy for tens of seconds when it is decoded. */
const filteredSvg = Buffer.from(
  '<svg xmlns="http://www.w3.org/2000/svg" width="2000" height="2000"><filter id="f"><feTurbulence baseFrequency="0.01" numOctaves="2"/>' +
    '<feGaussianBlur stdDeviation="50"/></filter><rect width="100%" height="100%" filter="url(#f)"/></svg>',
);
const plainSvg = Buffer.from('<svg xmlns="http://www.w3.org/2000/svg" width="64" height="48"><rect width="64" height="48" fill="red"/></svg>');

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
  const solid = () => sharp({ create: { width: 64, height: 48, channels: 3, background: '#336699' } });
  tiff = await solid().tiff().toBuffer();
  gif = await solid().gif().toBuffer();
});
afterAll(async () => server?.close());

async function answer(res: Response) {
  return { status: res.status, body: (await res.json()) as Json };
}

/** A multipart edit whose image part claims to be a PNG, whatever its bytes are. */
async function multipartEdit(key: string, image: Buffer) {
  const form = new FormData();
  form.append('prompt', 'paint it');
  form.append('model', 'local-image-1');
  form.append('image', new Blob([image], { type: 'image/png' }), 'in.png');
  return answer(await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form }));
}

async function upload(key: string, bytes: Buffer, name: string) {
  const form = new FormData();
  form.append('purpose', 'input');
  form.append('file', new Blob([bytes], { type: 'image/png' }), name);
  return answer(await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form }));
}

async function postJson(key: string, path: string, body: unknown) {
  return answer(
    await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) }),
  );
}

const dataUrl = (bytes: Buffer) => `data:image/png;base64,${bytes.toString('base64')}`;
const filesOf = (accountId: string) => server.db.selectFrom('files').select(['id', 'purpose', 'contentType']).where('accountId', '=', accountId).execute();

/** Nothing of a refused request is left: no task, no hold, no file, the balance untouched. */
async function expectNothingKept(c: Customer, before: Awaited<ReturnType<typeof accountState>>) {
  expect(await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  expect(await server.db.selectFrom('videoTasks').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  expect(await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  expect(await accountState(server.db, c.accountId, c.apiKeyId)).toEqual(before);
  // Staged inputs are removed once the request has been answered.
  await until(async () => (await filesOf(c.accountId)).length === 0, 5_000, 'the refused inputs to be removed');
}

describe('input image formats', () => {
  it.each([
    ['TIFF', () => tiff],
    ['SVG', () => plainSvg],
  ])('a multipart edit with a %s image is 400 invalid_image, and nothing is held or kept', async (format, bytes) => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = await accountState(server.db, c.accountId, c.apiKeyId);
    const res = await multipartEdit(c.key, bytes());
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ code: 'invalid_image', param: 'image', message: `'image' is in ${format} format; images must be PNG, JPEG, WebP or GIF.` });
    await expectNothingKept(c, before);
  });

  it('a filter-heavy SVG is refused at once, without holding the decoder for the edits after it', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const started = Date.now();
    const refused = await Promise.all([1, 2, 3, 4].map(() => multipartEdit(c.key, filteredSvg)));
    expect(refused.map((r) => [r.status, r.body.error.code])).toEqual(Array(4).fill([400, 'invalid_image']));
    // Rendering one takes tens of seconds; its header is read in milliseconds.
    expect(Date.now() - started).toBeLessThan(5_000);
  }, 120_000);

  it('a JSON edit whose data URL holds an SVG is 400 invalid_image, and its staged input is removed', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = await accountState(server.db, c.accountId, c.apiKeyId);
    const res = await postJson(c.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'paint it', images: [dataUrl(plainSvg)] });
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ code: 'invalid_image', param: 'images[0]', message: "'images[0]' is in SVG format; images must be PNG, JPEG, WebP or GIF." });
    await expectNothingKept(c, before);
  });

  it("a video's first frame as a TIFF is 400 invalid_image, and nothing is held or kept", async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = await accountState(server.db, c.accountId, c.apiKeyId);
    const res = await postJson(c.key, '/v1/videos/generations', {
      client_request_id: 'tiff-frame',
      prompt: 'a lighthouse',
      model: 'local-video-1',
      seconds: 2,
      aspectRatio: '16:9',
      resolution: '360p',
      first_frame: dataUrl(tiff),
    });
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ code: 'invalid_image', message: expect.stringContaining('is in TIFF format; images must be PNG, JPEG, WebP or GIF.') });
    await expectNothingKept(c, before);
  });

  it.each([
    ['TIFF', 'frame.tiff', () => tiff],
    ['SVG', 'frame.svg', () => plainSvg],
  ])('POST /v1/files refuses a %s upload as 400 invalid_image and keeps no file', async (format, name, bytes) => {
    const c = await createCustomer(server.db);
    const res = await upload(c.key, bytes(), name);
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ code: 'invalid_image', param: 'file', message: `'file' is in ${format} format; images must be PNG, JPEG, WebP or GIF.` });
    await until(async () => (await filesOf(c.accountId)).length === 0, 5_000, 'the refused upload to be removed');
  });

  it('POST /v1/files still takes a GIF, recorded as image/gif', async () => {
    const c = await createCustomer(server.db);
    const res = await upload(c.key, gif, 'frame.gif');
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({ content_type: 'image/gif', width: 64, height: 48 });
    expect(await filesOf(c.accountId)).toEqual([{ id: res.body.id, purpose: 'upload', contentType: 'image/gif' }]);
  });
});
