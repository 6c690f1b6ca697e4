import { type Kysely, Migrator, sql } from 'kysely';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { createDatabase, type DbLogger } from '../../server/db/database.ts';
import { MIGRATION_LOCK_ID, migrateToLatest } from '../../server/db/migrate.ts';
import { migrations } from '../../server/db/migrations/index.ts';
import { createScratchDatabase, dropScratchDatabase, scratchDatabaseName, withDatabaseName } from '../../server/db/scratch-database.ts';
import { newId } from '../../server/lib/ids.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

// An upgrade runs its migrations while instances of the previous version keep serving: a migration
// that meets a lock of theirs waits a bounded time, is rolled back and tried again, and the ones
// before it stay committed (server/db/migrate.ts).

const names = Object.keys(migrations);
// The last migration an older version applied, and the next one: media-retention alters accounts,
// which every API key lookup reads. The one between them touches member_health only.
const OLDER_VERSION = '20261201200000-account-listings';
const TOUCHES_NOTHING_HELD = '20261202100000-member-account-disabled';
const ALTERS_ACCOUNTS = '20261203100000-media-retention';

const fast = { lockTimeoutMs: 200, retryDelayMs: 20 };

let template: TestDatabase;
beforeAll(async () => {
  template = await createTestDatabase();
});
afterAll(() => template?.destroy());

const cleanup: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const fn of cleanup.splice(0).reverse()) await fn();
});

/** An empty scratch database migrated as far as an older version got (Kysely's own migrator, as it ran then). */
async function databaseAt(last: string): Promise<{ db: Kysely<any>; url: string }> {
  const adminUrl = inject('pgAdminUrl');
  const name = scratchDatabaseName(inject('pgTemplate'));
  await createScratchDatabase(adminUrl, name);
  cleanup.push(() => dropScratchDatabase(adminUrl, name));
  const url = withDatabaseName(adminUrl, name);
  const db = createDatabase(url, { max: 2 });
  cleanup.push(() => db.destroy());
  const { error } = await new Migrator({ db, provider: { getMigrations: async () => migrations } }).migrateTo(last);
  if (error !== undefined) throw error;
  return { db, url };
}

/** Another session (an old instance settling a hold) in a transaction that holds a row lock on accounts, until `release`. */
async function holdAccountRow(url: string): Promise<{ release: () => Promise<void> }> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  let open = true;
  const release = async () => {
    if (!open) return;
    open = false;
    await client.query('commit');
    await client.end();
  };
  cleanup.push(release);
  const id = newId('acct');
  await client.query('insert into accounts (id, name) values ($1, $2)', [id, `holder ${id}`]);
  await client.query('begin');
  await client.query('select id from accounts where id = $1 for update', [id]);
  return { release };
}

function recordingLog(): DbLogger & { lines: string[] } {
  const lines: string[] = [];
  return { lines, info: (msg) => lines.push(`info ${msg}`), warn: (msg) => lines.push(`warn ${msg}`) };
}

async function appliedNames(db: Kysely<any>): Promise<string[]> {
  const { rows } = await sql<{ name: string }>`select name from kysely_migration order by name`.execute(db);
  return rows.map((r) => r.name);
}

async function tableExists(db: Kysely<any>, table: string): Promise<boolean> {
  const { rows } = await sql<{ found: boolean }>`select to_regclass(${table}) is not null as found`.execute(db);
  return rows[0]!.found;
}

/** Tables, columns, indexes, constraints and triggers of the public schema. */
async function schemaOf(db: Kysely<any>): Promise<string[]> {
  const { rows } = await sql<{ line: string }>`
    select format('column %s.%s %s %s %s', table_name, column_name, data_type, is_nullable, column_default) as line
      from information_schema.columns where table_schema = 'public'
    union all select 'index ' || indexdef from pg_indexes where schemaname = 'public'
    union all select format('constraint %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
      from pg_constraint where connamespace = 'public'::regnamespace
    union all select format('trigger %s %s', tgrelid::regclass, pg_get_triggerdef(oid))
      from pg_trigger where not tgisinternal
    order by line`.execute(db);
  return rows.map((r) => r.line);
}

