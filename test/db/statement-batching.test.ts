/**
 * Group commit of the hot path (db/statement-batcher.ts): the holds of synchronous images that
 * arrive together go out as one statement, and so do the completions that capture a whole hold.
 * A batch writes exactly what its requests would have written one after the other, or nothing,
 * in which case each request runs its own statement and gets that statement's answer (a refused
 * hold, a unique violation, a fence that no longer holds, a hold already settled).
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../server/lib/ids.ts';
import { MICRO } from '../../server/lib/money.ts';
import type { FileRow } from '../../server/repositories/file.repository.ts';
import { ImageTaskRepository, type WholeCompletion } from '../../server/repositories/image-task.repository.ts';
import { fenceOf } from '../../server/repositories/leased-tasks.ts';
import { LedgerRepository, type HoldResult, type TaskInsert } from '../../server/repositories/ledger.repository.ts';
import type { AttemptRecord } from '../../server/repositories/task-attempt.repository.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase;
let groupId: string;

beforeAll(async () => {
  t = await createTestDatabase();
  groupId = (await createGroup(t.db)).id;
});
afterAll(async () => t?.destroy());

const PRICE = 2 * MICRO;
const batching = { maxInFlight: 1, maxBatch: 32 };

async function customer(balance: number, creditLimit: number | null = null) {
  const account = await createAccount(t.db, { balance });
  const key = await createApiKey(t.db, { accountId: account.id, groupId, creditLimit });
  return { accountId: account.id, apiKeyId: key.id };
}

/** A synchronous image's hold (as ImageService places it: unflushed, no caps, no inputs). */
function hold(ledger: LedgerRepository, c: { accountId: string; apiKeyId: string }, n = 1, taskId = newId('img')) {
  const row = {
    id: taskId,
    accountId: c.accountId,
    apiKeyId: c.apiKeyId,
    groupId,
    operation: 'generation',
    model: 'm',
    prompt: 'p',
    params: JSON.stringify({ outputFormat: 'png', size: '1024x1024' }),
    inputFileIds: [],
    maskFileId: null,
    n,
    unitPrice: PRICE,
    quotedCredits: n * PRICE,
    runAsync: false,
    attempt: 1,
    leaseOwner: 'me',
    leaseExpiresAt: new Date(Date.now() + 60_000),
    memberId: null,
    memberSlots: 1,
  };
  return ledger.holdAndInsertTask(
    { holdId: newId('hold'), accountId: c.accountId, apiKeyId: c.apiKeyId, taskId, amount: n * PRICE, inFlightCaps: { key: null, account: null } },
    { table: 'imageTasks', row } satisfies TaskInsert,
    undefined,
    'unflushed',
  );
}

const balanceOf = async (id: string) => (await t.db.selectFrom('accounts').select('balance').where('id', '=', id).executeTakeFirstOrThrow()).balance;
const usedOf = async (id: string) => (await t.db.selectFrom('apiKeys').select('creditsUsed').where('id', '=', id).executeTakeFirstOrThrow()).creditsUsed;
const ledgerOf = (accountId: string) => t.db.selectFrom('ledgerEntries').select(['kind', 'amount', 'taskId', 'holdId']).where('accountId', '=', accountId).where('kind', '<>', 'grant').execute();
const spentOf = async (accountId: string) =>
  Number((await sql<{ s: string | null }>`select sum(spent)::text as s from account_spend where account_id = ${accountId}`.execute(t.db)).rows[0]!.s ?? 0);
const outcomes = (results: HoldResult<TaskInsert>[]) => results.map((r) => r.outcome).sort();

