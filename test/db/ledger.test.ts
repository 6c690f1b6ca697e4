/**
 * The credit ledger on real PostgreSQL with real parallel connections (design §5): guarded holds
 * never overdraw a balance or a key quota, settlement happens exactly once, and every counter can
 * be recomputed from the append-only ledger.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LedgerRepository, type HoldCommit, type HoldOutcome } from '../../server/repositories/ledger.repository.ts';
import { newId } from '../../server/lib/ids.ts';
import { MICRO } from '../../server/lib/money.ts';
import { createAccount, createApiKey, createGroup, imageTaskToHold } from '../support/factories.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';

let t: TestDatabase;
let ledger: LedgerRepository;

beforeAll(async () => {
  t = await createTestDatabase({ max: 24 });
  ledger = new LedgerRepository(t.db);
});
afterAll(async () => t?.destroy());

function videoRow(taskId: string, accountId: string, apiKeyId: string, groupId: string, amount: number) {
  return {
    id: taskId,
    accountId,
    apiKeyId,
    groupId,
    clientRequestId: `c-${taskId}`,
    model: 'm',
    prompt: 'p',
    durationSeconds: 1,
    aspectRatio: '16:9',
    resolution: '720p',
    generateAudio: false,
    inputMode: 'text',
    billingKind: 'snapshot',
    billingMode: 'per_item',
    unitPrice: amount,
    quotedCredits: amount,
    deadlineAt: new Date(Date.now() + 3600_000),
  };
}

async function hold(accountId: string, apiKeyId: string, groupId: string, credits: number, commit?: HoldCommit): Promise<HoldOutcome> {
  const taskId = newId('vid');
  const amount = credits * MICRO;
  const { outcome } = await ledger.holdAndInsertTask(
    { holdId: newId('hold'), accountId, apiKeyId, taskId, amount },
    { table: 'videoTasks', row: videoRow(taskId, accountId, apiKeyId, groupId, amount) },
    undefined,
    commit,
  );
  return outcome;
}

async function setup(balance: number, limits: (number | null)[]) {
  const account = await createAccount(t.db, { balance });
  const group = await createGroup(t.db);
  const keys = [];
  for (const creditLimit of limits) keys.push(await createApiKey(t.db, { accountId: account.id, groupId: group.id, creditLimit }));
  return { accountId: account.id, groupId: group.id, keys };
}

/** Recomputes every counter from the ledger and compares with the stored ones. */
async function expectLedgerConsistent(accountId: string) {
  const sums = await sql<{ kind: string; total: number }>`
    select kind, sum(amount)::bigint as total from ledger_entries where account_id = ${accountId} group by kind`.execute(t.db);
  const by = Object.fromEntries(sums.rows.map((r) => [r.kind, Number(r.total)])) as Record<string, number>;
  const s = (k: string) => by[k] ?? 0;
  const account = await t.db.selectFrom('accounts').select(['balance', 'totalEarned', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', accountId).executeTakeFirstOrThrow();
  expect(account.balance).toBe(s('grant') - s('debit') - s('hold') + s('release'));
  expect(account.totalEarned).toBe(s('grant'));
  expect(account.totalSpent).toBe(s('debit') + s('capture'));
  const keys = await t.db.selectFrom('apiKeys').select(['id', 'creditsUsed']).where('accountId', '=', accountId).execute();
  for (const key of keys) {
    const perKey = await sql<{ kind: string; total: number }>`
      select kind, sum(amount)::bigint as total from ledger_entries where api_key_id = ${key.id} group by kind`.execute(t.db);
    const k = Object.fromEntries(perKey.rows.map((r) => [r.kind, Number(r.total)])) as Record<string, number>;
    expect(key.creditsUsed).toBe((k.hold ?? 0) - (k.release ?? 0));
  }
}

describe('concurrent holds', () => {
  it('balance 100 and 400 concurrent 1-credit creates: exactly 100 accepted, balance 0, never below', async () => {
    const { accountId, groupId, keys } = await setup(100, [null]);
    const outcomes = await Promise.all(Array.from({ length: 400 }, () => hold(accountId, keys[0]!.id, groupId, 1)));
    expect(outcomes.filter((o) => o === 'ok')).toHaveLength(100);
    expect(outcomes.filter((o) => o === 'insufficient_balance')).toHaveLength(300);
    const account = await t.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow();
    expect(account.balance).toBe(0);
    const tasks = await t.db.selectFrom('videoTasks').select(sql<number>`count(*)::int`.as('n')).where('accountId', '=', accountId).executeTakeFirstOrThrow();
    expect(tasks.n).toBe(100);
    // Rejected creates left no trace on the key either.
    const key = await t.db.selectFrom('apiKeys').select('creditsUsed').where('id', '=', keys[0]!.id).executeTakeFirstOrThrow();
    expect(key.creditsUsed).toBe(100 * MICRO);
    await expectLedgerConsistent(accountId);
  });

  it('key quota 10 with 100 concurrent: exactly 10 accepted', async () => {
    const { accountId, groupId, keys } = await setup(1000, [10]);
    const outcomes = await Promise.all(Array.from({ length: 100 }, () => hold(accountId, keys[0]!.id, groupId, 1)));
    expect(outcomes.filter((o) => o === 'ok')).toHaveLength(10);
    expect(outcomes.filter((o) => o === 'key_quota_exceeded')).toHaveLength(90);
    const account = await t.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow();
    expect(account.balance).toBe(990 * MICRO);
    await expectLedgerConsistent(accountId);
  });

  it('two keys with quotas 10 + 10 on a balance of 15 with 40 concurrent: exactly 15 accepted', async () => {
    const { accountId, groupId, keys } = await setup(15, [10, 10]);
    const outcomes = await Promise.all(Array.from({ length: 40 }, (_, i) => hold(accountId, keys[i % 2]!.id, groupId, 1)));
    expect(outcomes.filter((o) => o === 'ok')).toHaveLength(15);
    const account = await t.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow();
    expect(account.balance).toBe(0);
    const used = await t.db.selectFrom('apiKeys').select('creditsUsed').where('accountId', '=', accountId).execute();
    for (const k of used) expect(k.creditsUsed).toBeLessThanOrEqual(10 * MICRO);
    expect(used.reduce((s, k) => s + k.creditsUsed, 0)).toBe(15 * MICRO);
    await expectLedgerConsistent(accountId);
  });
});

describe('settlement', () => {
  it('captures fully, partially or releases exactly once per hold, even when raced', async () => {
    const { accountId, groupId, keys } = await setup(100, [null]);
    const key = keys[0]!.id;
    const holds = [];
    for (let i = 0; i < 3; i++) {
      const taskId = newId('vid');
      const holdId = newId('hold');
      await ledger.holdAndInsertTask({ holdId, accountId, apiKeyId: key, taskId, amount: 10 * MICRO }, { table: 'videoTasks', row: videoRow(taskId, accountId, key, groupId, 10 * MICRO) });
      holds.push(holdId);
    }
    const [full, partial, release] = holds as [string, string, string];
    // Race ten settlements of each hold: exactly one wins.
    const results = await Promise.all([
      ...Array.from({ length: 10 }, () => ledger.settle(full, 10 * MICRO, t.db)),
      ...Array.from({ length: 10 }, () => ledger.settle(partial, 4 * MICRO, t.db)),
      ...Array.from({ length: 10 }, () => ledger.settle(release, 0, t.db)),
    ]);
    expect(results.filter(Boolean)).toHaveLength(3);
    const account = await t.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', accountId).executeTakeFirstOrThrow();
    // 100 - 10 (full) - 4 (partial) - 0 (released) = 86
    expect(account).toEqual({ balance: 86 * MICRO, totalSpent: 14 * MICRO });
    const rows = await t.db.selectFrom('creditHolds').select(['id', 'status', 'captured']).where('accountId', '=', accountId).execute();
    expect(Object.fromEntries(rows.map((r) => [r.id, [r.status, r.captured]]))).toEqual({
      [full]: ['captured', 10 * MICRO],
      [partial]: ['captured', 4 * MICRO],
      [release]: ['released', 0],
    });
    expect(await ledger.settle(full, 0, t.db)).toBe(false);
    await expectLedgerConsistent(accountId);
  });

  it("a whole capture leaves the key's and the account's rows alone: it settles while another transaction holds them, and its credits count in total_spent", async () => {
    const { accountId, groupId, keys } = await setup(100, [50]);
    const key = keys[0]!.id;
    const holdOf = async (credits: number) => {
      const taskId = newId('vid');
      const holdId = newId('hold');
      await ledger.holdAndInsertTask({ holdId, accountId, apiKeyId: key, taskId, amount: credits * MICRO }, { table: 'videoTasks', row: videoRow(taskId, accountId, key, groupId, credits * MICRO) });
      return holdId;
    };
    const whole = [await holdOf(3), await holdOf(3), await holdOf(3)];
    const partial = await holdOf(5);
    let release!: () => void;
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => (locked = r));
    // The locks a hold's or a settlement's updates take on these rows (they change no key column).
    const lock = t.db.transaction().execute(async (trx) => {
      await sql`select 1 from api_keys where id = ${key} for no key update`.execute(trx);
      await sql`select 1 from accounts where id = ${accountId} for no key update`.execute(trx);
      locked();
      await new Promise<void>((r) => (release = r));
    });
    await isLocked;
    let partialDone = false;
    const partialSettled = ledger.settle(partial, 2 * MICRO, t.db).then((ok) => ((partialDone = true), ok));
    try {
      // Concurrent whole captures of one account and key: none waits for the locked rows.
      expect(await Promise.all(whole.map((h) => ledger.settle(h, 3 * MICRO, t.db)))).toEqual([true, true, true]);
      // A partial capture gives credits back to the key and the account: it waits for their rows.
      const waitsForRows = async () => {
        const { rows } = await sql`select 1 from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock' and (query ilike '%api_keys%' or query ilike '%accounts%') and pid <> pg_backend_pid()`.execute(t.db);
        return rows.length > 0 || partialDone;
      };
      for (let i = 0; i < 1000 && !(await waitsForRows()); i++) await new Promise((r) => setTimeout(r, 10));
      expect(partialDone).toBe(false);
      expect(await waitsForRows()).toBe(true);
    } finally {
      release();
      await lock;
    }
    expect(await partialSettled).toBe(true);
    const account = await t.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', accountId).executeTakeFirstOrThrow();
    expect(account).toEqual({ balance: (100 - 9 - 2) * MICRO, totalSpent: 11 * MICRO });
    const apiKey = await t.db.selectFrom('apiKeys').select('creditsUsed').where('id', '=', key).executeTakeFirstOrThrow();
    expect(apiKey.creditsUsed).toBe(11 * MICRO);
    // Of the 11 credits spent, the shards hold them all (the row's own column has only debits).
    const shards = await t.db.selectFrom('accountSpend').select(({ fn }) => fn.sum<string>('spent').as('spent')).where('accountId', '=', accountId).executeTakeFirstOrThrow();
    expect(Number(shards.spent)).toBe(11 * MICRO);
    await expectLedgerConsistent(accountId);
  });

  it('a hold cannot be settled for more than it holds', async () => {
    const { accountId, groupId, keys } = await setup(10, [null]);
    const taskId = newId('vid');
    const holdId = newId('hold');
    await ledger.holdAndInsertTask({ holdId, accountId, apiKeyId: keys[0]!.id, taskId, amount: MICRO }, { table: 'videoTasks', row: videoRow(taskId, accountId, keys[0]!.id, groupId, MICRO) });
    expect(await ledger.settle(holdId, 2 * MICRO, t.db)).toBe(false);
    expect(await ledger.settle(holdId, MICRO, t.db)).toBe(true);
    await expectLedgerConsistent(accountId);
  });
});

describe("a synchronous image's lease (TaskInsert.leaseMs)", () => {
  it("is set from the database's clock, alone and in a batch: a process clock behind it never leaves the row free to claim", async () => {
    const batched = new LedgerRepository(t.db);
    const before = batched.holdBatchStats().batched;
    const tasks = await Promise.all(Array.from({ length: 6 }, () => imageTaskToHold(t.db)));
    // This process's clock ten minutes behind the database's: the lease must not be computed from it.
    const realNow = Date.now;
    Date.now = () => realNow() - 600_000;
    let results;
    try {
      results = await Promise.all(
        tasks.map(({ hold, row: { leaseExpiresAt: _set, ...row } }) => batched.holdAndInsertTask(hold, { table: 'imageTasks', row, leaseMs: 30_000 }, undefined, 'unflushed')),
      );
    } finally {
      Date.now = realNow;
    }
    expect(results.map((r) => r.outcome)).toEqual(Array(6).fill('ok'));
    expect(batched.holdBatchStats().batched).toBeGreaterThan(before);
    const { rows } = await sql<{ leftMs: number }>`
      select extract(epoch from (lease_expires_at - now())) * 1000 as left_ms from image_tasks where id = any(${tasks.map((x) => x.taskId)}::text[])`.execute(t.db);
    expect(rows).toHaveLength(6);
    for (const { leftMs } of rows) expect(Number(leftMs)).toBeGreaterThan(25_000);
    for (const { leftMs } of rows) expect(Number(leftMs)).toBeLessThanOrEqual(30_000);
  });
});

describe('a batched hold whose batch committed while its answer was lost', () => {
  it('is rerun alone, meets its own rows, and goes on with its task: placed and charged once', async () => {
    const batched = new LedgerRepository(t.db);
    const { hold, row, accountId } = await imageTaskToHold(t.db, { unitPrice: 3 * MICRO });
    // The batch's statement (here the first run) placed the hold; its rerun is the batcher's fallback.
    const first = await batched.holdAndInsertTask(hold, { table: 'imageTasks', row }, undefined, 'unflushed');
    const rerun = await batched.holdAndInsertTask(hold, { table: 'imageTasks', row }, undefined, 'unflushed');
    expect(first.outcome).toBe('ok');
    expect(rerun).toEqual(first);
    const account = await t.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow();
    expect(account.balance).toBe(97 * MICRO);
    expect(await t.db.selectFrom('creditHolds').select('id').where('taskId', '=', hold.taskId).execute()).toHaveLength(1);
    await expectLedgerConsistent(accountId);
  });

  it("still refuses a unique violation that is not its own placed hold (another account's task id)", async () => {
    const batched = new LedgerRepository(t.db);
    const mine = await imageTaskToHold(t.db);
    expect((await batched.holdAndInsertTask(mine.hold, { table: 'imageTasks', row: mine.row }, undefined, 'unflushed')).outcome).toBe('ok');
    const other = await imageTaskToHold(t.db);
    // Another account's request under the same task id: its own hold id, nothing of it placed.
    const clash = batched.holdAndInsertTask({ ...other.hold, taskId: mine.taskId }, { table: 'imageTasks', row: { ...other.row, id: mine.taskId } }, undefined, 'unflushed');
    await expect(clash).rejects.toMatchObject({ code: '23505' });
    const account = await t.db.selectFrom('accounts').select('balance').where('id', '=', other.accountId).executeTakeFirstOrThrow();
    expect(account.balance).toBe(100 * MICRO);
  });
});

describe('how a hold commits (HoldCommit)', () => {
  const syncCommitIn = async (commit: HoldCommit | undefined, amount: number) =>
    t.db.transaction().execute(async (trx) => {
      const { row, hold } = await imageTaskToHold(trx, { unitPrice: amount });
      const held = await new LedgerRepository(trx).holdAndInsertTask(hold, { table: 'imageTasks', row }, undefined, commit);
      expect(held.outcome).toBe('ok');
      // What the commit of this transaction will read.
      return (await sql<{ s: string }>`select current_setting('synchronous_commit') as s`.execute(trx)).rows[0]!.s;
    });

  it('an unflushed hold turns synchronous_commit off for its own transaction only; a flushed one (the default) leaves it on', async () => {
    const session = (await sql<{ s: string }>`select current_setting('synchronous_commit') as s`.execute(t.db)).rows[0]!.s;
    expect(session).not.toBe('off');
    expect(await syncCommitIn('unflushed', MICRO)).toBe('off');
    expect(await syncCommitIn('unflushed', 0)).toBe('off'); // the free variant too
    expect(await syncCommitIn(undefined, MICRO)).toBe(session);
    expect(await syncCommitIn('flushed', 0)).toBe(session);
    // set_config(…, true) ended with its transaction: every pooled connection is back to the server's setting.
    const after = await Promise.all(Array.from({ length: 8 }, () => sql<{ s: string }>`select current_setting('synchronous_commit') as s`.execute(t.db)));
    expect(after.map((r) => r.rows[0]!.s)).toEqual(Array(8).fill(session));
  });

  it('an unflushed hold guards the balance like a flushed one: 100 concurrent holds on 30 credits, exactly 30 accepted', async () => {
    const { accountId, groupId, keys } = await setup(30, [null]);
    const outcomes = await Promise.all(Array.from({ length: 100 }, () => hold(accountId, keys[0]!.id, groupId, 1, 'unflushed')));
    expect(outcomes.filter((o) => o === 'ok')).toHaveLength(30);
    expect(outcomes.filter((o) => o === 'insufficient_balance')).toHaveLength(70);
    await expectLedgerConsistent(accountId);
  });
});
