/**
 * Seedream edit inputs within Seedream's limits (upstream-apis.md §5.1: at most 10 MB and 36 MP
 * each, sides over 14 px, a ratio within [1/16, 16]; test/fakes/ark.ts refuses anything else with
 * 400 InvalidParameter): a phone's 48 MP photo of over 10 MB, and its 48 MP mask, are scaled down
 * and re-encoded rather than refused by the upstream after the hold; an input stored turned (EXIF
 * orientation) goes upright; a ratio no scaling fixes is the client's 400 before the hold (more in
 * test/seedream-input-check.test.ts).
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { startArkFake, type ArkFake } from '../fakes/ark.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf } from '../support/tasks.ts';

const SEEDREAM_40 = 'seedream-4-0-250828';

let server: TestServer;
let fake: ArkFake;
let key: string;
let accountId: string;

beforeAll(async () => {
  fake = await startArkFake({ accounts: { 'ark-a': {} } });
  server = await startTestServer({ workers: true });
  const created = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(`ark/${SEEDREAM_40}`)!.model });
  expect(created.response.status).toBe(201);
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const member = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
    params: { path: { group_id: group.id } },
    body: { name: 'a', provider: 'ark', base_url: `${fake.url}/api/v3`, credentials: { api_key: 'ark-a' }, models: [SEEDREAM_40], priority: 0 },
  });
  expect(member.response.status).toBe(201);
  key = (await createApiKey(server.db, { accountId: account.id, groupId: group.id })).key;
  accountId = account.id;
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

type Json = Record<string, any>;

async function edit(body: Json) {
  const res = await fetch(`${server.directUrl}/v1/images/edits`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: SEEDREAM_40, prompt: 'add a boat', ...body }),
  });
  return { status: res.status, taskId: res.headers.get('x-task-id'), body: (await res.json()) as Json };
}

const dataUrl = (type: string, b: Buffer) => `data:${type};base64,${b.toString('base64')}`;

/** An 8000x6000 (48 MP) JPEG of deterministic noise: about 14 MB, as much detail as a photo can have. */
async function noisePhoto(): Promise<Buffer> {
  const raw = Buffer.alloc(8000 * 6000 * 3);
  let s = 1;
  for (let i = 0; i < raw.length; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    raw[i] = s >>> 24;
  }
  return sharp(raw, { raw: { width: 8000, height: 6000, channels: 3 } }).jpeg({ quality: 35 }).toBuffer();
}

const transparent = (width: number, height: number) => sharp({ create: { width, height, channels: 4, background: { r: 0, g: 0, b: 0, alpha: 0 } } }).png().toBuffer();

describe('Seedream edit inputs', () => {
  it('scales a 48 MP photo of over 10 MB, and its mask, into Seedream’s limits', async () => {
    const photo = await noisePhoto();
    expect(photo.length).toBeGreaterThan(10 * 1024 * 1024);
    const calls = fake.imageCalls.length;
    const res = await edit({ images: [dataUrl('image/jpeg', photo)], mask: dataUrl('image/png', await transparent(8000, 6000)) });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(fake.imageCalls.length).toBe(calls + 1);
    const [input, mask] = fake.imageCalls.at(-1)!.images;
    expect(input!.mimeType).toBe('image/jpeg');
    expect(input!.bytes!).toBeLessThanOrEqual(10_000_000);
    expect(input!.width! * input!.height!).toBeLessThanOrEqual(36_000_000);
    expect(input!.width! / input!.height!).toBeCloseTo(4 / 3, 2);
    expect(mask!.mimeType).toBe('image/png');
    expect(mask!.width! * mask!.height!).toBeLessThanOrEqual(36_000_000);
    expect(mask!.width! / mask!.height!).toBeCloseTo(4 / 3, 2);
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured' });
  });

  it('sends an input stored turned (EXIF orientation 6) upright, with the mask drawn over it', async () => {
    const turned = await sharp({ create: { width: 320, height: 160, channels: 3, background: '#cc2020' } })
      .jpeg()
      .withMetadata({ orientation: 6 })
      .toBuffer();
    const res = await edit({ images: [dataUrl('image/jpeg', turned)], mask: dataUrl('image/png', await transparent(160, 320)) });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const images = fake.imageCalls.at(-1)!.images;
    expect(images.map((i) => `${i.mimeType} ${i.width}x${i.height}`)).toEqual(['image/jpeg 160x320', 'image/png 160x320']);
  });

  it('refuses an input whose aspect ratio Seedream does not take (17:1) before the hold, as 400 invalid_image', async () => {
    const calls = fake.imageCalls.length;
    const before = await server.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow();
    const res = await edit({ images: [dataUrl('image/png', await sharp({ create: { width: 680, height: 40, channels: 3, background: '#808080' } }).png().toBuffer())] });
    expect([res.status, res.body.error.code, res.body.error.param, res.taskId]).toEqual([400, 'invalid_image', 'images[0]', null]);
    expect(res.body.error.message).toMatch(/680x40 .*aspect ratio from 1:16 to 16:1/);
    expect(fake.imageCalls.length).toBe(calls);
    const after = await server.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow();
    expect(after.balance).toBe(before.balance);
  });
});