describe('holds arriving together', () => {
  it('go out as one statement and write what the single statements write, and return each task as stored', async () => {
    const ledger = new LedgerRepository(t.db, batching);
    const c = await customer(100);
    const results = await Promise.all(Array.from({ length: 10 }, () => hold(ledger, c)));
    expect(ledger.holdBatchStats()).toEqual({ batches: 1, batched: 10, singles: 0, fallbacks: 0 });
    expect(outcomes(results)).toEqual(Array(10).fill('ok'));
    expect(await balanceOf(c.accountId)).toBe(100 * MICRO - 10 * PRICE);
    expect(await usedOf(c.apiKeyId)).toBe(10 * PRICE);
    const entries = await ledgerOf(c.accountId);
    expect(entries).toHaveLength(10);
    expect(entries.every((e) => e.kind === 'hold' && e.amount === PRICE)).toBe(true);
    const images = new ImageTaskRepository(t.db, false);
    for (const r of results) {
      expect(r.task).toEqual(await images.find(r.task!.id));
      expect(await ledger.findHoldByTask(r.task!.id)).toMatchObject({ status: 'held', amount: PRICE });
    }
  });

  it('of several keys and accounts are one statement too', async () => {
    const ledger = new LedgerRepository(t.db, batching);
    const cs = await Promise.all([customer(100), customer(100), customer(100)]);
    const results = await Promise.all(cs.flatMap((c) => [hold(ledger, c), hold(ledger, c, 2)]));
    expect(outcomes(results)).toEqual(Array(6).fill('ok'));
    expect(ledger.holdBatchStats()).toMatchObject({ batches: 1, batched: 6, fallbacks: 0 });
    for (const c of cs) {
      expect(await balanceOf(c.accountId)).toBe(100 * MICRO - 3 * PRICE);
      expect(await usedOf(c.apiKeyId)).toBe(3 * PRICE);
    }
  });

  it('answer each hold as alone when the balance cannot cover one of them: the others are placed, the balance never goes below zero', async () => {
    const ledger = new LedgerRepository(t.db, batching);
    const poor = await customer(5); // two holds of 2 credits fit, the third does not
    const rich = await customer(100);
    const results = await Promise.all([...[1, 2, 3].map(() => hold(ledger, poor)), ...[1, 2, 3].map(() => hold(ledger, rich))]);
    expect(outcomes(results.slice(0, 3))).toEqual(['insufficient_balance', 'ok', 'ok']);
    expect(outcomes(results.slice(3, 6))).toEqual(['ok', 'ok', 'ok']);
    expect(ledger.holdBatchStats()).toMatchObject({ batches: 0, fallbacks: 1, singles: 6 });
    expect(await balanceOf(poor.accountId)).toBe(1 * MICRO);
    expect(await balanceOf(rich.accountId)).toBe(94 * MICRO);
    // The refused hold left nothing behind.
    expect(await ledgerOf(poor.accountId)).toHaveLength(2);
    expect(await usedOf(poor.apiKeyId)).toBe(2 * PRICE);
  });

  it('answer each hold as alone when a key quota cannot cover one of them', async () => {
    const ledger = new LedgerRepository(t.db, batching);
    const capped = await customer(100, 4); // a key quota of 4 credits: two holds of 2 fit
    const rich = await customer(100);
    const results = await Promise.all([...[1, 2, 3].map(() => hold(ledger, capped)), ...[1, 2].map(() => hold(ledger, rich))]);
    expect(outcomes(results.slice(0, 3))).toEqual(['key_quota_exceeded', 'ok', 'ok']);
    expect(outcomes(results.slice(3))).toEqual(['ok', 'ok']);
    expect(ledger.holdBatchStats()).toMatchObject({ batches: 0, fallbacks: 1, singles: 5 });
    expect(await usedOf(capped.apiKeyId)).toBe(4 * MICRO);
    expect(await balanceOf(capped.accountId)).toBe(96 * MICRO);
    expect(await ledgerOf(capped.accountId)).toHaveLength(2);
  });

  it('give a unique violation to the request that caused it, and place the others', async () => {
    const ledger = new LedgerRepository(t.db, batching);
    const c = await customer(100);
    const taskId = newId('img');
    const settled = await Promise.allSettled([hold(ledger, c, 1, taskId), hold(ledger, c, 1, taskId), hold(ledger, c), hold(ledger, c)]);
    expect(settled.filter((s) => s.status === 'fulfilled')).toHaveLength(3);
    const rejected = settled.filter((s): s is PromiseRejectedResult => s.status === 'rejected');
    expect(rejected).toHaveLength(1);
    expect((rejected[0]!.reason as { code?: string }).code).toBe('23505');
    expect(await balanceOf(c.accountId)).toBe(100 * MICRO - 3 * PRICE);
    expect(await ledgerOf(c.accountId)).toHaveLength(3);
  });
});

