/**
 * A model's `resize` setting (issue 34, item 3) through the public and admin APIs and the CLI,
 * against the fake OpenAI Images upstream serving `gpt-image-1`, whose only sizes are 1024x1024,
 * 1536x1024 and 1024x1536: the reference table's 1K 1:1 (1248x1248) and 3:2 (1248x832) are not
 * among them, so the adapter asks for the nearest native size. `exact` (the default) resizes the
 * answer to the resolved size; `native` returns the upstream's image as it came, with the real size
 * in the answer and the stored file, at the same price.
 */
import createClient from 'openapi-fetch';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { paths } from '../../generated/api.d.ts';
import { parse, UsageError } from '../../scripts/admin/args.ts';
import { commandContext } from '../../scripts/admin/command.ts';
import { modelCommands } from '../../scripts/admin/models.ts';
import { createLogger } from '../../server/logger.ts';
import { createAdminServices, type AdminServices } from '../../server/services/admin/index.ts';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';
import { addUpstreamMember } from '../support/upstreams.ts';

let server: TestServer;
let fake: OpenAIImagesFake;
let admin: AdminServices;
let key: string;

type Json = Record<string, any>;
const UNIT_PRICE = 0.04;

/** An image model on the reference table (1K: 1248x1248 at 1:1, 1248x832 at 3:2), created through the admin API. */
async function createModel(id: string, resize?: 'exact' | 'native') {
  const { response, error } = await server.admin().POST('/admin/v1/models', {
    body: {
      id,
      kind: 'image',
      display_name: id,
      image: {
        resolutions: ['1K'],
        aspect_ratios: ['1:1', '3:2'],
        output_formats: ['png', 'jpeg', 'webp'],
        supports_quality: false,
        supports_transparent_background: false,
        max_n: 2,
        ...(resize && { resize }),
      },
      pricing: [{ resolution: '1K', quality: null, mode: 'per_item', unit_price: UNIT_PRICE }],
    },
  });
  expect(response.status, JSON.stringify(error)).toBe(201);
}

beforeAll(async () => {
  fake = await startOpenAIImagesFake({ apiKeys: ['sk-resize'] });
  // The CLI writes to the database: the server hears the change on the cluster channel.
  server = await startTestServer({ clusterListener: true });
  admin = createAdminServices({ db: server.db, log: createLogger('silent'), secretKey: server.secretKey });
  await seedCatalog(server.db);
  await createModel('resize-exact');
  await createModel('resize-native', 'native');
  await createModel('resize-switch');
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  await addUpstreamMember(server.db, server.secretKey, {
    groupId: group.id,
    provider: 'openai',
    baseUrl: `${fake.url}/v1`,
    credentials: { api_key: 'sk-resize' },
    models: ['resize-exact', 'resize-native', 'resize-switch'],
    modelMap: { 'resize-exact': 'gpt-image-1', 'resize-native': 'gpt-image-1', 'resize-switch': 'gpt-image-1' },
  });
  key = (await createApiKey(server.db, { accountId: account.id, groupId: group.id })).key;
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

async function generate(body: Json, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify({ prompt: 'a harbour at noon', ...body }),
  });
  const text = await res.text();
  return { status: res.status, taskId: res.headers.get('x-task-id')!, text, body: (res.headers.get('content-type')?.includes('json') ? JSON.parse(text) : {}) as Json };
}

