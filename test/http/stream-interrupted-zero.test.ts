/**
 * A synchronous streamed image whose process died before any image was recorded. A stream writes
 * each image's row (fenced by its attempt, FOR SHARE on the task row) before that image's
 * `completed` event goes out, and partial images are never charged: no row recorded means no image
 * delivered. So the task is failed (`interrupted`) and its hold released in the one fenced statement
 * that ends it, by the engine once its lease runs out or by the task sweeper past its lifetime; the
 * client's account is not left short of the hold for an operator (it was `needs_attention`, its
 * whole hold kept). A stream that recorded a row still waits for an operator.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fenceOf } from '../../server/repositories/leased-tasks.ts';
import { NO_LIMITS } from '../../server/services/limits/client-limits.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, waitImageTask } from '../support/tasks.ts';

/** A streamed synchronous task as its request starts it (leased by the request's process), for n images of 1 credit. */
async function streamedTask(server: TestServer, n: number) {
  const c = await createCustomer(server.db, { balance: 10 });
  const auth = { accountId: c.accountId, apiKeyId: c.apiKeyId, groupId: c.groupId, limits: NO_LIMITS };
  const prepared = await server.ctx.services.images.prepare(auth, 'generation', { prompt: 'a lighthouse', model: 'local-image-1', n, stream: true });
  const task = await server.ctx.services.images.start(auth, prepared, { async: false, stream: true });
  return { c, task };
}

/** Its process died: the lease it held runs out (and, `aged`, the task is past TASK_MAX_LIFETIME_SECONDS). */
const processDies = (server: TestServer, id: string, aged = false) =>
  server.db
    .updateTable('imageTasks')
    .set({ leaseExpiresAt: new Date(Date.now() - 1000), ...(aged && { createdAt: new Date(Date.now() - 3_700_000) }) })
    .where('id', '=', id)
    .execute();

/** An image row the stream wrote before its event went out. */
async function recordImage(server: TestServer, accountId: string, taskId: string): Promise<string> {
  const fileId = `file_streamed${Date.now()}${Math.random().toString(36).slice(2, 8)}`;
  await server.db
    .insertInto('files')
    .values({ id: fileId, accountId, purpose: 'image_output', contentType: 'image/png', bytes: 10, storageKey: `image_output/xx/${fileId}`, width: 1248, height: 1248, taskId, expiresAt: new Date(Date.now() + 86_400_000), filename: null })
    .execute();
  return fileId;
}

const balanceOf = async (server: TestServer, accountId: string) => (await server.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow()).balance;
const ledgerOf = async (server: TestServer, taskId: string) =>
  (await server.db.selectFrom('ledgerEntries').select(['kind', 'amount']).where('taskId', '=', taskId).orderBy('id').execute()).map((e) => `${e.kind} ${e.amount}`);

describe('a streamed synchronous image whose process died before recording any image, ended by the engine', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ workers: true });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('fails as interrupted and releases its whole hold: nothing was delivered, nothing is charged', async () => {
    const { c, task } = await streamedTask(server, 4);
    expect(await holdOf(server.db, task.id)).toEqual({ amount: 4_000_000, status: 'held', captured: 0 });
    await processDies(server, task.id);
    const row = await waitImageTask(server.db, task.id, (r) => r.status !== 'processing');
    expect(row).toMatchObject({ status: 'failed', errorCode: 'interrupted', delivered: 0, actualCredits: 0, resultFileIds: [], completedAt: expect.any(Date), leaseOwner: null });
    expect(row.errorMessage).toMatch(/before any image was delivered; nothing was charged/);
    expect(await holdOf(server.db, task.id)).toEqual({ amount: 4_000_000, status: 'released', captured: 0 });
    expect(await balanceOf(server, c.accountId)).toBe(10_000_000);
    expect(await ledgerOf(server, task.id)).toEqual(['hold 4000000', 'release 4000000']);
    // The client's poll says so, and its retry is not refused for credits held.
    const { data } = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: task.id } } });
    expect(data).toMatchObject({ status: 'failed', error: { code: 'interrupted' } });
  });

  it('still waits for an operator, its hold kept, once one image was recorded (it may have reached the client)', async () => {
    const { c, task } = await streamedTask(server, 2);
    const fileId = await recordImage(server, c.accountId, task.id);
    await processDies(server, task.id);
    const row = await waitImageTask(server.db, task.id, (r) => r.status !== 'processing');
    expect(row).toMatchObject({ status: 'needs_attention', errorCode: 'outcome_unknown', delivered: 1, resultFileIds: [fileId], completedAt: null });
    expect(await holdOf(server.db, task.id)).toEqual({ amount: 2_000_000, status: 'held', captured: 0 });
    expect(await ledgerOf(server, task.id)).toEqual(['hold 2000000']);
  });
});

describe('a streamed synchronous image whose process died before recording any image, found by the task sweeper', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer();
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('is failed and released as the engine does it', async () => {
    const { c, task } = await streamedTask(server, 3);
    await processDies(server, task.id, true);
    expect(await server.ctx.taskSweeper.run()).toMatchObject({ images: 1 });
    const row = await server.db.selectFrom('imageTasks').selectAll().where('id', '=', task.id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'failed', errorCode: 'interrupted', delivered: 0, actualCredits: 0 });
    expect(await holdOf(server.db, task.id)).toEqual({ amount: 3_000_000, status: 'released', captured: 0 });
    expect(await balanceOf(server, c.accountId)).toBe(10_000_000);
  });

  it('changes nothing when its fence no longer holds (another worker ended it, or took it over)', async () => {
    const { task } = await streamedTask(server, 1);
    const stale = { ...fenceOf(task), attempt: task.attempt + 1 };
    expect(await server.ctx.settlement.imageStreamInterrupted(stale)).toBeUndefined();
    expect(await server.db.selectFrom('imageTasks').select('status').where('id', '=', task.id).executeTakeFirstOrThrow()).toEqual({ status: 'processing' });
    expect(await holdOf(server.db, task.id)).toEqual({ amount: 1_000_000, status: 'held', captured: 0 });
  });
});
