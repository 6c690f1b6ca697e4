/**
 * What an image model's catalog entry says it does, enforced at creation through the public API,
 * before anything is stored, held or sent:
 * - an edit of a prompt-only model (`edits: false`: the shipped FLUX, Seedream-on-fal, Ideogram and
 *   Kling image definitions) is `400 edits_not_supported`, synchronous or `Prefer: respond-async`
 *   (it was charged as an edit while the mapping dropped the images, or held and then refused by
 *   the Kling adapter);
 * - a custom size of a ratio Replicate refuses, or with an edge fal refuses, is a 400 naming
 *   `size`, and no member is faulted (the upstream's 422 read as the member's misconfiguration
 *   took the model off every member);
 * - `edits` is the operator's to change (PATCH), and a model without it edits.
 * The upstreams are the fakes of test/fakes (fal.ts, replicate.ts, kling.ts).
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { KlingImageProvider } from '../../server/providers/kling/kling-image.provider.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { startKlingFake, type KlingFake } from '../fakes/kling.ts';
import { startReplicateFake, type ReplicateFake } from '../fakes/replicate.ts';
import { createAccount, createApiKey, createCustomer, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

const DEFINITIONS = { fal: ['flux-dev-fal', 'seedream-4-fal'], replicate: ['flux-schnell-replicate', 'ideogram-v3-turbo-replicate'], kling: ['kling-v3', 'kling-v2-1'] } as const;
type Provider = keyof typeof DEFINITIONS;

let server: TestServer;
let fal: FalFake;
let replicate: ReplicateFake;
let kling: KlingFake;

beforeAll(async () => {
  fal = await startFalFake({ apiKeys: ['fal-a:secret'], queueMs: 20, jobDurationMs: 50 });
  replicate = await startReplicateFake({ tokens: ['r8_a'], queueMs: 20, jobDurationMs: 50 });
  kling = await startKlingFake({ accounts: [{ accessKey: 'ak-a', secretKey: 'sk-a-secret' }], jobDurationMs: 100 });
  server = await startTestServer({ workers: true, overrides: { providers: { kling: { image: new KlingImageProvider({ pollIntervalMs: 50 }) } } } });
  await seedCatalog(server.db);
  for (const [provider, ids] of Object.entries(DEFINITIONS)) {
    for (const id of ids) expect((await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(`${provider}/${id}`)!.model })).response.status, id).toBe(201);
  }
});
afterAll(async () => {
  await server?.close();
  await fal?.close();
  await replicate?.close();
  await kling?.close();
});

type Json = Record<string, any>;

async function customer(provider: Provider) {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const members: Record<Provider, { base_url: string; credentials: Record<string, string> }> = {
    fal: { base_url: fal.url, credentials: { api_key: 'fal-a:secret' } },
    replicate: { base_url: replicate.baseUrl, credentials: { api_token: 'r8_a' } },
    kling: { base_url: kling.url, credentials: { access_key: 'ak-a', secret_key: 'sk-a-secret' } },
  };
  const member = members[provider];
  const { response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
    params: { path: { group_id: group.id } },
    body: { name: 'a', provider, ...member, models: [...DEFINITIONS[provider]], priority: 0 },
  });
  expect(response.status).toBe(201);
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { key: key.key, accountId: account.id, groupId: group.id };
}

async function post(key: string, path: string, body: Json, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Json, taskId: res.headers.get('x-task-id') };
}

const dataUrl = async (w: number, h: number) => `data:image/png;base64,${(await sharp({ create: { width: w, height: h, channels: 3, background: { r: 200, g: 10, b: 10 } } }).png().toBuffer()).toString('base64')}`;

/** What the request left behind: the account's image tasks, its ledger entries, its balance. */
async function traces(accountId: string) {
  const tasks = await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', accountId).execute();
  const ledger = await server.db.selectFrom('ledgerEntries').select('kind').where('accountId', '=', accountId).where('kind', '!=', 'grant').execute();
  return { tasks: tasks.length, ledger: ledger.length };
}

const upstreamCalls = () => ({ fal: fal.counts.submit, replicate: replicate.counts.create, kling: [...kling.tasks.values()].filter((t) => t.kind === 'image').length });

async function modelFaults(groupId: string) {
  const { data } = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } } });
  return data!.data.flatMap((m) => m.health.model_faults);
}

