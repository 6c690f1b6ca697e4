/**
 * An image task's life in its two statements (design §5, §6): the hold statement inserts the task
 * and returns it as stored, and the finishing statement writes the terminal state, the rows of the
 * delivered files and the settlement of the hold together, or nothing at all when the fence no
 * longer holds.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../server/lib/ids.ts';
import { MICRO } from '../../server/lib/money.ts';
import type { FileRow } from '../../server/repositories/file.repository.ts';
import { ImageTaskRepository } from '../../server/repositories/image-task.repository.ts';
import { fenceOf } from '../../server/repositories/leased-tasks.ts';
import { LedgerRepository } from '../../server/repositories/ledger.repository.ts';
import { imageTaskToHold } from '../support/factories.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase;
let ledger: LedgerRepository;
let images: ImageTaskRepository;

beforeAll(async () => {
  t = await createTestDatabase();
  ledger = new LedgerRepository(t.db);
  images = new ImageTaskRepository(t.db);
});
afterAll(async () => t?.destroy());

/** A synchronous image task of n images at 2 credits each, held on a fresh account of 100 credits. */
async function startTask(n: number) {
  const { accountId, apiKeyId, taskId, row, hold } = await imageTaskToHold(t.db, { n, unitPrice: 2 * MICRO, leaseOwner: 'me' });
  const result = await ledger.holdAndInsertTask(hold, { table: 'imageTasks', row });
  return { accountId, apiKeyId, taskId, unitPrice: 2 * MICRO, result };
}

function outputFile(accountId: string, taskId: string): FileRow {
  const id = newId('file');
  return { id, accountId, purpose: 'image_output', contentType: 'image/png', bytes: 10, storageKey: `image_output/${id}.png`, width: 2, height: 2, taskId, expiresAt: null, filename: null };
}

const balanceOf = async (accountId: string) => (await t.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow()).balance;
const fileRows = (taskId: string) => t.db.selectFrom('files').select(['id', 'bytes', 'width', 'purpose', 'createdAt']).where('taskId', '=', taskId).orderBy('id').execute();

describe('an image task', () => {
  it('is returned by the hold statement exactly as a read of its row finds it', async () => {
    const { taskId, result } = await startTask(2);
    expect(result.outcome).toBe('ok');
    const stored = await images.find(taskId);
    expect(result.task).toEqual(stored);
    expect(result.task!.createdAt).toBeInstanceOf(Date);
  });

  it('is not returned when the hold fails', async () => {
    const { accountId, apiKeyId } = await startTask(1);
    const taskId = newId('img');
    const result = await ledger.holdAndInsertTask(
      { holdId: newId('hold'), accountId, apiKeyId, taskId, amount: 1000 * MICRO },
      { table: 'videoTasks', row: { id: taskId } as never },
    );
    expect(result).toEqual({ outcome: 'insufficient_balance' });
  });

  it('completes with the rows of its delivered files and captures delivered x price in one statement', async () => {
    const { accountId, taskId, unitPrice, result } = await startTask(3);
    const delivered = [outputFile(accountId, taskId), outputFile(accountId, taskId)];
    const done = await images.complete(
      fenceOf(result.task!),
      { fileIds: delivered.map((f) => f.id), actualCredits: 2 * unitPrice, revisedPrompt: 'r', unrecorded: delivered },
      (hold) => ledger.settlement(hold, 2 * unitPrice),
    );
    expect(done).toBe(true);
    expect(await images.find(taskId)).toMatchObject({ status: 'completed', delivered: 2, actualCredits: 2 * unitPrice, revisedPrompt: 'r', resultFileIds: delivered.map((f) => f.id), leaseOwner: null });
    const files = await fileRows(taskId);
    expect(files.map((f) => f.id)).toEqual(delivered.map((f) => f.id).sort());
    expect(files[0]).toMatchObject({ bytes: 10, width: 2, purpose: 'image_output' });
    expect(files[0]!.createdAt).toBeInstanceOf(Date);
    expect(await balanceOf(accountId)).toBe(100 * MICRO - 2 * unitPrice);
    expect(await ledger.findHoldByTask(taskId)).toMatchObject({ status: 'captured', captured: 2 * unitPrice });
  });

  it('writes nothing, neither state nor files nor settlement, when its fence no longer holds', async () => {
    const { accountId, taskId, unitPrice, result } = await startTask(1);
    const stale = { ...fenceOf(result.task!), attempt: result.task!.attempt + 1 };
    const file = outputFile(accountId, taskId);
    expect(await images.complete(stale, { fileIds: [file.id], actualCredits: unitPrice, revisedPrompt: null, unrecorded: [file] }, (hold) => ledger.settlement(hold, unitPrice))).toBe(false);
    expect(await fileRows(taskId)).toEqual([]);
    expect((await images.find(taskId))!.status).toBe('processing');
    expect(await ledger.findHoldByTask(taskId)).toMatchObject({ status: 'held' });
    expect(await balanceOf(accountId)).toBe(100 * MICRO - unitPrice);
  });

  it('aborts the whole statement when its hold was already settled', async () => {
    const { accountId, taskId, unitPrice, result } = await startTask(1);
    expect(await ledger.settleForTask(taskId, 0, t.db)).toBe(true);
    const file = outputFile(accountId, taskId);
    await expect(
      images.complete(fenceOf(result.task!), { fileIds: [file.id], actualCredits: unitPrice, revisedPrompt: null, unrecorded: [file] }, (hold) => ledger.settlement(hold, unitPrice)),
    ).rejects.toThrow(/already settled/);
    expect(await fileRows(taskId)).toEqual([]);
    expect((await images.find(taskId))!.status).toBe('processing');
    expect(await balanceOf(accountId)).toBe(100 * MICRO);
  });

  it('fails and releases everything, or waits for an operator with its stored files and its hold', async () => {
    const failed = await startTask(2);
    expect(await images.fail(fenceOf(failed.result.task!), 'upstream_error', 'boom', (hold) => ledger.settlement(hold, 0))).toMatchObject({ status: 'failed', errorCode: 'upstream_error', actualCredits: 0 });
    expect(await balanceOf(failed.accountId)).toBe(100 * MICRO);

    const stuck = await startTask(2);
    const file = outputFile(stuck.accountId, stuck.taskId);
    const row = await images.needsAttention(fenceOf(stuck.result.task!), 'not stored', { fileIds: [file.id], unrecorded: [file] });
    expect(row).toMatchObject({ status: 'needs_attention', delivered: 1, errorCode: 'outcome_unknown', completedAt: null });
    expect((await fileRows(stuck.taskId)).map((f) => f.id)).toEqual([file.id]);
    expect(await ledger.findHoldByTask(stuck.taskId)).toMatchObject({ status: 'held' });
  });
});
