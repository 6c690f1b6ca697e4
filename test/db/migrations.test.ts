import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { createDatabase } from '../../server/db/database.ts';
import { migrateToLatest } from '../../server/db/migrate.ts';
import { migrations } from '../../server/db/migrations/index.ts';
import { createScratchDatabase, dropScratchDatabase, scratchDatabaseName, withDatabaseName } from '../../server/db/scratch-database.ts';
import { generateApiKey } from '../../server/lib/api-key-material.ts';
import { newId } from '../../server/lib/ids.ts';
import { imageTaskToHold } from '../support/factories.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(() => t?.destroy());

// Small factories: defaults plus overrides, each row independent of the others.
async function insertAccount(overrides: { balance?: number } = {}) {
  const id = newId('acct');
  await t.db.insertInto('accounts').values({ id, name: `account ${id}`, balance: overrides.balance ?? 0 }).execute();
  return id;
}

async function insertGroup() {
  const id = newId('grp');
  await t.db.insertInto('backendGroups').values({ id, name: `group ${id}` }).execute();
  return id;
}

async function insertKey(accountId: string, overrides: { keyHash?: Buffer } = {}) {
  const material = generateApiKey();
  const id = newId('key');
  await t.db
    .insertInto('apiKeys')
    .values({
      id,
      accountId,
      groupId: await insertGroup(),
      name: 'test key',
      keyHash: overrides.keyHash ?? material.hash,
      keyPrefix: material.prefix,
      lastFour: material.lastFour,
    })
    .execute();
  return { id, hash: material.hash };
}

async function insertHold(accountId: string, apiKeyId: string, amount = 1_000_000) {
  const id = newId('hold');
  await t.db.insertInto('creditHolds').values({ id, accountId, apiKeyId, taskId: newId('vid'), amount }).execute();
  await t.db.insertInto('ledgerEntries').values({ accountId, apiKeyId, holdId: id, kind: 'hold', amount }).execute();
  return id;
}

describe('schema constraints', () => {
  it('rejects a negative balance with SQLSTATE 23514', async () => {
    const accountId = await insertAccount({ balance: 5 });
    await expect(
      t.db.updateTable('accounts').set({ balance: sql<number>`balance - 6` }).where('id', '=', accountId).execute(),
    ).rejects.toMatchObject({ code: '23514', constraint: 'accounts_balance_nonnegative' });
    const row = await t.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow();
    expect(row.balance).toBe(5);
  });

  it('returns bigint columns as numbers', async () => {
    const accountId = await insertAccount({ balance: 12_345_678_901_234 });
    const row = await t.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', accountId).executeTakeFirstOrThrow();
    expect(row).toEqual({ balance: 12_345_678_901_234, totalSpent: 0 });
    const { rows } = await sql<{ n: number; s: number }>`select count(*) as n, sum(balance) as s from accounts where id = ${accountId}`.execute(t.db);
    expect(rows[0]).toEqual({ n: 1, s: 12_345_678_901_234 });
  });

  it('throws instead of losing precision on int8 above Number.MAX_SAFE_INTEGER', async () => {
    await expect(sql`select 9007199254740993::bigint as n`.execute(t.db)).rejects.toThrow(/MAX_SAFE_INTEGER/);
  });

  it('rejects a duplicate key hash with SQLSTATE 23505', async () => {
    const accountId = await insertAccount();
    const { hash } = await insertKey(accountId);
    await expect(insertKey(accountId, { keyHash: hash })).rejects.toMatchObject({
      code: '23505',
      constraint: 'api_keys_key_hash_key',
    });
  });

  it('rejects a key hash that is not 32 bytes', async () => {
    const accountId = await insertAccount();
    await expect(insertKey(accountId, { keyHash: Buffer.alloc(16) })).rejects.toMatchObject({
      code: '23514',
      constraint: 'api_keys_key_hash_length',
    });
  });

  it("rejects a hold on another account's key (23503)", async () => {
    const owner = await insertAccount({ balance: 10 });
    const other = await insertAccount({ balance: 10 });
    const key = await insertKey(owner);
    await expect(
      t.db.insertInto('creditHolds').values({ id: newId('hold'), accountId: other, apiKeyId: key.id, taskId: newId('vid'), amount: 1 }).execute(),
    ).rejects.toMatchObject({ code: '23503', constraint: 'credit_holds_api_key_fk' });
  });

  it('a hold or a task on an account that does not exist is still rejected: by the composite key foreign key alone', async () => {
    const owner = await insertAccount({ balance: 10 });
    const key = await insertKey(owner);
    const ghost = newId('acct');
    await expect(
      t.db.insertInto('creditHolds').values({ id: newId('hold'), accountId: ghost, apiKeyId: key.id, taskId: newId('vid'), amount: 1 }).execute(),
    ).rejects.toMatchObject({ code: '23503', constraint: 'credit_holds_api_key_fk' });
    const { row } = await imageTaskToHold(t.db);
    await expect(t.db.insertInto('imageTasks').values({ ...row, accountId: ghost }).execute()).rejects.toMatchObject({ code: '23503', constraint: 'image_tasks_api_key_fk' });
    // The checks these tables no longer repeat.
    const fks = await sql<{ conname: string }>`
      select conname from pg_constraint where contype = 'f' and conrelid in ('credit_holds'::regclass, 'image_tasks'::regclass, 'video_tasks'::regclass) order by conname`.execute(t.db);
    expect(fks.rows.map((r) => r.conname).filter((n) => n.includes('account'))).toEqual([]);
  });

  it('seeds the three capability switches, enabled', async () => {
    const rows = await t.db.selectFrom('capabilitySwitches').select(['name', 'enabled']).orderBy('name').execute();
    expect(rows).toEqual([
      { name: 'image_edit', enabled: true },
      { name: 'image_generation', enabled: true },
      { name: 'video_generation', enabled: true },
    ]);
  });
});

