/**
 * Every foreign key whose referenced table has rows deleted is backed by an index on its columns:
 * without one, each statement that deletes referenced rows checks the key by reading the whole
 * referencing table (video_tasks.output_file_id had none: one media sweeper batch of 100 expired
 * files took 36 s at 300,000 video tasks). The foreign keys left without an index all reference
 * tables nothing deletes from; a new one must be indexed or join that list with its reason.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

/** Unindexed foreign keys, and why none needs an index: the table they reference is never deleted from. */
const NEVER_DELETED_REFERENCES = [
  'credit_holds(account_id,api_key_id) -> api_keys', // keys are deactivated, never deleted
  'file_tombstones(account_id) -> accounts', // accounts are suspended, never deleted
  'image_tasks(group_id) -> backend_groups', // groups are never deleted
  'ledger_entries(account_id,api_key_id) -> api_keys',
  'ledger_entries(account_id,api_key_id,hold_id) -> credit_holds', // holds are settled, never deleted
  'video_tasks(group_id) -> backend_groups',
];

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(() => t?.destroy());

it('backs every foreign key with an index, except those referencing tables nothing deletes from', async () => {
  const { rows } = await sql<{ fk: string }>`
    select c.conrelid::regclass || '(' || array_to_string(array(select a.attname from pg_attribute a where a.attrelid = c.conrelid and a.attnum = any(c.conkey) order by a.attnum), ',')
      || ') -> ' || c.confrelid::regclass as fk
    from pg_constraint c
    where c.contype = 'f' and not exists (
      -- an index whose leading columns are the key's (in any order; a partial index serves the key's equality check)
      select 1 from pg_index i where i.indrelid = c.conrelid and i.indisvalid
        and (select array_agg(k order by k) from unnest((i.indkey::int2[])[0:cardinality(c.conkey) - 1]) k)
          = (select array_agg(k order by k) from unnest(c.conkey) k))
    order by 1`.execute(t.db);
  expect(rows.map((r) => r.fk)).toEqual(NEVER_DELETED_REFERENCES);
  // The guard itself: the key of video outputs, whose referenced files are deleted every minute, is indexed.
  const { rows: indexed } = await sql<{ indexdef: string }>`select indexdef from pg_indexes where indexname = 'video_tasks_output_file_idx'`.execute(t.db);
  expect(indexed).toHaveLength(1);
});
