import { type Kysely, type MigrationResult, Migrator, sql } from 'kysely';
import type { DbLogger } from './database.ts';
import { migrations } from './migrations/index.ts';

// Arbitrary constant shared by every Mediagate instance ("MGMIGRAT" would not fit in a safe
// integer, so a plain number). Only migrations take this lock.
export const MIGRATION_LOCK_ID = 727_354_001;

/**
 * Applies all pending migrations. Held under a session advisory lock on one dedicated connection,
 * so when many instances boot at once one migrates and the others wait, then find nothing to do.
 * (Kysely's own lock is taken only after it creates its bookkeeping tables, which can race.)
 */
export async function migrateToLatest(db: Kysely<any>, log?: DbLogger): Promise<MigrationResult[]> {
  return db.connection().execute(async (conn) => {
    await sql`select pg_advisory_lock(${sql.lit(MIGRATION_LOCK_ID)})`.execute(conn);
    try {
      const migrator = new Migrator({ db: conn, provider: { getMigrations: async () => migrations } });
      const { error, results = [] } = await migrator.migrateToLatest();
      for (const r of results) {
        if (r.status === 'Success') log?.info(`migration ${r.migrationName} applied`);
        else if (r.status === 'Error') log?.warn(`migration ${r.migrationName} failed`);
      }
      if (error !== undefined) {
        const failed = results.find((r) => r.status === 'Error')?.migrationName;
        const reason = error instanceof Error ? error.message : String(error);
        throw new Error(`database migration ${failed ? `"${failed}" ` : ''}failed: ${reason}`, { cause: error });
      }
      return results;
    } finally {
      // If the connection broke, the server already dropped the session lock; don't mask the error.
      await sql`select pg_advisory_unlock(${sql.lit(MIGRATION_LOCK_ID)})`.execute(conn).catch(() => undefined);
    }
  });
}
