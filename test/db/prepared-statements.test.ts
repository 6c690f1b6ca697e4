/**
 * Hot-path statements as named prepared statements (server/db/prepared.ts): each connection parses
 * a marked statement once, variants get their own names, rows come back camelCased as through the
 * CamelCasePlugin, and a column added by a later migration (a rolling deploy) does not break the
 * statements older instances prepared.
 */
import { CamelCasePlugin, sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DB } from '../../generated/db.d.ts';
import { dbColumns } from '../../generated/db-columns.ts';
import { createDatabase } from '../../server/db/database.ts';
import { runPrepared } from '../../server/db/prepared.ts';
import { LedgerRepository } from '../../server/repositories/ledger.repository.ts';
import { ImageTaskRepository } from '../../server/repositories/image-task.repository.ts';
import { imageTaskToHold } from '../support/factories.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase;
/** One connection, so that what it prepared can be read back from pg_prepared_statements. */
let one: Kysely<DB>;

beforeAll(async () => {
  t = await createTestDatabase({ max: 2 });
  one = createDatabase(t.url, { max: 1 });
});
afterAll(async () => {
  await one?.destroy();
  await t?.destroy();
});

const preparedNames = async (db: Kysely<DB>) =>
  (await sql<{ name: string }>`select name from pg_prepared_statements where name like 'mg\\_%' order by name`.execute(db)).rows.map((r) => r.name);

describe('prepared statements', () => {
  it('the hold and the settlement are parsed once per connection, under one name per variant', async () => {
    const ledger = new LedgerRepository(one);
    const tasks = new ImageTaskRepository(one);
    const before = await preparedNames(one);
    for (let i = 0; i < 3; i++) {
      const { accountId, taskId, row, hold } = await imageTaskToHold(one, { unitPrice: 1000 });
      const held = await ledger.holdAndInsertTask(hold, { table: 'imageTasks', row });
      expect(held.outcome).toBe('ok');
      // Rows come back as the rest of the code reads them.
      expect(held.task).toMatchObject({ id: taskId, accountId, quotedCredits: 1000, inputFileIds: [], status: 'processing' });
      const done = await tasks.complete({ id: taskId, attempt: 1 }, { fileIds: [], actualCredits: 1000, revisedPrompt: null, unrecorded: [] }, (h) => ledger.settlement(h, 1000));
      expect(done).toBe(true);
      expect(await one.selectFrom('imageTasks').select(['id', 'status', 'actualCredits', 'leaseOwner']).where('id', '=', taskId).executeTakeFirstOrThrow()).toEqual({ id: taskId, status: 'completed', actualCredits: 1000, leaseOwner: null });
    }
    const added = (await preparedNames(one)).filter((n) => !before.includes(n));
    // Three requests, two statements: two names, each prepared once on this connection.
    expect(added).toHaveLength(2);

    // A free task is another variant of the insert (no hold): a third name.
    const free = await imageTaskToHold(one, { unitPrice: 0 });
    await ledger.holdAndInsertTask(free.hold, { table: 'imageTasks', row: free.row });
    expect((await preparedNames(one)).filter((n) => !before.includes(n))).toHaveLength(3);
  });

  it('with preparedStatements: false the same statements run unnamed', async () => {
    const plain = createDatabase(t.url, { max: 1, preparedStatements: false });
    try {
      const ledger = new LedgerRepository(plain);
      const { row, hold } = await imageTaskToHold(plain);
      expect((await ledger.holdAndInsertTask(hold, { table: 'imageTasks', row })).outcome).toBe('ok');
      expect(await preparedNames(plain)).toEqual([]);
    } finally {
      await plain.destroy();
    }
  });

  it('maps every column name as the CamelCasePlugin does', async () => {
    const plugin = new (class extends CamelCasePlugin {
      camel(name: string) {
        return this.camelCase(name);
      }
    })();
    const all = [...new Set(Object.values(dbColumns).flat())];
    const rows = await runPrepared<Record<string, number>>(sql`select ${sql.join(all.map((c, i) => sql`${sql.lit(i)}::int as ${sql.id(c)}`))}`, one);
    expect(rows[0]).toEqual(Object.fromEntries(all.map((c, i) => [plugin.camel(c), i])));
  });

  it('survives columns added while the statements are prepared (a rolling deploy); `returning *` would not', async () => {
    const scratch = await createTestDatabase({ max: 1 });
    const db = createDatabase(scratch.url, { max: 1 });
    try {
      const ledger = new LedgerRepository(db);
      const tasks = new ImageTaskRepository(db);
      const cycle = async () => {
        const { taskId, row, hold } = await imageTaskToHold(db, { unitPrice: 1000 });
        expect((await ledger.holdAndInsertTask(hold, { table: 'imageTasks', row })).task?.id).toBe(taskId);
        expect(await tasks.complete({ id: taskId, attempt: 1 }, { fileIds: [], actualCredits: 1000, revisedPrompt: null, unrecorded: [] }, (h) => ledger.settlement(h, 1000))).toBe(true);
        expect((await db.selectFrom('imageTasks').select('status').where('id', '=', taskId).executeTakeFirstOrThrow()).status).toBe('completed');
      };
      await cycle();
      // The failure mode this guards against, shown on a statement of its own.
      const star = () => runPrepared(sql`update image_tasks set prompt = prompt where id = ${'none'} returning *`, db);
      await star();
      for (const table of ['image_tasks', 'credit_holds', 'ledger_entries', 'accounts', 'api_keys']) await sql`alter table ${sql.table(table)} add column deploy_probe text`.execute(db);
      await cycle();
      await expect(star()).rejects.toThrow(/cached plan must not change result type/);
    } finally {
      await db.destroy();
      await scratch.destroy();
    }
  });
});