describe('migrateToLatest during an upgrade', () => {
  it('applies the rest from where an older version stopped, each migration committed on its own, to the schema of a fresh database', async () => {
    const { db } = await databaseAt(OLDER_VERSION);
    const log = recordingLog();
    const results = await migrateToLatest(db, log, fast);
    const rest = names.slice(names.indexOf(OLDER_VERSION) + 1);
    expect(results.map((r) => [r.migrationName, r.status])).toEqual(rest.map((n) => [n, 'Success']));
    expect(log.lines).toEqual(rest.map((n) => `info migration ${n} applied`));
    expect(await appliedNames(db)).toEqual([...names].sort());
    expect(await schemaOf(db)).toEqual(await schemaOf(template.db));
  });

  it('a migration that meets a lock another session holds waits at most the lock timeout, is tried again, and applies once the lock is gone', async () => {
    const { db, url } = await databaseAt(OLDER_VERSION);
    const holder = await holdAccountRow(url);
    const log = recordingLog();
    const migrating = migrateToLatest(db, log, { ...fast, attempts: 1_000 });
    // Gave up waiting twice while the lock was still held: the waits are bounded.
    await expect.poll(() => log.lines.filter((l) => l.startsWith('warn')).length, { timeout: 20_000 }).toBeGreaterThanOrEqual(2);
    expect(log.lines.slice(0, 2)).toEqual([
      `info migration ${TOUCHES_NOTHING_HELD} applied`,
      `warn migration ${ALTERS_ACCOUNTS} rolled back: a lock it needs was not granted within the lock timeout (attempt 1 of 1000); trying again in 20 ms`,
    ]);
    // The migration before it was committed on its own, while this one keeps trying.
    expect(await appliedNames(db)).toContain(TOUCHES_NOTHING_HELD);
    expect(await appliedNames(db)).not.toContain(ALTERS_ACCOUNTS);

    await holder.release();
    const results = await migrating;
    expect(results.map((r) => r.migrationName)).toEqual(names.slice(names.indexOf(OLDER_VERSION) + 1));
    expect(log.lines).toContain(`info migration ${ALTERS_ACCOUNTS} applied`);
    expect(await appliedNames(db)).toEqual([...names].sort());
  });

  it('gives up after the bounded attempts with an error naming the migration, and the migrations before it stay applied', async () => {
    const { db, url } = await databaseAt(OLDER_VERSION);
    await holdAccountRow(url);
    const log = recordingLog();
    await expect(migrateToLatest(db, log, { ...fast, attempts: 3 })).rejects.toThrow(
      `database migration "${ALTERS_ACCOUNTS}" failed: canceling statement due to lock timeout (3 attempts: another session kept a lock it needs; the migrations before it are applied)`,
    );
    expect(log.lines).toEqual([
      `info migration ${TOUCHES_NOTHING_HELD} applied`,
      `warn migration ${ALTERS_ACCOUNTS} rolled back: a lock it needs was not granted within the lock timeout (attempt 1 of 3); trying again in 20 ms`,
      `warn migration ${ALTERS_ACCOUNTS} rolled back: a lock it needs was not granted within the lock timeout (attempt 2 of 3); trying again in 20 ms`,
      `warn migration ${ALTERS_ACCOUNTS} failed`,
    ]);
    expect(await appliedNames(db)).toEqual(names.slice(0, names.indexOf(TOUCHES_NOTHING_HELD) + 1));
    // Nothing of the failed migration is left (its transaction was rolled back whole).
    expect(await tableExists(db, 'sweepers')).toBe(false);
    // No session lock is left behind: the next boot migrates.
    const { rows } = await sql<{ n: number }>`
      select count(*)::int as n from pg_locks l join pg_database d on d.oid = l.database where l.locktype = 'advisory' and d.datname = current_database()`.execute(db);
    expect(rows[0]!.n).toBe(0);
  });

  it('media-retention rewrites files before it locks accounts: the key lookups of older instances go on while it works', async () => {
    const { db, url } = await databaseAt(OLDER_VERSION);
    const accountId = newId('acct');
    const fileId = newId('file');
    await sql`insert into accounts (id, name) values (${accountId}, ${`files ${accountId}`})`.execute(db);
    await sql`insert into files (id, account_id, purpose, content_type, bytes, storage_key) values (${fileId}, ${accountId}, 'image_output', 'image/png', 1, ${fileId})`.execute(db);
    // An old instance's transaction holding the row of a file (deleting it), so the rewrite of files waits.
    const holder = new pg.Client({ connectionString: url });
    await holder.connect();
    cleanup.push(() => holder.end());
    await holder.query('begin');
    await holder.query('select id from files where id = $1 for update', [fileId]);
    const migrating = migrateToLatest(db, undefined, { lockTimeoutMs: 30_000, attempts: 1 });
    await expect
      .poll(async () => {
        const { rows } = await sql<{ n: number }>`
          select count(*)::int as n from pg_stat_activity
           where datname = current_database() and wait_event_type = 'Lock' and query like 'update files set expires_at%'`.execute(db);
        return rows[0]!.n;
      })
      .toBe(1);
    // Meanwhile accounts can be read: the migration holds no lock on it yet (NOWAIT fails at once otherwise).
    const reader = new pg.Client({ connectionString: url });
    await reader.connect();
    cleanup.push(() => reader.end());
    await reader.query('begin');
    await expect(reader.query('lock table accounts in access share mode nowait')).resolves.toBeDefined();
    await reader.query('commit');

    await holder.query('commit');
    expect((await migrating).map((r) => r.migrationName)).toContain(ALTERS_ACCOUNTS);
  });

  it('an instance waiting for the migrating one is not a transaction its concurrent index build waits for (no deadlock)', async () => {
    // The database as it was before the concurrent index build, which the upgrade then runs with what follows it.
    const build = names.indexOf('20261227100000-files-task-index');
    const { db, url } = await databaseAt(names[build - 1]!);
    expect(migrations[names[build]!]).toMatchObject({ inTransaction: false });
    // An old instance storing an output in an open transaction: the concurrent build waits for it...
    const writer = new pg.Client({ connectionString: url });
    await writer.connect();
    cleanup.push(() => writer.end());
    const accountId = newId('acct');
    await writer.query('insert into accounts (id, name) values ($1, $2)', [accountId, `writer ${accountId}`]);
    await writer.query('begin');
    await writer.query(`insert into files (id, account_id, purpose, content_type, bytes, storage_key, task_id) values ($1, $2, 'image_output', 'image/png', 1, $1, 'img_1')`, [newId('file'), accountId]);
    const first = migrateToLatest(db, undefined, fast);
    await expect
      .poll(async () => {
        const { rows } = await sql<{ n: number }>`
          select count(*)::int as n from pg_stat_activity
           where datname = current_database() and query like 'create index concurrently files_task_idx%' and wait_event_type = 'Lock'`.execute(db);
        return rows[0]!.n;
      })
      .toBe(1);
    // ...meanwhile a second instance boots and waits for the migration lock; then the output is
    // committed. A statement still waiting for the lock would be a transaction older than the
    // build's snapshot, which the build waits for in turn: a deadlock.
    const second = createDatabase(url, { max: 1, applicationName: 'mediagate-second' });
    cleanup.push(() => second.destroy());
    const waiting = migrateToLatest(second, undefined, fast);
    await expect
      .poll(async () => {
        const { rows } = await sql<{ n: number }>`
          select count(*)::int as n from pg_stat_activity where application_name = 'mediagate-second' and query like '%advisory_lock%'`.execute(db);
        return rows[0]!.n;
      })
      .toBe(1);
    await writer.query('commit');
    expect((await first).map((r) => [r.migrationName, r.status])).toEqual(names.slice(build).map((name) => [name, 'Success']));
    await expect(waiting).resolves.toEqual([]);
    const { rows } = await sql<{ valid: boolean }>`select indisvalid as valid from pg_index where indexrelid = 'files_task_idx'::regclass`.execute(db);
    expect(rows).toEqual([{ valid: true }]);
  });

  it('an instance waiting for the migrating one stops waiting when its signal is aborted (a SIGTERM during start-up), and migrates nothing', async () => {
    const { db, url } = await databaseAt(OLDER_VERSION);
    // The instance migrating holds the migration lock.
    const migrating = new pg.Client({ connectionString: url });
    await migrating.connect();
    cleanup.push(() => migrating.end());
    await migrating.query('select pg_advisory_lock($1)', [MIGRATION_LOCK_ID]);
    const waiter = createDatabase(url, { max: 1, applicationName: 'mediagate-waiting' });
    cleanup.push(() => waiter.destroy());
    const abort = new AbortController();
    const waiting = migrateToLatest(waiter, undefined, { ...fast, signal: abort.signal });
    waiting.catch(() => undefined); // asserted below
    await expect
      .poll(async () => {
        const { rows } = await sql<{ n: number }>`
          select count(*)::int as n from pg_stat_activity where application_name = 'mediagate-waiting' and query like '%advisory_lock%'`.execute(db);
        return rows[0]!.n;
      })
      .toBe(1);
    abort.abort();
    // Were the wait blind to the signal, the waiter would take the lock now and migrate.
    await migrating.query('select pg_advisory_unlock($1)', [MIGRATION_LOCK_ID]);
    await expect(waiting).rejects.toMatchObject({ name: 'AbortError' });
    expect(await appliedNames(db)).toEqual(names.slice(0, names.indexOf(OLDER_VERSION) + 1));
  });
});