describe('holds of a key or account whose hold was just refused', () => {
  const setBalance = (id: string, credits: number) => t.db.updateTable('accounts').set({ balance: credits * MICRO }).where('id', '=', id).execute();

  it('run alone until one of them passes, so that the holds arriving with them still go out as one statement', async () => {
    const ledger = new LedgerRepository(t.db, batching);
    const broke = await customer(0);
    const rich = await customer(100);
    // Together: the batch falls back and the broke account's hold is refused alone.
    expect((await Promise.all([hold(ledger, broke), hold(ledger, rich)])).map((r) => r.outcome)).toEqual(['insufficient_balance', 'ok']);
    expect(ledger.holdBatchStats()).toMatchObject({ batches: 0, fallbacks: 1, singles: 2 });
    // Its next hold runs alone; the two arriving with it still share a statement.
    expect((await Promise.all([hold(ledger, broke), hold(ledger, rich), hold(ledger, rich)])).map((r) => r.outcome)).toEqual(['insufficient_balance', 'ok', 'ok']);
    expect(ledger.holdBatchStats()).toMatchObject({ batches: 1, batched: 2, fallbacks: 1, singles: 3 });
    // Credited, its next hold (alone still) passes, and the ones after it join batches again.
    await setBalance(broke.accountId, 100);
    expect((await hold(ledger, broke)).outcome).toBe('ok');
    expect(ledger.holdBatchStats()).toMatchObject({ batches: 1, fallbacks: 1, singles: 4 });
    expect((await Promise.all([hold(ledger, broke), hold(ledger, rich)])).map((r) => r.outcome)).toEqual(['ok', 'ok']);
    expect(ledger.holdBatchStats()).toMatchObject({ batches: 2, batched: 4, fallbacks: 1, singles: 4 });
    expect(await balanceOf(broke.accountId)).toBe(100 * MICRO - 2 * PRICE);
    expect(await ledgerOf(broke.accountId)).toHaveLength(2);
  });

  it('of a key over its quota run alone, not the holds of its sibling keys', async () => {
    const ledger = new LedgerRepository(t.db, batching);
    const capped = await customer(100, 0);
    const sibling = { accountId: capped.accountId, apiKeyId: (await createApiKey(t.db, { accountId: capped.accountId, groupId })).id };
    expect((await Promise.all([hold(ledger, capped), hold(ledger, sibling)])).map((r) => r.outcome)).toEqual(['key_quota_exceeded', 'ok']);
    expect((await Promise.all([hold(ledger, capped), hold(ledger, sibling), hold(ledger, sibling)])).map((r) => r.outcome)).toEqual(['key_quota_exceeded', 'ok', 'ok']);
    expect(ledger.holdBatchStats()).toMatchObject({ batches: 1, batched: 2, fallbacks: 1, singles: 3 });
  });

  it('keep group commit for everyone else while a client without credit loops on its refused requests', async () => {
    const ledger = new LedgerRepository(t.db, batching);
    const good = await Promise.all(Array.from({ length: 12 }, () => customer(100)));
    const broke = await customer(0);
    let stop = false;
    let refused = 0;
    const loop = (async () => {
      while (!stop) if ((await hold(ledger, broke)).outcome === 'insufficient_balance') refused++;
    })();
    // 12 clients, 20 holds each, one after the other: 12 in flight at once, beside the broke client's loop.
    await Promise.all(good.map(async (c) => {
      for (let i = 0; i < 20; i++) expect((await hold(ledger, c)).outcome).toBe('ok');
    }));
    stop = true;
    await loop;
    const stats = ledger.holdBatchStats();
    expect(refused).toBeGreaterThan(1);
    // At most the first batch it joined fell back; after that its holds ran alone.
    expect(stats.fallbacks).toBeLessThanOrEqual(1);
    expect(stats.batched).toBeGreaterThan((12 * 20) / 2);
    expect(await balanceOf(broke.accountId)).toBe(0);
    expect(await ledgerOf(broke.accountId)).toHaveLength(0);
  });
});

