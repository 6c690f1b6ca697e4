/**
 * A video creation may spell a frame or the reference images both ways (`firstFrame` and
 * `first_frame`, …) when both agree (product spec §4.6). The same data URL under both spellings is
 * one media input: read, counted against the byte and count limits, and stored once. Different
 * images under the two spellings are `400 alias_conflict`, leaving nothing.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { accountState, until } from '../support/tasks.ts';
import { noisePng } from '../support/noise-png.ts';

type Json = Record<string, any>;
let server: TestServer;
let frame: Buffer;
let other: Buffer;


beforeAll(async () => {
  frame = await noisePng(120, 100, 1);
  other = await noisePng(120, 100, 2);
  // One frame fits; two copies of it would not (nor would two inputs beyond the count limit).
  server = await startTestServer({ env: { MAX_MEDIA_INPUT_BYTES: String(Math.ceil(frame.length * 1.5)), MAX_MEDIA_INPUT_COUNT: '2' } });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

const dataUrl = (buf: Buffer) => `data:image/png;base64,${buf.toString('base64')}`;
const video = (extra: Json = {}) => ({ client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', ...extra });

async function create(key: string, payload: unknown) {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(payload) });
  return { status: res.status, body: (await res.json()) as Json };
}

const inputFiles = (accountId: string) => server.db.selectFrom('files').select(['id', 'taskId', 'bytes']).where('accountId', '=', accountId).where('purpose', '=', 'input').execute();

describe('the same data URL under both spellings of a media field', () => {
  it('is one input: accepted under the byte limit that two copies would pass, and stored once', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await create(c.key, video({ firstFrame: dataUrl(frame), first_frame: dataUrl(frame) }));
    expect(res.status).toBe(202);
    const task = await server.db.selectFrom('videoTasks').select(['id', 'inputFileIds']).where('id', '=', res.body.id).executeTakeFirstOrThrow();
    expect(task.inputFileIds).toHaveLength(1);
    // Once the request is over, the account has that one input file, the task's: no second copy was stored.
    await until(async () => (await inputFiles(c.accountId)).every((f) => f.taskId !== null), 3000, 'unadopted inputs to be removed');
    expect(await inputFiles(c.accountId)).toEqual([{ id: task.inputFileIds[0], taskId: task.id, bytes: frame.length }]);
  });

  it('counts reference images given under both spellings once, against the byte and the count limit', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const small = await noisePng(40, 30, 3);
    const refs = [dataUrl(small), dataUrl(frame)];
    const res = await create(c.key, video({ referenceImages: refs, reference_images: refs }));
    expect(res.status).toBe(202);
    const task = await server.db.selectFrom('videoTasks').select('inputFileIds').where('id', '=', res.body.id).executeTakeFirstOrThrow();
    expect(task.inputFileIds).toHaveLength(2);
    await until(async () => (await inputFiles(c.accountId)).length === 2, 3000, 'unadopted inputs to be removed');
  });

  it.each([
    ['another image of the same size', () => dataUrl(other)],
    ['a longer image', () => dataUrl(Buffer.concat([frame, Buffer.from([0])]))],
    ['a shorter image', () => dataUrl(frame.subarray(0, frame.length - 1))],
  ])('refuses %s under the other spelling with 400 alias_conflict, leaving nothing', async (_what, twin) => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await create(c.key, video({ firstFrame: dataUrl(frame), first_frame: twin() }));
    expect([res.status, res.body.error?.code, res.body.error?.param]).toEqual([400, 'alias_conflict', 'first_frame']);
    await until(async () => (await inputFiles(c.accountId)).length === 0, 3000, 'staged inputs to be removed');
    const state = await accountState(server.db, c.accountId, c.apiKeyId);
    expect([state.tasks, state.holds.length]).toEqual([0, 0]);
  });

  it('still refuses a data URL and a file id that disagree with 400 alias_conflict', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await create(c.key, video({ first_frame: dataUrl(frame), firstFrame: 'file_doesnotexist' }));
    expect([res.status, res.body.error?.code]).toEqual([400, 'alias_conflict']);
  });
});