describe('an edit of a model that generates from a prompt only', () => {
  const models = Object.entries(DEFINITIONS).flatMap(([provider, ids]) => ids.map((id) => [id, provider as Provider] as const));

  it.each(models)('%s: 400 edits_not_supported, synchronous or async, before anything is stored, held or sent', async (model, provider) => {
    const c = await customer(provider);
    const before = upstreamCalls();
    const image = await dataUrl(1248, 1248);
    for (const headers of [{}, { Prefer: 'respond-async' }] as Record<string, string>[]) {
      const res = await post(c.key, '/v1/images/edits', { model, prompt: 'make the background blue', images: [image] }, headers);
      expect([res.status, res.body.error?.code, res.body.error?.param, res.taskId], JSON.stringify(headers)).toEqual([400, 'edits_not_supported', 'model', null]);
      expect(res.body.error.message).toContain(model);
    }
    expect(await traces(c.accountId)).toEqual({ tasks: 0, ledger: 0 });
    expect(upstreamCalls()).toEqual(before);
    // The same model still generates.
    const generated = await post(c.key, '/v1/images/generations', { model, prompt: 'a blue background' });
    expect(generated.status, JSON.stringify(generated.body)).toBe(200);
  });

  it('is the operator\'s setting: a model created without it edits; PATCH edits false refuses, true edits again', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const edit = async () => post(c.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'blue', images: [await dataUrl(512, 512)] });
    expect((await edit()).status).toBe(200);
    const patch = (edits: boolean) => server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'local-image-1' } }, body: { edits } });
    expect((await patch(false)).data!.image).toMatchObject({ edits: false });
    expect((await edit()).body.error).toMatchObject({ code: 'edits_not_supported', param: 'model' });
    await patch(true);
    expect((await edit()).status).toBe(200);
  });
});

describe('a custom size its upstream would refuse', () => {
  it('FLUX schnell on Replicate: a ratio outside its list is 400 unsupported_aspect_ratio, no prediction made, no member faulted; an offered ratio is asked for and delivered at the size', async () => {
    const c = await customer('replicate');
    const before = upstreamCalls();
    for (const size of ['1280x800', '1024x640']) {
      const refused = await post(c.key, '/v1/images/generations', { model: 'flux-schnell-replicate', prompt: 'a fox', size });
      expect([refused.status, refused.body.error?.code, refused.body.error?.param, refused.taskId], size).toEqual([400, 'unsupported_aspect_ratio', 'size', null]);
    }
    expect(upstreamCalls()).toEqual(before);
    expect(await traces(c.accountId)).toEqual({ tasks: 0, ledger: 0 });

    const ok = await post(c.key, '/v1/images/generations', { model: 'flux-schnell-replicate', prompt: 'a wide fox', size: '1280x720' });
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    expect([...replicate.predictions.values()].at(-1)!.input).toMatchObject({ prompt: 'a wide fox', aspect_ratio: '16:9' });
    const meta = await sharp(Buffer.from(ok.body.data[0].b64_json, 'base64')).metadata();
    expect([meta.width, meta.height]).toEqual([1280, 720]);
    expect(await modelFaults(c.groupId)).toEqual([]);
  });

  it('Seedream 4.0 on fal: an edge under 1024 px is 400 invalid_size, nothing submitted, no member faulted', async () => {
    const c = await customer('fal');
    const before = upstreamCalls();
    for (const size of ['2496x832', '2064x880']) {
      const refused = await post(c.key, '/v1/images/generations', { model: 'seedream-4-fal', prompt: 'a harbour', size });
      expect([refused.status, refused.body.error?.code, refused.body.error?.param], size).toEqual([400, 'invalid_size', 'size']);
      expect(refused.body.error.message).toContain('1024 to');
    }
    expect(upstreamCalls()).toEqual(before);
    const ok = await post(c.key, '/v1/images/generations', { model: 'seedream-4-fal', prompt: 'a harbour', size: '2048x1024' });
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    expect(fal.submitsTo('fal-ai/bytedance/seedream/v4/text-to-image').at(-1)!.input).toMatchObject({ image_size: { width: 2048, height: 1024 } });
    expect(await modelFaults(c.groupId)).toEqual([]);
  });
});
