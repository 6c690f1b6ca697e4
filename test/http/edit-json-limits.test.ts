/**
 * How many images a JSON image edit takes (product spec §4.4): as many as a multipart edit, 16
 * images and a mask. The 17th image is `400 too_many_images`, as the 17th file of a multipart edit
 * is, answered as soon as it starts arriving (the rest of the body is not read); nothing is stored,
 * held or created. Images and mask also come in OpenAI's object form (`{"image_url": …}`,
 * `{"file_id": …}`), counted with the strings.
 */
import { request } from 'node:http';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

type Json = Record<string, any>;
let server: TestServer;
let image: string;
let mask: string;

beforeAll(async () => {
  // An idle body is cut off after 3 s (408): a refusal that waited for the rest of a stalled body would be that.
  server = await startTestServer({ env: { BODY_IDLE_TIMEOUT_MS: '3000' } });
  await seedCatalog(server.db);
  const png = (alpha: number) => sharp({ create: { width: 64, height: 64, channels: 4, background: { r: 0x33, g: 0x66, b: 0x99, alpha } } }).png().toBuffer();
  image = `data:image/png;base64,${(await png(1)).toString('base64')}`;
  mask = `data:image/png;base64,${(await png(0)).toString('base64')}`;
});
afterAll(async () => server?.close());

const edit = (extra: Json) => ({ prompt: 'make it red', model: 'local-image-1', ...extra });

async function post(key: string, payload: string) {
  const res = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: payload });
  return { status: res.status, body: (await res.json()) as Json };
}

/** No image task, no hold and (once the request is over) no input file of the account. */
async function expectNothingLeft(accountId: string) {
  const inputs = () => server.db.selectFrom('files').select('id').where('accountId', '=', accountId).where('purpose', '=', 'input').execute();
  await until(async () => (await inputs()).length === 0, 3000, 'staged inputs to be removed');
  const tasks = await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', accountId).execute();
  const holds = await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', accountId).execute();
  expect([tasks.length, holds.length]).toEqual([0, 0]);
}

describe('JSON image edit: the number of images', () => {
  it.each([17, 18])('refuses %i images with 400 too_many_images, naming the 17th, as a multipart edit', async (n) => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await post(c.key, JSON.stringify(edit({ images: Array(n).fill(image) })));
    expect([res.status, res.body.error?.code, res.body.error?.param, res.body.error?.message]).toEqual([400, 'too_many_images', 'images[16]', 'Too many images: at most 16 images per request.']);
    await expectNothingLeft(c.accountId);
  });

  it('refuses 16 images and a mask plus a 17th image the same way, the mask counted apart', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await post(c.key, JSON.stringify(edit({ mask, images: Array(17).fill(image) })));
    expect([res.status, res.body.error?.code, res.body.error?.param]).toEqual([400, 'too_many_images', 'images[16]']);
    await expectNothingLeft(c.accountId);
  });

  it('accepts 16 images and a mask', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await post(c.key, JSON.stringify(edit({ images: Array(16).fill(image), mask })));
    expect(res.status).toBe(200);
    expect(res.body.data).toHaveLength(1);
  });

  it('refuses a second mask (a repeated key) with 400 invalid_request', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const body = JSON.stringify(edit({ images: [image], mask })).replace(/}$/, `,"mask":${JSON.stringify(mask)}}`);
    const res = await post(c.key, body);
    expect([res.status, res.body.error?.code, res.body.error?.param]).toEqual([400, 'invalid_request', 'mask']);
    await expectNothingLeft(c.accountId);
  });

  it('answers as the 17th image starts, without waiting for the rest of the body', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const json = Buffer.from(JSON.stringify(edit({ images: Array(17).fill(image) })));
    // Everything up to a few bytes into the 17th image; the client then stalls with more announced.
    const sent = json.subarray(0, json.lastIndexOf('"data:') + 40);
    const url = new URL(server.directUrl);
    const answer = await new Promise<{ status: number; body: Json }>((resolve, reject) => {
      const req = request(
        { host: url.hostname, port: url.port, path: '/v1/images/edits', method: 'POST', headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json', 'Content-Length': json.length } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (chunk: Buffer) => chunks.push(chunk));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString() || '{}') as Json }));
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.write(sent);
    });
    expect([answer.status, answer.body.error?.code, answer.body.error?.param]).toEqual([400, 'too_many_images', 'images[16]']);
    await expectNothingLeft(c.accountId);
  });
});

describe("JSON image edit: OpenAI's object form of its inputs", () => {
  it('takes {image_url} (a data URL) and {file_id} items and a {image_url} mask, as the strings they hold', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const form = new FormData();
    form.append('purpose', 'input');
    form.append('file', new Blob([Buffer.from(image.split(',')[1]!, 'base64')], { type: 'image/png' }), 'frame.png');
    const uploaded = (await (await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form })).json()) as { id: string };
    const res = await post(c.key, JSON.stringify(edit({ images: [{ image_url: image }, { file_id: uploaded.id }, image], mask: { image_url: mask } })));
    expect([res.status, res.body.data?.length]).toEqual([200, 1]);
    const task = await server.db.selectFrom('imageTasks').select(['inputFileIds', 'maskFileId']).where('accountId', '=', c.accountId).executeTakeFirstOrThrow();
    expect(task.inputFileIds).toHaveLength(3);
    expect(task.inputFileIds[1]).toBe(uploaded.id);
    expect(task.maskFileId).toEqual(expect.any(String));
  });

  it('counts both forms together: a 17th image is 400 too_many_images naming it; an unknown file_id names its param', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const mixed = [...Array(8).fill(image), ...Array(9).fill({ image_url: image })];
    const res = await post(c.key, JSON.stringify(edit({ images: mixed })));
    expect([res.status, res.body.error?.code, res.body.error?.param]).toEqual([400, 'too_many_images', 'images[16].image_url']);
    await expectNothingLeft(c.accountId);
    const unknown = await post(c.key, JSON.stringify(edit({ images: [image, { file_id: 'file_doesnotexist' }] })));
    expect([unknown.status, unknown.body.error?.code, unknown.body.error?.param]).toEqual([404, 'file_not_found', 'images[1].file_id']);
  });

  it('refuses an object with both keys, neither, or another key', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    for (const item of [{ image_url: image, file_id: 'file_x' }, {}, { url: image }]) {
      const res = await post(c.key, JSON.stringify(edit({ images: [item] })));
      expect([JSON.stringify(item).slice(0, 30), res.status, res.body.error?.code]).toEqual([JSON.stringify(item).slice(0, 30), 400, 'invalid_request']);
    }
    await expectNothingLeft(c.accountId);
  });
});
