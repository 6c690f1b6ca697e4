/**
 * A file a request names that is deleted (or expires) after it was resolved and before the hold:
 * the hold statement adopts every file the task names or writes nothing, and the request answers
 * 404 file_not_found with nothing created, held or charged. (Before, the task was created naming a
 * file that was gone, and its submit failed on it until the task's deadline.) The window is made
 * certain by deleting the file just before the hold statement runs.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { accountState } from '../support/tasks.ts';

let server: TestServer;
/** Deleted right before the next hold statement, as a concurrent delete or the expiry sweep would. */
let vanishBeforeHold: string | undefined;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
  const ledger = server.ctx.repositories.ledger;
  const hold = ledger.holdAndInsertTask.bind(ledger);
  ledger.holdAndInsertTask = (async (...args: Parameters<typeof hold>) => {
    if (vanishBeforeHold) await server.db.deleteFrom('files').where('id', '=', vanishBeforeHold).execute();
    vanishBeforeHold = undefined;
    return hold(...args);
  }) as typeof ledger.holdAndInsertTask;
});
afterAll(async () => server?.close());

async function upload(key: string): Promise<string> {
  const png = await sharp({ create: { width: 320, height: 180, channels: 3, background: { r: 30, g: 90, b: 160 } } }).png().toBuffer();
  const form = new FormData();
  form.append('purpose', 'input');
  form.append('file', new Blob([png], { type: 'image/png' }), 'frame.png');
  const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form });
  expect(res.status).toBe(201);
  return ((await res.json()) as { id: string }).id;
}

const post = async (key: string, path: string, body: unknown) => {
  const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as { error?: { code: string; message: string } } };
};

describe('a named file that vanishes before the hold', () => {
  it.each([
    ['a video first frame', '/v1/videos/generations', (id: string) => ({ client_request_id: `gone-${id}`, prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', firstFrame: id })],
    ['an image edit input', '/v1/images/edits', (id: string) => ({ model: 'local-image-1', prompt: 'add a hat', images: [id] })],
  ])('%s: 404 file_not_found, nothing created, held or charged', async (_what, path, body) => {
    const c = await createCustomer(server.db, { balance: 100 });
    const id = await upload(c.key);
    const before = await accountState(server.db, c.accountId, c.apiKeyId);
    vanishBeforeHold = id;
    const res = await post(c.key, path, body(id));
    expect([res.status, res.body.error?.code]).toEqual([404, 'file_not_found']);
    expect(await accountState(server.db, c.accountId, c.apiKeyId)).toEqual(before);
    expect(await server.db.selectFrom('videoTasks').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
    expect(await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  });

  it('the same request with the file still there goes through', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const id = await upload(c.key);
    expect((await post(c.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'add a hat', images: [id] })).status).toBe(200);
  });
});
