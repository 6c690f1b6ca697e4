/**
 * The bench's database: a scratch `mediagate_bench_<random>` database on DATABASE_URL's server
 * (dropped afterwards), or a throwaway embedded PostgreSQL when DATABASE_URL is unset. Migrated and
 * seeded with the local catalog and one customer with a large balance.
 */
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { createDatabase, type DbLogger } from '../../server/db/database.ts';
import { startTemporaryEmbeddedPostgres } from '../../server/db/embedded.ts';
import { migrateToLatest } from '../../server/db/migrate.ts';
import { createScratchDatabase, dropScratchDatabase, scratchDatabaseName, withDatabaseName } from '../../server/db/scratch-database.ts';
import { createCustomer, seedCatalog } from '../../test/support/factories.ts';

export interface BenchDatabase {
  url: string;
  /** What the figures ran against, for the report header. */
  description: string;
  destroy(): Promise<void>;
}

const quiet: DbLogger = { info: () => undefined, warn: (msg) => console.warn(msg) };

export async function openBenchDatabase(databaseUrl: string | undefined): Promise<BenchDatabase> {
  let bench: BenchDatabase;
  if (databaseUrl) {
    const name = scratchDatabaseName('mediagate_bench');
    await createScratchDatabase(databaseUrl, name);
    const host = new URL(databaseUrl).host;
    bench = { url: withDatabaseName(databaseUrl, name), description: `DATABASE_URL server ${host}, scratch database ${name}`, destroy: () => dropScratchDatabase(databaseUrl, name) };
  } else {
    const embedded = await startTemporaryEmbeddedPostgres(quiet);
    bench = { url: embedded.url, description: 'temporary embedded PostgreSQL', destroy: embedded.stop };
  }
  try {
    const db = createDatabase(bench.url, { max: 2, applicationName: 'mediagate-bench-setup' });
    try {
      await migrateToLatest(db, quiet);
      // An experiment on the schema (not a setting): SQL run once after the migrations, e.g. dropping
      // indexes to measure what they cost (docs/BENCHMARKS.md).
      if (process.env.BENCH_EXPERIMENT_SQL) await sql.raw(process.env.BENCH_EXPERIMENT_SQL).execute(db);
      const version = await db.selectNoFrom((eb) => eb.fn<string>('version', []).as('v')).executeTakeFirstOrThrow();
      bench.description += ` (${version.v.split(' ').slice(0, 2).join(' ')})`;
    } finally {
      await db.destroy();
    }
  } catch (err) {
    await bench.destroy().catch(() => undefined);
    throw err;
  }
  return bench;
}

export interface Customer {
  accountId: string;
  apiKeyId: string;
  groupId: string;
  key: string;
}

/** The local catalog (idempotent) and a new customer whose balance never runs out during a run. */
export async function seedCustomer(db: Kysely<DB>): Promise<Customer> {
  await seedCatalog(db);
  return createCustomer(db, { balance: 1_000_000_000 });
}
