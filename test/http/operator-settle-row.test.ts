/**
 * Money decided by the row a statement locks, not by an earlier read of it.
 * - An operator's settlement of a needs_attention image task: a row read while the task was still
 *   processing (delivered 0) and settled `refunded` once an interrupted stream had recorded one
 *   delivered image still captures that image (the client has it), with one release and one capture.
 * - A hold that adopts input files: a file that expired (or was deleted) since the request resolved
 *   it is not adopted (the media sweeper could be deleting its bytes): `input_files_gone`, nothing
 *   held, no task.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { newId } from '../../server/lib/ids.ts';
import { fenceOf } from '../../server/repositories/leased-tasks.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({});
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

/** A synchronous two-image task of 1 credit each, held and processing (this test holds its lease). */
async function heldTask(accountId: string, apiKeyId: string, groupId: string, inputFileIds: string[] = []) {
  const taskId = newId('img');
  const row = {
    id: taskId,
    accountId,
    apiKeyId,
    groupId,
    operation: 'generation',
    model: 'local-image-1',
    prompt: 'p',
    params: JSON.stringify({ outputFormat: 'png' }),
    inputFileIds,
    maskFileId: null,
    n: 2,
    unitPrice: 1_000_000,
    quotedCredits: 2_000_000,
    runAsync: false,
    attempt: 1,
    leaseOwner: 'w_test',
  };
  const held = await server.ctx.repositories.ledger.holdAndInsertTask(
    { holdId: newId('hold'), accountId, apiKeyId, taskId, amount: 2_000_000 },
    // eslint-disable-next-line @typescript-eslint/no-explicit-any -- a raw row of the table, as the image service builds it
    { table: 'imageTasks', row: row as any, leaseMs: 60_000 },
    { fileIds: inputFileIds, pinSeconds: 3600, retentionDays: 1 },
  );
  return { taskId, outcome: held.outcome };
}

async function customer() {
  const account = await createAccount(server.db, { balance: 10 });
  const group = await createGroup(server.db);
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { account, group, key };
}

async function upload(accountId: string, expiresAt: Date): Promise<string> {
  const id = newId('file');
  await server.db
    .insertInto('files')
    .values({ id, accountId, purpose: 'upload', contentType: 'image/png', bytes: 10, storageKey: `upload/xx/${id}`, width: 64, height: 64, expiresAt, filename: 'in.png' })
    .execute();
  return id;
}

it('a hold does not adopt an input file that has expired since it was resolved: input_files_gone, nothing held', async () => {
  const { account, group, key } = await customer();
  const live = await upload(account.id, new Date(Date.now() + 3_600_000));
  const expired = await upload(account.id, new Date(Date.now() - 1000));
  const refused = await heldTask(account.id, key.id, group.id, [live, expired]);
  expect(refused.outcome).toBe('input_files_gone');
  expect(await server.db.selectFrom('imageTasks').select('id').where('id', '=', refused.taskId).executeTakeFirst()).toBeUndefined();
  expect(await server.db.selectFrom('creditHolds').select('id').where('taskId', '=', refused.taskId).executeTakeFirst()).toBeUndefined();
  // The live file was not adopted either (one statement: all or nothing), and a live set is.
  expect((await server.db.selectFrom('files').select('taskId').where('id', '=', live).executeTakeFirstOrThrow()).taskId).toBeNull();
  expect((await heldTask(account.id, key.id, group.id, [live])).outcome).toBe('ok');
});

it('a refund captures the images the locked row says were delivered, whatever the row read before said', async () => {
  const { account, group, key } = await customer();
  const { taskId } = await heldTask(account.id, key.id, group.id);
  const stale = (await server.ctx.repositories.imageTasks.find(taskId))!;
  expect([stale.status, stale.delivered]).toEqual(['processing', 0]);
  // The stream was interrupted after one image had gone out.
  await server.ctx.repositories.imageTasks.needsAttention(fenceOf({ id: taskId, attempt: 1 }), 'interrupted', { fileIds: [], unrecorded: [], delivered: 1 });

  const settled = (await server.ctx.settlement.settleImageByOperator(stale, 'refunded', 'goodwill'))!;
  expect([settled.status, settled.delivered, settled.actualCredits]).toEqual(['failed', 1, 1_000_000]);
  const hold = await server.db.selectFrom('creditHolds').selectAll().where('taskId', '=', taskId).executeTakeFirstOrThrow();
  expect([hold.status, Number(hold.captured)]).toEqual(['captured', 1_000_000]);
  const entries = await server.db.selectFrom('ledgerEntries').select(['kind', 'amount']).where('taskId', '=', taskId).orderBy('id').execute();
  expect(entries.map((e) => [e.kind, Number(e.amount)])).toEqual(expect.arrayContaining([['capture', 1_000_000], ['release', 1_000_000]]));
});

it("judges a file's expiry when the hold reaches it, not when the hold began: one that expired while the hold waited on the account is not adopted", async () => {
  const { account, group, key } = await customer();
  // A file that expires 1.5 s from now.
  const fileId = await upload(account.id, new Date(Date.now() + 1500));
  // Another hold of the account in progress holds its row; this request's hold (its statement's
  // now() is this moment) waits for it while the file expires and the sweeper may read it.
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  let locked!: () => void;
  const lockTaken = new Promise<void>((resolve) => (locked = resolve));
  const other = server.db.transaction().execute(async (trx) => {
    await sql`select 1 from accounts where id = ${account.id} for update`.execute(trx);
    locked();
    await released;
  });
  await lockTaken;
  const holding = heldTask(account.id, key.id, group.id, [fileId]);
  await new Promise((resolve) => setTimeout(resolve, 2500));
  // What the media sweeper reads now: the file is expired and no row lock keeps it.
  expect((await server.ctx.repositories.files.expiredAfter(undefined, 1000, server.db)).some((f) => f.id === fileId)).toBe(true);
  release();
  await other;
  expect((await holding).outcome).toBe('input_files_gone');
});
