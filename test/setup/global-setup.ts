import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import type { TestProject } from 'vitest/node';
import { createDatabase, type DbLogger } from '../../server/db/database.ts';
import { startTemporaryEmbeddedPostgres } from '../../server/db/embedded.ts';
import { migrateToLatest } from '../../server/db/migrate.ts';
import { createScratchDatabase, dropScratchDatabase, listDatabases, withDatabaseName } from '../../server/db/scratch-database.ts';
import { repoRoot } from '../support/server-process.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    /** A database on the test server to run CREATE/DROP DATABASE from (never a test's own). */
    pgAdminUrl: string;
    /** Name of the migrated template database that createTestDatabase() copies. */
    pgTemplate: string;
  }
}

const quiet: DbLogger = { info: () => {}, warn: (msg) => console.warn(msg) };

/**
 * Runs once per `vitest run`: picks the PostgreSQL server (TEST_DATABASE_URL, else one embedded
 * server in a temp dir) and builds a migrated template database that each test file copies.
 */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  // The servers and admin CLIs the process tests start run built, as `npm start` and `npm run
  // admin` do (test/support/server-process.ts): dist/ is brought up to date as those commands do it.
  const build = spawnSync(process.execPath, ['scripts/start.mjs', 'scripts/admin', 'scripts/admin.ts'], { cwd: repoRoot, stdio: 'inherit' });
  if (build.status !== 0) throw new Error(`dist/ could not be brought up to date (scripts/start.mjs exited with ${build.status ?? build.signal})`);
  const external = process.env.TEST_DATABASE_URL;
  // Nothing in the embedded one outlives the run, so it does not flush to disk (fsync off: a commit
  // still waits for its WAL to be written, not for the disk). synchronous_commit keeps its default:
  // the server turns it off for an unflushed hold's transaction only, and test/db/ledger.test.ts
  // checks that. The tests of durability across a crash run clusters of their own.
  const embedded = external ? undefined : await startTemporaryEmbeddedPostgres(quiet, { fsync: 'off', full_page_writes: 'off' });
  const adminUrl = external ?? embedded!.adminUrl;
  const runId = randomBytes(4).toString('hex');
  const template = `mediagate_tpl_${runId}`;

  try {
    await createScratchDatabase(adminUrl, template);
    // Migrate, then close every connection: PostgreSQL refuses to copy a template with sessions.
    const db = createDatabase(withDatabaseName(adminUrl, template), { max: 1, applicationName: 'mediagate-test-template' });
    try {
      await migrateToLatest(db);
    } finally {
      await db.destroy();
    }
  } catch (err) {
    await embedded?.stop();
    throw err;
  }

  project.provide('pgAdminUrl', adminUrl);
  project.provide('pgTemplate', template);

  return async () => {
    if (embedded) {
      await embedded.stop(); // the whole server goes, with every test database
      return;
    }
    // On a shared server, drop this run's test databases that a crashed file left, then the template.
    for (const name of await listDatabases(adminUrl, `${template}_`)) await dropScratchDatabase(adminUrl, name);
    await dropScratchDatabase(adminUrl, template);
  };
}
