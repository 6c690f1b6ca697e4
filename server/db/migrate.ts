import { setTimeout as sleep } from 'node:timers/promises';
import { type Kysely, type Migration, type MigrationResult, Migrator, sql } from 'kysely';
import type { DbLogger } from './database.ts';
import { migrations } from './migrations/index.ts';

// Arbitrary constant shared by every Mediagate instance ("MGMIGRAT" would not fit in a safe
// integer, so a plain number). Only migrations take this lock.
export const MIGRATION_LOCK_ID = 727_354_001;

/** How often an instance waiting for another's migrations checks whether they are done. */
const LOCK_POLL_MS = 250;

export interface MigrateOptions {
  /** How long a statement of a migration waits for a lock before the migration is rolled back (default 5 s). */
  lockTimeoutMs?: number;
  /** How many times a migration is tried when it meets a lock timeout or a deadlock (default 10). */
  attempts?: number;
  /** Pause between two tries, so the traffic queued behind the migration gets through (default 2 s). */
  retryDelayMs?: number;
  /**
   * Stops the wait for another instance's migrations, the pause between tries and the run between
   * two migrations (a SIGTERM during start-up): the promise rejects with the signal's AbortError.
   */
  signal?: AbortSignal;
}

/**
 * Applies all pending migrations, each in its own transaction, under a session advisory lock on one
 * dedicated connection: when many instances boot at once one migrates and the others wait for the
 * lock, then find nothing to do. (Kysely's own lock is taken only after it creates its bookkeeping tables,
 * which can race.)
 *
 * Instances of the previous version keep serving while this runs, so a migration must not hold or
 * wait for locks for long: one transaction per migration (what it locked is released at its
 * commit, not at the end of the batch), and each statement waits at most `lockTimeoutMs` for a lock
 * (a waiting ALTER TABLE queues every read of that table behind it). A migration that meets a lock
 * timeout or a deadlock is rolled back and tried again after a pause, a bounded number of times;
 * the migrations before it stay committed.
 *
 * A migration module that exports `inTransaction = false` runs outside a transaction, statement by
 * statement (what CREATE INDEX CONCURRENTLY needs), and without the lock timeout: a concurrent
 * build waits for every older transaction, which blocks nobody, and a timeout would leave an
 * invalid index. Such a migration must be safe to run again from the start (after a failure, or a
 * crash before it was recorded).
 */
export async function migrateToLatest(db: Kysely<any>, log?: DbLogger, opts: MigrateOptions = {}): Promise<MigrationResult[]> {
  const lockTimeoutMs = opts.lockTimeoutMs ?? 5_000;
  const attempts = opts.attempts ?? 10;
  const retryDelayMs = opts.retryDelayMs ?? 2_000;
  const { signal } = opts;
  signal?.throwIfAborted();
  return db.connection().execute(async (conn) => {
    // Polled, not waited for in pg_advisory_lock: a statement waiting for the lock is a transaction,
    // and a CREATE INDEX CONCURRENTLY of the instance migrating waits for every older transaction
    // (a deadlock that kills one of the two).
    while (!(await tryMigrationLock(conn))) await sleep(LOCK_POLL_MS, undefined, { signal });
    try {
      const provider = { getMigrations: async () => withLockTimeout(migrations, lockTimeoutMs) };
      // One migration per call of migrateTo: Kysely records it in the same transaction it runs in.
      const inTransaction = new Migrator({ db: conn, provider });
      const outsideTransaction = new Migrator({ db: conn, provider, disableTransactions: true });
      const pending = (await inTransaction.getMigrations()).filter((m) => m.executedAt === undefined);
      const applied: MigrationResult[] = [];
      for (const { name } of pending) {
        signal?.throwIfAborted();
        const migrator = runsInTransaction(migrations[name]!) ? inTransaction : outsideTransaction;
        for (let attempt = 1; ; attempt++) {
          const { error, results = [] } = await migrator.migrateTo(name);
          if (error === undefined) {
            applied.push(...results);
            if (results.some((r) => r.status === 'Success')) log?.info(`migration ${name} applied`);
            break;
          }
          const reason = error instanceof Error ? error.message : String(error);
          const conflict = lockConflict(error);
          if (conflict !== undefined && attempt < attempts) {
            log?.warn(`migration ${name} rolled back: ${conflict} (attempt ${attempt} of ${attempts}); trying again in ${retryDelayMs} ms`);
            await sleep(retryDelayMs, undefined, { signal });
            continue;
          }
          log?.warn(`migration ${name} failed`);
          const gaveUp = conflict !== undefined ? ` (${attempts} attempts: another session kept a lock it needs; the migrations before it are applied)` : '';
          throw new Error(`database migration "${name}" failed: ${reason}${gaveUp}`, { cause: error });
        }
      }
      return applied;
    } finally {
      // If the connection broke, the server already dropped the session lock; don't mask the error.
      await sql`select pg_advisory_unlock(${sql.lit(MIGRATION_LOCK_ID)})`.execute(conn).catch(() => undefined);
    }
  });
}

async function tryMigrationLock(conn: Kysely<any>): Promise<boolean> {
  const { rows } = await sql<{ locked: boolean }>`select pg_try_advisory_lock(${sql.lit(MIGRATION_LOCK_ID)}) as locked`.execute(conn);
  return rows[0]!.locked;
}

function runsInTransaction(migration: Migration): boolean {
  return (migration as { inTransaction?: unknown }).inTransaction !== false;
}

/** The migrations, each one that runs in a transaction first setting the transaction's lock timeout. */
function withLockTimeout(all: Record<string, Migration>, ms: number): Record<string, Migration> {
  return Object.fromEntries(
    Object.entries(all).map(([name, m]) => [
      name,
      runsInTransaction(m)
        ? {
            up: async (trx: Kysely<any>) => {
              await sql`select set_config('lock_timeout', ${String(ms)}, true)`.execute(trx);
              await m.up(trx);
            },
          }
        : m,
    ]),
  );
}

/** What went wrong, when it is worth trying the migration again: a lock it waited for too long, or a deadlock. */
function lockConflict(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | undefined)?.code;
  if (code === '55P03') return 'a lock it needs was not granted within the lock timeout';
  if (code === '40P01') return 'deadlock with another session';
  return undefined;
}