describe('completions that capture their whole hold, arriving together', () => {
  function outputFile(accountId: string, taskId: string): FileRow {
    const id = newId('file');
    return { id, accountId, purpose: 'image_output', contentType: 'image/png', bytes: 10, storageKey: `image_output/${id}.png`, width: 2, height: 2, taskId, expiresAt: null, filename: null };
  }
  const attempt = (taskId: string): AttemptRecord => ({ taskId, step: 'generate', memberId: null, provider: 'openai', upstreamJobId: null, outcome: 'ok', error: null, startedAt: new Date(), durationMs: 12 });

  /** n tasks held on the customer (one image each unless `images`), and their whole completions. */
  async function heldTasks(c: { accountId: string; apiKeyId: string }, n: number, images = 1) {
    const ledger = new LedgerRepository(t.db, false);
    const tasks = await Promise.all(Array.from({ length: n }, () => hold(ledger, c, images)));
    return tasks.map(({ task }): WholeCompletion => {
      const files = Array.from({ length: images }, () => outputFile(c.accountId, task!.id));
      return { fence: fenceOf(task!), fileIds: files.map((f) => f.id), actualCredits: task!.quotedCredits, revisedPrompt: null, unrecorded: files, attempts: [attempt(task!.id)] };
    });
  }
  const settleAlone = (ledger: LedgerRepository, capture: number) => (which: Parameters<LedgerRepository['settlement']>[0]) => ledger.settlement(which, capture);

  it('go out as one statement: tasks completed, holds captured, ledger, spend, files and attempts written', async () => {
    const ledger = new LedgerRepository(t.db, false);
    const images = new ImageTaskRepository(t.db, batching);
    const a = await customer(100);
    const b = await customer(100);
    const completions = [...(await heldTasks(a, 3)), ...(await heldTasks(b, 2, 2))];
    const done = await Promise.all(completions.map((c) => images.completeWhole(c, settleAlone(ledger, c.actualCredits))));
    expect(done).toEqual([true, true, true, true, true]);
    expect(images.completionBatchStats()).toEqual({ batches: 1, batched: 5, singles: 0, fallbacks: 0 });
    for (const c of completions) {
      expect(await images.find(c.fence.id)).toMatchObject({ status: 'completed', delivered: c.fileIds.length, actualCredits: c.actualCredits, resultFileIds: c.fileIds, leaseOwner: null, leaseExpiresAt: null });
      expect(await ledger.findHoldByTask(c.fence.id)).toMatchObject({ status: 'captured', captured: c.actualCredits });
      const files = await t.db.selectFrom('files').select('id').where('taskId', '=', c.fence.id).execute();
      expect(files.map((f) => f.id).sort()).toEqual([...c.fileIds].sort());
      expect(await t.db.selectFrom('taskAttempts').select('outcome').where('taskId', '=', c.fence.id).execute()).toEqual([{ outcome: 'ok' }]);
    }
    expect(await spentOf(a.accountId)).toBe(3 * PRICE);
    expect(await spentOf(b.accountId)).toBe(4 * PRICE);
    expect(await balanceOf(a.accountId)).toBe(100 * MICRO - 3 * PRICE);
    expect((await ledgerOf(b.accountId)).filter((e) => e.kind === 'capture').map((e) => e.amount)).toEqual([2 * PRICE, 2 * PRICE]);
  });

  it('leave a task whose fence no longer holds as it is, and complete the others in the same statement', async () => {
    const ledger = new LedgerRepository(t.db, false);
    const images = new ImageTaskRepository(t.db, batching);
    const a = await customer(100);
    const completions = await heldTasks(a, 3);
    const stale = completions[1]!;
    await t.db.updateTable('imageTasks').set({ attempt: stale.fence.attempt + 1 }).where('id', '=', stale.fence.id).execute();
    const done = await Promise.all(completions.map((c) => images.completeWhole(c, settleAlone(ledger, c.actualCredits))));
    expect(done).toEqual([true, false, true]);
    expect(images.completionBatchStats()).toMatchObject({ batches: 1, fallbacks: 0 });
    expect(await images.find(stale.fence.id)).toMatchObject({ status: 'processing' });
    expect(await ledger.findHoldByTask(stale.fence.id)).toMatchObject({ status: 'held' });
    expect(await t.db.selectFrom('files').select('id').where('taskId', '=', stale.fence.id).execute()).toEqual([]);
    expect(await spentOf(a.accountId)).toBe(2 * PRICE);
  });

  it('answer true when the batch committed but its answer was lost (the connection dropped after COMMIT): no task is taken for lost', async () => {
    const ledger = new LedgerRepository(t.db, false);
    const images = new ImageTaskRepository(t.db, batching);
    const a = await customer(100);
    const completions = await heldTasks(a, 3);
    // The batch statement runs and commits, then its answer is lost.
    const many = (images as unknown as { completeMany: (items: readonly WholeCompletion[]) => Promise<boolean[]> }).completeMany.bind(images);
    (images as unknown as { completeMany: typeof many }).completeMany = async (items) => {
      await many(items);
      throw new Error('Connection terminated unexpectedly');
    };
    const done = await Promise.all(completions.map((c) => images.completeWhole(c, settleAlone(ledger, c.actualCredits))));
    expect(done).toEqual([true, true, true]);
    expect(images.completionBatchStats()).toMatchObject({ batches: 0, fallbacks: 1, singles: 3 });
    for (const c of completions) expect(await ledger.findHoldByTask(c.fence.id)).toMatchObject({ status: 'captured', captured: c.actualCredits });
    // Captured once each, never twice.
    expect(await spentOf(a.accountId)).toBe(3 * PRICE);
    expect((await ledgerOf(a.accountId)).filter((e) => e.kind === 'capture')).toHaveLength(3);
  });

  it('fall back to a statement each when one hold was already settled: that one fails alone, the others complete', async () => {
    const ledger = new LedgerRepository(t.db, false);
    const images = new ImageTaskRepository(t.db, batching);
    const a = await customer(100);
    const completions = await heldTasks(a, 3);
    const broken = completions[0]!;
    expect(await ledger.settleForTask(broken.fence.id, 0, t.db)).toBe(true); // released behind the task's back: a bug
    const settled = await Promise.allSettled(completions.map((c) => images.completeWhole(c, settleAlone(ledger, c.actualCredits))));
    expect(settled.map((s) => s.status)).toEqual(['rejected', 'fulfilled', 'fulfilled']);
    expect(String((settled[0] as PromiseRejectedResult).reason)).toMatch(/missing or was already settled/);
    expect(images.completionBatchStats()).toMatchObject({ batches: 0, fallbacks: 1, singles: 3 });
    expect(await images.find(broken.fence.id)).toMatchObject({ status: 'processing' });
    expect(await spentOf(a.accountId)).toBe(2 * PRICE);
    expect(await balanceOf(a.accountId)).toBe(100 * MICRO - 2 * PRICE);
  });
});