describe('credit holds and ledger', () => {
  it('rejects UPDATE and DELETE of ledger entries', async () => {
    const accountId = await insertAccount();
    const entry = await t.db
      .insertInto('ledgerEntries')
      .values({ accountId, kind: 'grant', amount: 10_000_000, reason: 'test' })
      .returning('id')
      .executeTakeFirstOrThrow();
    expect(typeof entry.id).toBe('number');
    await expect(t.db.updateTable('ledgerEntries').set({ amount: 1 }).where('id', '=', entry.id).execute()).rejects.toThrow(
      /append-only: UPDATE/,
    );
    await expect(t.db.deleteFrom('ledgerEntries').where('id', '=', entry.id).execute()).rejects.toThrow(/append-only: DELETE/);
    await expect(sql`truncate ledger_entries`.execute(t.db)).rejects.toThrow(/append-only: TRUNCATE/);
    const row = await t.db.selectFrom('ledgerEntries').select('amount').where('id', '=', entry.id).executeTakeFirstOrThrow();
    expect(row.amount).toBe(10_000_000);
  });

  it('rejects a second release entry for the same hold (23505)', async () => {
    const accountId = await insertAccount();
    const key = await insertKey(accountId);
    const holdId = await insertHold(accountId, key.id);
    const release = { accountId, apiKeyId: key.id, holdId, kind: 'release', amount: 1_000_000 };
    await t.db.insertInto('ledgerEntries').values(release).execute();
    await expect(t.db.insertInto('ledgerEntries').values(release).execute()).rejects.toMatchObject({
      code: '23505',
      constraint: 'ledger_entries_hold_kind_key',
    });
  });

  it('allows a partial capture as one capture and one release entry', async () => {
    const accountId = await insertAccount();
    const key = await insertKey(accountId);
    const holdId = await insertHold(accountId, key.id, 1_000_000);
    await t.db
      .insertInto('ledgerEntries')
      .values([
        { accountId, apiKeyId: key.id, holdId, kind: 'capture', amount: 600_000 },
        { accountId, apiKeyId: key.id, holdId, kind: 'release', amount: 400_000 },
      ])
      .execute();
    await t.db
      .updateTable('creditHolds')
      .set({ status: 'captured', captured: 600_000, settledAt: sql`now()` })
      .where('id', '=', holdId)
      .where('status', '=', 'held')
      .execute();
    const count = await t.db.selectFrom('ledgerEntries').select((eb) => eb.fn.countAll<number>().as('n')).where('holdId', '=', holdId).executeTakeFirstOrThrow();
    expect(count.n).toBe(3);
  });

  it('rejects capturing more than the held amount (23514)', async () => {
    const accountId = await insertAccount();
    const key = await insertKey(accountId);
    const holdId = await insertHold(accountId, key.id, 1_000);
    await expect(
      t.db.updateTable('creditHolds').set({ status: 'captured', captured: 1_001, settledAt: sql`now()` }).where('id', '=', holdId).execute(),
    ).rejects.toMatchObject({ code: '23514', constraint: 'credit_holds_captured_range' });
  });

  it('rejects a settled hold without settled_at, and any change after settlement', async () => {
    const accountId = await insertAccount();
    const key = await insertKey(accountId);
    const holdId = await insertHold(accountId, key.id, 1_000);
    await expect(t.db.updateTable('creditHolds').set({ status: 'released' }).where('id', '=', holdId).execute()).rejects.toMatchObject({
      code: '23514',
      constraint: 'credit_holds_settled_at_check',
    });
    await t.db.updateTable('creditHolds').set({ status: 'released', settledAt: sql`now()` }).where('id', '=', holdId).execute();
    await expect(
      t.db.updateTable('creditHolds').set({ status: 'captured', captured: 1_000 }).where('id', '=', holdId).execute(),
    ).rejects.toThrow(/already released/);
  });

  it('rejects a second hold for the same task (23505)', async () => {
    const accountId = await insertAccount();
    const key = await insertKey(accountId);
    const taskId = newId('vid');
    const hold = () => t.db.insertInto('creditHolds').values({ id: newId('hold'), accountId, apiKeyId: key.id, taskId, amount: 5 }).execute();
    await hold();
    await expect(hold()).rejects.toMatchObject({ code: '23505', constraint: 'credit_holds_task_id_key' });
  });
});

describe('migrateToLatest', () => {
  it('is a no-op on a migrated database', async () => {
    await expect(migrateToLatest(t.db)).resolves.toEqual([]);
  });

  it('migrates once when several instances boot at the same time', async () => {
    const adminUrl = inject('pgAdminUrl');
    const name = scratchDatabaseName(inject('pgTemplate'));
    await createScratchDatabase(adminUrl, name);
    const instances = [1, 2, 3].map(() => createDatabase(withDatabaseName(adminUrl, name), { max: 2 }));
    try {
      const results = await Promise.all(instances.map((db) => migrateToLatest(db)));
      const applied = results.flat().filter((r) => r.status === 'Success').map((r) => r.migrationName);
      expect(applied.sort()).toEqual(Object.keys(migrations).sort());
    } finally {
      await Promise.all(instances.map((db) => db.destroy()));
      await dropScratchDatabase(adminUrl, name);
    }
  });
});
