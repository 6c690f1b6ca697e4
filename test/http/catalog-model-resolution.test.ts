/**
 * How a generation request finds its model, the same for images and videos (the contract's
 * ErrorCode): the operation's switch first (`503 capability_disabled`, whatever the model), then a
 * model the key's group lists but no enabled member can serve (`503 no_reachable_member`), then
 * `404 model_not_found`.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAccount, createApiKey, createGroup, createMember, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { accountState } from '../support/tasks.ts';

let server: TestServer;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

let seq = 0;
const image = (model: string) => ({ path: '/v1/images/generations', body: { model, prompt: 'a kite' } });
const video = (model: string) => ({
  path: '/v1/videos/generations',
  body: { client_request_id: `resolution-${++seq}`, prompt: 'a kite', model, seconds: 4, aspectRatio: '16:9', resolution: '360p' },
});

async function post(key: string, request: { path: string; body: unknown }) {
  const res = await fetch(`${server.directUrl}${request.path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(request.body),
  });
  const body = (await res.json()) as { error?: { code: string } };
  return [res.status, body.error?.code];
}

/** A key whose group has one member listing `models`, enabled or not. */
async function keyWith(models: string[], enabled: boolean) {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  await createMember(server.db, group.id, { models, enabled });
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, apiKeyId: key.id, key: key.key };
}

async function setSwitch(name: 'image_generation' | 'video_generation', enabled: boolean) {
  const { response } = await server.admin().PUT('/admin/v1/capability-switches/{name}', { params: { path: { name } }, body: { enabled } });
  expect(response.status).toBe(200);
}

describe('resolving the model of a generation', () => {
  it('answers 503 no_reachable_member for images and videos alike when only a disabled member lists the model, creating nothing', async () => {
    const c = await keyWith(['local-image-1', 'local-video-1'], false);
    expect(await post(c.key, image('local-image-1'))).toEqual([503, 'no_reachable_member']);
    expect(await post(c.key, video('local-video-1'))).toEqual([503, 'no_reachable_member']);
    expect(await accountState(server.db, c.accountId, c.apiKeyId)).toMatchObject({ balance: 100_000_000, holds: [], tasks: 0 });
    // Still not offered: the listings show only what an enabled member serves.
    expect((await server.client(c.key).GET('/v1/models')).data?.data).toEqual([]);
    expect((await server.client(c.key).GET('/v1/videos/capabilities')).data?.items).toEqual([]);
  });

  it('answers 404 model_not_found for images and videos alike for a catalog model the group does not list', async () => {
    const c = await keyWith(['local-image-pro', 'local-video-lite'], true);
    expect(await post(c.key, image('local-image-1'))).toEqual([404, 'model_not_found']);
    expect(await post(c.key, video('local-video-1'))).toEqual([404, 'model_not_found']);
  });

  it('answers 503 capability_disabled for images and videos alike while the switch is off, even for an unknown model', async () => {
    const c = await keyWith(['local-image-1', 'local-video-1'], true);
    await setSwitch('image_generation', false);
    await setSwitch('video_generation', false);
    try {
      for (const model of ['no-such-model', 'local-image-1']) expect(await post(c.key, image(model))).toEqual([503, 'capability_disabled']);
      for (const model of ['no-such-model', 'local-video-1']) expect(await post(c.key, video(model))).toEqual([503, 'capability_disabled']);
    } finally {
      await setSwitch('image_generation', true);
      await setSwitch('video_generation', true);
    }
    expect(await post(c.key, image('no-such-model'))).toEqual([404, 'model_not_found']);
    expect(await post(c.key, video('no-such-model'))).toEqual([404, 'model_not_found']);
  });
});
