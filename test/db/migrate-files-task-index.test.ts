import { CamelCasePlugin, type CompiledQuery, Kysely, Migrator, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { DB } from '../../generated/db.d.ts';
import { createDatabase } from '../../server/db/database.ts';
import { migrateToLatest } from '../../server/db/migrate.ts';
import { migrations } from '../../server/db/migrations/index.ts';
import { createScratchDatabase, dropScratchDatabase, scratchDatabaseName, withDatabaseName } from '../../server/db/scratch-database.ts';
import { ImageTaskRepository } from '../../server/repositories/image-task.repository.ts';
import { LedgerRepository } from '../../server/repositories/ledger.repository.ts';
import { VideoTaskRepository } from '../../server/repositories/video-task.repository.ts';
import { newId } from '../../server/lib/ids.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

// The statements that look up a task's files by files.task_id (a video's finalize, an interrupted
// image stream) are served by files_task_idx, not a scan of every file of the retention period.
// Plans are read with sequential scans disabled, so a few rows say what a large table would get.

let t: TestDatabase;
let pool: pg.Pool;
let recording: Kysely<DB>;
const statements: CompiledQuery[] = [];

beforeAll(async () => {
  t = await createTestDatabase();
  // The repositories' own statements, as sent: a Kysely that records what it runs.
  pool = new pg.Pool({ connectionString: t.url, max: 2 });
  recording = new Kysely<DB>({
    dialect: new PostgresDialect({ pool }),
    plugins: [new CamelCasePlugin()],
    log: (event) => {
      if (event.level === 'query') statements.push(event.query);
    },
  });
  const accountId = newId('acct');
  await sql`insert into accounts (id, name) values (${accountId}, ${`files ${accountId}`})`.execute(t.db);
  // Some files with a task and some without (uploads), so the plan is not about an empty table.
  await sql`insert into files (id, account_id, purpose, content_type, bytes, storage_key, task_id, expires_at)
    select 'file_t' || g, ${accountId}, case when g % 3 = 0 then 'upload' else 'image_output' end, 'image/png', 1, 'k/t' || g,
           case when g % 3 = 0 then null else 'img_' || g end, now() + interval '1 day'
      from generate_series(1, 300) g`.execute(t.db);
  await sql`analyze files`.execute(t.db);
});
afterAll(async () => {
  await recording?.destroy();
  await t?.destroy();
});

/** Runs `call` and returns the one statement it sent that reads files. */
async function statementOf(call: () => Promise<unknown>): Promise<CompiledQuery> {
  statements.length = 0;
  await call();
  const found = statements.filter((q) => /\bfiles f\b/.test(q.sql));
  expect(found).toHaveLength(1);
  return found[0]!;
}

/** The names of the indexes in the plan of `query` (its parameters bound), with sequential scans off. */
async function indexesInPlan(query: CompiledQuery): Promise<string[]> {
  return t.db.transaction().execute(async (trx) => {
    await sql`set local enable_seqscan = off`.execute(trx);
    const { rows } = await trx.executeQuery<{ 'QUERY PLAN': unknown }>({ ...query, sql: `explain (format json) ${query.sql}` } as CompiledQuery<{ 'QUERY PLAN': unknown }>);
    const names: string[] = [];
    const walk = (node: unknown): void => {
      if (Array.isArray(node)) node.forEach(walk);
      else if (typeof node === 'object' && node !== null) {
        for (const [key, value] of Object.entries(node)) {
          if (key === 'Index Name' && typeof value === 'string') names.push(value);
          else walk(value);
        }
      }
    };
    walk(rows[0]!['QUERY PLAN']);
    return names;
  });
}

describe('files_task_idx', () => {
  it("serves VideoTaskRepository.deleteUnpublishedOutputs (a video's finalize)", async () => {
    const query = await statementOf(() => new VideoTaskRepository(recording).deleteUnpublishedOutputs({ id: newId('vid'), attempt: 1 }));
    expect(query.sql).toMatch(/delete from files f using t where f\.task_id = t\.id/);
    expect(await indexesInPlan(query)).toContain('files_task_idx');
  });

  it('serves ImageTaskRepository.interruptedStream (the files an interrupted stream recorded)', async () => {
    const ledger = new LedgerRepository(recording, false);
    const query = await statementOf(() => new ImageTaskRepository(recording, false).interruptedStream({ id: newId('img'), attempt: 1 }, { kept: 'stopped', released: 'stopped' }, (hold) => ledger.settlement(hold, 0)));
    expect(query.sql).toMatch(/from files f where f\.task_id = /);
    expect(await indexesInPlan(query)).toContain('files_task_idx');
  });

  it('holds only the files that have a task', async () => {
    const { rows } = await sql<{ def: string; valid: boolean }>`
      select pg_get_indexdef(i.indexrelid) as def, i.indisvalid as valid from pg_index i where i.indexrelid = 'files_task_idx'::regclass`.execute(t.db);
    expect(rows).toEqual([{ def: 'CREATE INDEX files_task_idx ON public.files USING btree (task_id) WHERE (task_id IS NOT NULL)', valid: true }]);
  });
});

describe('the files_task_idx migration', () => {
  it('runs outside a transaction and replaces an invalid index an interrupted build left', async () => {
    const adminUrl = inject('pgAdminUrl');
    const name = scratchDatabaseName(inject('pgTemplate'));
    await createScratchDatabase(adminUrl, name);
    const db = createDatabase(withDatabaseName(adminUrl, name), { max: 1 });
    try {
      const names = Object.keys(migrations);
      const build = names.indexOf('20261227100000-files-task-index');
      const { error } = await new Migrator({ db, provider: { getMigrations: async () => migrations } }).migrateTo(names[build - 1]!);
      if (error !== undefined) throw error;
      // A failed concurrent build leaves its index behind, invalid (here: a unique one over duplicates).
      const accountId = newId('acct');
      await sql`insert into accounts (id, name) values (${accountId}, ${`files ${accountId}`})`.execute(db);
      await sql`insert into files (id, account_id, purpose, content_type, bytes, storage_key, task_id)
        values ('file_a', ${accountId}, 'input', 'image/png', 1, 'k/a', 'vid_1'), ('file_b', ${accountId}, 'input', 'image/png', 1, 'k/b', 'vid_1')`.execute(db);
      await expect(sql`create unique index concurrently files_task_idx on files (task_id)`.execute(db)).rejects.toMatchObject({ code: '23505' });
      expect((await sql`select indisvalid as valid from pg_index where indexrelid = 'files_task_idx'::regclass`.execute(db)).rows).toEqual([{ valid: false }]);

      expect((await migrateToLatest(db)).map((r) => [r.migrationName, r.status])).toEqual(names.slice(build).map((n) => [n, 'Success']));
      const { rows } = await sql<{ def: string; valid: boolean }>`
        select pg_get_indexdef(i.indexrelid) as def, i.indisvalid as valid from pg_index i where i.indexrelid = 'files_task_idx'::regclass`.execute(db);
      expect(rows).toEqual([{ def: 'CREATE INDEX files_task_idx ON public.files USING btree (task_id) WHERE (task_id IS NOT NULL)', valid: true }]);
    } finally {
      await db.destroy();
      await dropScratchDatabase(adminUrl, name);
    }
  });
});
