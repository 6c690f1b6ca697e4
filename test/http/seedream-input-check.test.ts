/**
 * Seedream's input limits judged before the hold (ImageProvider.checkInputs), through the public
 * API against the fake ModelArk (test/fakes/ark.ts): an input no scaling fits into Seedream (a
 * ratio past 16:1) is the client's 400 invalid_image naming it, with nothing held, no task and no
 * upstream call, when every member serving the model is Ark; with a member whose upstream takes
 * it, the edit goes there (synchronous and background) instead of failing on Ark after the hold.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { startArkFake, type ArkFake } from '../fakes/ark.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, waitImageTask } from '../support/tasks.ts';

const SEEDREAM_40 = 'seedream-4-0-250828';

let server: TestServer;
let fake: ArkFake;

beforeAll(async () => {
  fake = await startArkFake({ accounts: { 'ark-a': {} } });
  server = await startTestServer({ workers: true });
  const created = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(`ark/${SEEDREAM_40}`)!.model });
  expect(created.response.status).toBe(201);
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

type Json = Record<string, any>;

/** A customer whose group serves Seedream 4.0 on an Ark member, and on a `local` member behind it when asked. */
async function customer(opts: { local?: boolean } = {}) {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const members: Record<string, string> = {};
  // Ark first (the higher priority): without the check, every edit would be tried there first.
  const bodies = [
    { name: 'ark', provider: 'ark' as const, base_url: `${fake.url}/api/v3`, credentials: { api_key: 'ark-a' }, models: [SEEDREAM_40], priority: 10 },
    ...(opts.local ? [{ name: 'local', provider: 'local' as const, models: [SEEDREAM_40], priority: 0 }] : []),
  ];
  for (const body of bodies) {
    const created = await server.admin().POST('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: group.id } }, body });
    expect(created.response.status, JSON.stringify(created.error)).toBe(201);
    members[body.name] = created.data!.id;
  }
  const key = (await createApiKey(server.db, { accountId: account.id, groupId: group.id })).key;
  return { accountId: account.id, key, members };
}

async function edit(key: string, images: Buffer[], headers: Record<string, string> = {}) {
  const res = await fetch(`${server.directUrl}/v1/images/edits`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify({ model: SEEDREAM_40, prompt: 'add a boat', aspect_ratio: '1:1', images: images.map((b) => `data:image/png;base64,${b.toString('base64')}`) }),
  });
  return { status: res.status, taskId: res.headers.get('x-task-id'), body: (await res.json()) as Json };
}

const png = (width: number, height: number) => sharp({ create: { width, height, channels: 3, background: '#4080c0' } }).png().toBuffer();

/** Balance, holds and image tasks of an account. */
async function stateOf(accountId: string) {
  const account = await server.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow();
  const holds = await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', accountId).execute();
  const tasks = await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', accountId).execute();
  return { balance: account.balance, holds: holds.length, tasks: tasks.length };
}

describe('Seedream input limits before the hold', () => {
  it.each([
    ['synchronous', {}],
    ['background', { Prefer: 'respond-async' }],
  ])('refuses a %s edit with a 20x400 input (ratio 20) as 400 invalid_image naming it, holding nothing and calling no upstream', async (_mode, headers) => {
    const c = await customer();
    const before = await stateOf(c.accountId);
    const requests = fake.requests.length;
    const res = await edit(c.key, [await png(64, 64), await png(20, 400)], headers);
    expect([res.status, res.body.error?.code, res.body.error?.param]).toEqual([400, 'invalid_image', 'images[1]']);
    expect(res.body.error.message).toBe(`'images[1]' is 20x400 pixels; model '${SEEDREAM_40}' runs on an upstream that takes only input images with an aspect ratio from 1:16 to 16:1.`);
    expect(await stateOf(c.accountId)).toEqual({ ...before, holds: 0, tasks: 0 });
    expect(fake.requests.length).toBe(requests);
  });

  it('refuses a 10x200 input before the hold too (under the gateway’s own 16 px edge)', async () => {
    const c = await customer();
    const requests = fake.requests.length;
    const res = await edit(c.key, [await png(10, 200)]);
    expect([res.status, res.body.error?.code, res.body.error?.param]).toEqual([400, 'invalid_image', 'images[0]']);
    expect(await stateOf(c.accountId)).toMatchObject({ holds: 0, tasks: 0 });
    expect(fake.requests.length).toBe(requests);
  });

  it('sends an input within the limits (ratio 16) to Seedream and charges it', async () => {
    const c = await customer();
    const calls = fake.imageCalls.length;
    const res = await edit(c.key, [await png(32, 512)]);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(fake.imageCalls.length).toBe(calls + 1);
    expect(fake.imageCalls.at(-1)!.images.map((i) => `${i.width}x${i.height}`)).toEqual(['32x512']);
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured' });
  });

  it('routes an edit Seedream cannot take to a member whose upstream can, synchronous or in the background', async () => {
    const c = await customer({ local: true });
    const requests = fake.requests.length;
    const sync = await edit(c.key, [await png(20, 400)]);
    expect(sync.status, JSON.stringify(sync.body)).toBe(200);
    const background = await edit(c.key, [await png(20, 400)], { Prefer: 'respond-async' });
    expect(background.status, JSON.stringify(background.body)).toBe(202);
    const done = await waitImageTask(server.db, background.body.id as string, (row) => !['queued', 'processing'].includes(row.status));
    expect(done.status).toBe('completed');
    for (const id of [sync.taskId!, background.body.id as string]) {
      const row = await server.db.selectFrom('imageTasks').select(['status', 'memberId']).where('id', '=', id).executeTakeFirstOrThrow();
      expect(row).toEqual({ status: 'completed', memberId: c.members.local });
      expect(await holdOf(server.db, id)).toMatchObject({ status: 'captured' });
    }
    expect(fake.requests.length).toBe(requests);
  });
});
