// Usage: npm run migrate
//   Applies pending migrations to DATABASE_URL, or else to the embedded PostgreSQL in
//   $MEDIAGATE_DATA_DIR (default ./.mediagate), reusing it when `npm start` already runs it.
import { createDatabase, type DbLogger } from '../server/db/database.ts';
import { connectOrStartEmbedded } from '../server/db/embedded.ts';
import { migrateToLatest } from '../server/db/migrate.ts';

const USAGE = 'Usage: npm run migrate   (env: DATABASE_URL, or MEDIAGATE_DATA_DIR for the embedded database, default ./.mediagate)';

const log: DbLogger = {
  info: (msg) => console.log(msg),
  warn: (msg) => console.warn(msg),
};

async function main(): Promise<void> {
  if (process.argv.slice(2).some((arg) => arg === '--help' || arg === '-h')) {
    console.log(USAGE);
    return;
  }
  if (process.argv.length > 2) throw new Error(`unexpected arguments: ${process.argv.slice(2).join(' ')}\n${USAGE}`);

  // Ctrl-C or SIGTERM (while waiting for another instance's migrations, say) stops between two
  // migrations and still stops the embedded PostgreSQL this script started; the same signal again kills it.
  const abort = new AbortController();
  for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, () => abort.abort());
  const embedded = process.env.DATABASE_URL
    ? undefined
    : await connectOrStartEmbedded(process.env.MEDIAGATE_DATA_DIR || './.mediagate', log);
  const db = createDatabase(process.env.DATABASE_URL || embedded!.url, { max: 1, applicationName: 'mediagate-migrate' });
  try {
    const results = await migrateToLatest(db, log, { signal: abort.signal });
    if (results.length === 0) log.info('database is up to date');
  } finally {
    await db.destroy();
    if (embedded?.started) await embedded.stop();
  }
}

main().catch((err: unknown) => {
  // Migrations applied before the signal stay applied; the next run does the rest.
  if (err instanceof Error && err.name === 'AbortError') console.error('stopped by a signal');
  else console.error(err instanceof Error ? err.message : err);
  process.exitCode = 1;
});