/** The same request straight to the fake: what the upstream answers for the native size. */
async function upstreamImage(body: Json): Promise<Buffer> {
  const res = await fetch(`${fake.url}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: 'Bearer sk-resize', 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-image-1', prompt: 'a harbour at noon', ...body }),
  });
  expect(res.status).toBe(200);
  return Buffer.from(((await res.json()) as Json).data[0].b64_json, 'base64');
}

async function pixels(data: Buffer) {
  const m = await sharp(data).metadata();
  return { format: m.format, width: m.width, height: m.height };
}

async function charged(taskId: string) {
  const hold = await holdOf(server.db, taskId);
  const files = await server.db.selectFrom('files').select(['width', 'height', 'contentType']).where('taskId', '=', taskId).where('purpose', '=', 'image_output').execute();
  return { captured: hold.captured, status: hold.status, files };
}

describe('resize: exact (the default)', () => {
  it('resizes the upstream 1024x1024 to the table size 1248x1248 and says so', async () => {
    const res = await generate({ model: 'resize-exact', resolution: '1K', aspectRatio: '1:1' });
    expect(res.status, res.text).toBe(200);
    expect(res.body.size).toBe('1248x1248');
    expect(await pixels(Buffer.from(res.body.data[0].b64_json, 'base64'))).toEqual({ format: 'png', width: 1248, height: 1248 });
    expect(fake.calls.at(-1)!.params.size).toBe('1024x1024');
    expect(await charged(res.taskId)).toEqual({ captured: UNIT_PRICE * 1e6, status: 'captured', files: [{ width: 1248, height: 1248, contentType: 'image/png' }] });
  });
});

describe('resize: native', () => {
  it("returns the upstream's own bytes at its nearest native size, billed as the requested tier", async () => {
    const res = await generate({ model: 'resize-native', resolution: '1K', aspectRatio: '1:1' });
    expect(res.status, res.text).toBe(200);
    expect(res.body.size).toBe('1024x1024');
    const image = Buffer.from(res.body.data[0].b64_json, 'base64');
    expect(await pixels(image)).toEqual({ format: 'png', width: 1024, height: 1024 });
    // Neither resized nor re-encoded: byte for byte what the upstream answered.
    expect(image.equals(await upstreamImage({ size: '1024x1024' }))).toBe(true);
    expect(await charged(res.taskId)).toEqual({ captured: UNIT_PRICE * 1e6, status: 'captured', files: [{ width: 1024, height: 1024, contentType: 'image/png' }] });
  });

  it('a 3:2 request gets the upstream 1536x1024 (not 1248x832), for n images, in jpeg as asked', async () => {
    const res = await generate({ model: 'resize-native', size: '1248x832', n: 2, output_format: 'jpeg' });
    expect(res.status, res.text).toBe(200);
    expect(res.body.size).toBe('1536x1024');
    expect(res.body.output_format).toBe('jpeg');
    for (const item of res.body.data) expect(await pixels(Buffer.from(item.b64_json, 'base64'))).toEqual({ format: 'jpeg', width: 1536, height: 1024 });
    const { captured, files } = await charged(res.taskId);
    expect(captured).toBe(2 * UNIT_PRICE * 1e6);
    expect(files).toEqual([
      { width: 1536, height: 1024, contentType: 'image/jpeg' },
      { width: 1536, height: 1024, contentType: 'image/jpeg' },
    ]);
  });

  it('a URL answer links to the native image; the task lookup serves the same file', async () => {
    const res = await generate({ model: 'resize-native', response_format: 'url' });
    expect(res.status, res.text).toBe(200);
    expect(res.body.size).toBe('1024x1024');
    const file = await fetch(res.body.data[0].url);
    expect(file.status).toBe(200);
    expect(await pixels(Buffer.from(await file.arrayBuffer()))).toEqual({ format: 'png', width: 1024, height: 1024 });
  });

  it("a stream's completed event carries the native size, its partials the requested one", async () => {
    const res = await generate({ model: 'resize-native', stream: true, partial_images: 1 });
    expect(res.status).toBe(200);
    const events = res.text
      .split('\n\n')
      .filter((f) => f.trim())
      .map((f) => JSON.parse(/^data: (.+)$/m.exec(f)![1]!) as Json);
    const completed = events.find((e) => e.type === 'image_generation.completed')!;
    expect(completed.size).toBe('1024x1024');
    expect(await pixels(Buffer.from(completed.b64_json, 'base64'))).toEqual({ format: 'png', width: 1024, height: 1024 });
    expect(events.find((e) => e.type === 'image_generation.partial_image')!.size).toBe('auto');
    expect((await charged(res.taskId)).captured).toBe(UNIT_PRICE * 1e6);
  });
});

describe('the operator setting', () => {
  it('the admin API shows the default, and PATCH switches a model between exact and native for the next request', async () => {
    const get = async (id: string) => (await server.admin().GET('/admin/v1/models/{model_id}', { params: { path: { model_id: id } } })).data!;
    expect((await get('resize-exact')).image!.resize).toBe('exact');
    expect((await get('resize-native')).image!.resize).toBe('native');

    expect((await generate({ model: 'resize-switch' })).body.size).toBe('1248x1248');
    const patched = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'resize-switch' } }, body: { resize: 'native' } });
    expect(patched.response.status).toBe(200);
    expect(patched.data!.image!.resize).toBe('native');
    expect((await generate({ model: 'resize-switch' })).body.size).toBe('1024x1024');
    await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'resize-switch' } }, body: { resize: 'exact' } });
    expect((await generate({ model: 'resize-switch' })).body.size).toBe('1248x1248');
    // The default is not stored: the row reads as one created without the setting.
    const row = await server.db.selectFrom('catalogModels').select('capabilities').where('id', '=', 'resize-switch').executeTakeFirstOrThrow();
    expect(row.capabilities).not.toHaveProperty('resize');
  });

  it('a video model has no resize setting; an unknown value is refused by the contract', async () => {
    const video = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'local-video-1' } }, body: { resize: 'native' } });
    expect(video.response.status).toBe(400);
    expect(video.error!.error).toMatchObject({ code: 'invalid_request', param: 'resize' });
    // Straight to the gateway: its own 400 (in the contract lane, Prism refuses a schema violation with a 422 first).
    const direct = createClient<paths>({ baseUrl: server.directUrl, headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
    const bad = await direct.PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'resize-switch' } }, body: { resize: 'stretch' as 'exact' } });
    expect(bad.response.status).toBe(400);
    expect(bad.error!.error.param).toBe('resize');
  });

  it('the CLI: models update --resize native|exact, and a value it does not know', async () => {
    const run = (...argv: string[]) => {
      const { values: flags, positionals } = parse(['models', ...argv]);
      const [, verb, ...args] = positionals;
      return modelCommands[verb!]!(commandContext(admin, 'models', verb!, args, flags));
    };
    const out = await run('update', 'resize-switch', '--resize', 'native');
    expect((out.json as Json).image.resize).toBe('native');
    expect(out.text).toMatch(/resize/);
    await until(async () => (await generate({ model: 'resize-switch' })).body.size === '1024x1024', 5_000, 'the CLI change to be heard');
    expect(((await run('update', 'resize-switch', '--resize', 'exact')).json as Json).image.resize).toBe('exact');
    await expect(run('update', 'resize-switch', '--resize', 'stretch')).rejects.toThrow(UsageError);
  });
});
