import type { Kysely } from 'kysely';
import { inject } from 'vitest';
import type { DB } from '../../generated/db.d.ts';
import { createDatabase } from '../../server/db/database.ts';
import { createScratchDatabase, dropScratchDatabase, scratchDatabaseName, withDatabaseName } from '../../server/db/scratch-database.ts';

export interface TestDatabase {
  /** Connection string of this file's own database. */
  url: string;
  db: Kysely<DB>;
  /** Closes the pool and drops the database. */
  destroy(): Promise<void>;
}

/**
 * A fresh, migrated database copied from the run's template (fast: no migrations per file).
 * Use one per test file:
 *
 *   let t: TestDatabase;
 *   beforeAll(async () => { t = await createTestDatabase(); });
 *   afterAll(() => t.destroy());
 */
export async function createTestDatabase(opts: { max?: number } = {}): Promise<TestDatabase> {
  const adminUrl = inject('pgAdminUrl');
  const template = inject('pgTemplate');
  // Named after the template so the global teardown can find leftovers of this run.
  const name = scratchDatabaseName(template);
  await createScratchDatabase(adminUrl, name, template);
  const url = withDatabaseName(adminUrl, name);
  const db = createDatabase(url, { max: opts.max ?? 10, applicationName: 'mediagate-test' });
  return {
    url,
    db,
    destroy: async () => {
      await db.destroy();
      await dropScratchDatabase(adminUrl, name);
    },
  };
}
