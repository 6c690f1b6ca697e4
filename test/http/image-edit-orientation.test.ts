/**
 * Edit inputs stored turned (EXIF orientation 6, as phones store photos held upright) are measured
 * as a viewer shows them: a mask drawn at the displayed size is taken, one at the stored size is
 * refused before anything is held, an edit with no size keeps the displayed (portrait) size, and an
 * upstream receives the input upright, at the size it was measured.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { createAccount, createApiKey, createCustomer, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { addUpstreamMember, IMAGE_PRO } from '../support/upstreams.ts';

let server: TestServer;
let openai: OpenAIImagesFake;

beforeAll(async () => {
  openai = await startOpenAIImagesFake({ apiKeys: ['sk-orient'] });
  server = await startTestServer({ workers: true });
  await seedCatalog(server.db);
  await seedCatalog(server.db, [IMAGE_PRO]);
});
afterAll(async () => {
  await server?.close();
  await openai?.close();
});

type Json = Record<string, any>;

async function edit(key: string, body: Json) {
  const res = await fetch(`${server.directUrl}/v1/images/edits`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Json };
}

const dataUrl = (type: string, b: Buffer) => `data:${type};base64,${b.toString('base64')}`;

/** A JPEG stored 320x160 (a left half red, a right half blue), tagged orientation 6: shown 160x320. */
async function turnedJpeg(): Promise<Buffer> {
  return sharp({ create: { width: 320, height: 160, channels: 3, background: '#cc2020' } })
    .composite([{ input: { create: { width: 160, height: 160, channels: 3, background: '#2020cc' } }, left: 160, top: 0 }])
    .jpeg({ quality: 95 })
    .withMetadata({ orientation: 6 })
    .toBuffer();
}

/** A fully transparent mask of the size. */
const mask = (width: number, height: number) => sharp({ create: { width, height, channels: 4, background: { r: 0, g: 0, b: 0, alpha: 0 } } }).png().toBuffer();

describe('edit inputs stored turned (EXIF orientation)', () => {
  it('are measured as shown: a mask at the displayed size edits on the local model, keeping the portrait size', async () => {
    const input = await turnedJpeg();
    expect(await sharp(input).metadata()).toMatchObject({ width: 320, height: 160, orientation: 6 });
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await edit(c.key, { model: 'local-image-1', prompt: 'paint it', images: [dataUrl('image/jpeg', input)], mask: dataUrl('image/png', await mask(160, 320)) });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const out = await sharp(Buffer.from(res.body.data[0].b64_json, 'base64')).metadata();
    expect([out.width, out.height]).toEqual([160, 320]);
    expect(res.body.size).toBe('160x320');
  });

  it('refuses a mask at the stored (sideways) size before anything is held', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await edit(c.key, { model: 'local-image-1', prompt: 'paint it', images: [dataUrl('image/jpeg', await turnedJpeg())], mask: dataUrl('image/png', await mask(320, 160)) });
    expect([res.status, res.body.error?.code, res.body.error?.param]).toEqual([400, 'mask_size_mismatch', 'mask']);
    expect(res.body.error.message).toContain('the first image is 160x320');
    expect(await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
    expect(await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
    const account = await server.db.selectFrom('accounts').select('balance').where('id', '=', c.accountId).executeTakeFirstOrThrow();
    expect(Number(account.balance)).toBe(10_000_000);
  });

  it('are sent upstream upright, at the size they were measured, with the mask drawn over them', async () => {
    const account = await createAccount(server.db, { balance: 10 });
    const group = await createGroup(server.db);
    await addUpstreamMember(server.db, server.secretKey, {
      groupId: group.id,
      provider: 'openai',
      baseUrl: `${openai.url}/v1`,
      credentials: { api_key: 'sk-orient' },
      models: [IMAGE_PRO.id],
      modelMap: { [IMAGE_PRO.id]: 'gpt-image-1.5' },
    });
    const { key } = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    const res = await edit(key, { model: IMAGE_PRO.id, prompt: 'paint it', aspectRatio: '2:3', resolution: '1K', images: [dataUrl('image/jpeg', await turnedJpeg())], mask: dataUrl('image/png', await mask(160, 320)) });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const call = openai.calls.at(-1)!;
    expect(call.status).toBe(200);
    const [image] = call.images;
    expect([image!.format, image!.width, image!.height]).toEqual(['jpeg', 160, 320]);
    expect((await sharp(image!.data).metadata()).orientation ?? 1).toBe(1);
    // Upright: the stored image's left half (red) is the top once turned 90° clockwise.
    const { data } = await sharp(image!.data).raw().toBuffer({ resolveWithObject: true });
    const px = (x: number, y: number) => Array.from(data.subarray((y * 160 + x) * 3, (y * 160 + x) * 3 + 3));
    expect(px(80, 40)[0]).toBeGreaterThan(150);
    expect(px(80, 280)[2]).toBeGreaterThan(150);
    expect([call.mask?.width, call.mask?.height]).toEqual([160, 320]);
  });
});
