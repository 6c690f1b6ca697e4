/**
 * The images and mask of a multipart edit are kept as a JSON edit's inputs are: the hold adopts
 * them, so they belong to their task and expire after its lifetime, a day and INPUT_RETENTION_DAYS
 * (or the account's own), when the media sweeper deletes them; they were once stored with their
 * task set and no expiry, and never deleted. A request that creates no task keeps none of them.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

type Json = Record<string, any>;

const DAY = 86_400_000;
const LIFETIME_SECONDS = 3600;
let server: TestServer;
let image: Buffer;
let mask: Buffer;

beforeAll(async () => {
  server = await startTestServer({ env: { TASK_MAX_LIFETIME_SECONDS: String(LIFETIME_SECONDS), INPUT_RETENTION_DAYS: '3' } });
  await seedCatalog(server.db);
  image = await sharp({ create: { width: 96, height: 64, channels: 3, background: '#20a060' } }).png().toBuffer();
  mask = await sharp({ create: { width: 96, height: 64, channels: 4, background: { r: 0, g: 0, b: 0, alpha: 0.5 } } }).png().toBuffer();
});
afterAll(async () => server?.close());

async function multipartEdit(key: string, headers: Record<string, string> = {}) {
  const form = new FormData();
  form.append('prompt', 'paint it');
  form.append('model', 'local-image-1');
  form.append('image', new Blob([image], { type: 'image/png' }), 'in.png');
  form.append('mask', new Blob([mask], { type: 'image/png' }), 'mask.png');
  const res = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, ...headers }, body: form });
  return { status: res.status, taskId: res.headers.get('x-task-id'), body: (await res.json()) as Json };
}

const filesOf = (accountId: string) =>
  server.db.selectFrom('files').select(['id', 'purpose', 'taskId', 'expiresAt']).where('accountId', '=', accountId).where('purpose', '=', 'input').orderBy('id').execute();

/** The task's input rows: its image and its mask, adopted by it and expiring `retentionDays` after its lifetime and a day. */
async function expectAdopted(accountId: string, taskId: string, retentionDays: number) {
  const task = await server.db.selectFrom('imageTasks').select(['inputFileIds', 'maskFileId']).where('id', '=', taskId).executeTakeFirstOrThrow();
  expect(task.inputFileIds).toHaveLength(1);
  expect(task.maskFileId).not.toBeNull();
  const rows = await filesOf(accountId);
  expect(rows.map((r) => r.id).sort()).toEqual([...task.inputFileIds, task.maskFileId!].sort());
  const expected = Date.now() + LIFETIME_SECONDS * 1000 + DAY + retentionDays * DAY;
  for (const row of rows) {
    expect(row.taskId).toBe(taskId);
    expect(row.expiresAt).not.toBeNull();
    expect(Math.abs(row.expiresAt!.getTime() - expected)).toBeLessThan(60_000);
  }
}

describe('the inputs of a multipart edit', () => {
  it('of a synchronous edit are adopted by its task and expire after its lifetime, a day and INPUT_RETENTION_DAYS', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await multipartEdit(c.key);
    expect(res.status).toBe(200);
    await expectAdopted(c.accountId, res.taskId!, 3);
  });

  it('of a respond-async edit are adopted by its task as it is created', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await multipartEdit(c.key, { Prefer: 'respond-async' });
    expect(res.status).toBe(202);
    await expectAdopted(c.accountId, res.taskId!, 3);
  });

  it("follow the account's own input retention", async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    await server.db.updateTable('accounts').set({ inputRetentionDays: 1 }).where('id', '=', c.accountId).execute();
    const res = await multipartEdit(c.key);
    expect(res.status).toBe(200);
    await expectAdopted(c.accountId, res.taskId!, 1);
  });

  it('are removed when the hold is refused', async () => {
    const c = await createCustomer(server.db, { balance: 0 });
    const res = await multipartEdit(c.key);
    expect(res.status).toBe(402);
    expect(res.body.error.code).toBe('insufficient_balance');
    expect(await filesOf(c.accountId)).toEqual([]);
  });

  it('are not stored when the routing draw fails', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const draw = vi.spyOn(server.ctx.runners.image, 'preselect').mockRejectedValueOnce(new Error('the routing draw failed'));
    try {
      const res = await multipartEdit(c.key);
      expect(res.status).toBe(500);
      expect(res.body.error.code).toBe('internal_error');
      expect(draw).toHaveBeenCalledTimes(1);
    } finally {
      draw.mockRestore();
    }
    expect(await filesOf(c.accountId)).toEqual([]);
    expect(await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  });
});
