// Usage: tsx scripts/create-migration.ts <kebab-case-name>
//   Creates server/db/migrations/<UTC timestamp>-<name>.ts from a template and rewrites
//   server/db/migrations/index.ts to list every migration file in order.
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const USAGE = 'Usage: tsx scripts/create-migration.ts <kebab-case-name>   (e.g. add-video-tasks)';
const MIGRATIONS_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', 'server', 'db', 'migrations');
const FILE_PATTERN = /^(\d{14})-([a-z0-9]+(?:-[a-z0-9]+)*)\.ts$/;

const TEMPLATE = `import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead. Use raw SQL and name
// every constraint (<table>_<what>) so errors can be mapped by constraint name.
const statements: string[] = [
  // \`create table ... ( ... )\`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
`;

function timestamp(date: Date): string {
  return date.toISOString().replace(/[-:T]/g, '').slice(0, 14); // YYYYMMDDHHMMSS, UTC
}

/** The index file text for the given migration file names (sorted = applied order). */
function renderIndex(files: string[]): string {
  const entries = files
    .map((file) => FILE_PATTERN.exec(file))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => ({ name: `${m[1]}-${m[2]}`, ident: `m${m[1]}` }))
    .sort((a, b) => a.name.localeCompare(b.name));
  return [
    '// Static list of migrations (no filesystem scanning, so it works from tsx, tsc output and',
    '// bundles alike). `tsx scripts/create-migration.ts <name>` regenerates this file.',
    "import type { Migration } from 'kysely';",
    ...entries.map((e) => `import * as ${e.ident} from './${e.name}.ts';`),
    '',
    'export const migrations: Record<string, Migration> = {',
    ...entries.map((e) => `  '${e.name}': ${e.ident},`),
    '};',
    '',
  ].join('\n');
}

function main(): void {
  const name = process.argv[2];
  if (!name || process.argv.length > 3 || !/^[a-z0-9]+(?:-[a-z0-9]+)*$/.test(name)) {
    console.error(USAGE);
    process.exitCode = 1;
    return;
  }
  const existing = readdirSync(MIGRATIONS_DIR).filter((f) => FILE_PATTERN.test(f)).sort();
  let stamp = timestamp(new Date());
  // Keep names strictly increasing even if the clock is behind the newest migration.
  const newest = existing.at(-1)?.slice(0, 14);
  if (newest !== undefined && stamp <= newest) stamp = (BigInt(newest) + 1n).toString();
  const file = `${stamp}-${name}.ts`;
  const path = join(MIGRATIONS_DIR, file);
  if (existsSync(path)) throw new Error(`${path} already exists`);
  writeFileSync(path, TEMPLATE);
  writeFileSync(join(MIGRATIONS_DIR, 'index.ts'), renderIndex([...existing, file]));
  console.log(`created ${path}`);
}

try {
  main();
} catch (err) {
  console.error(err instanceof Error ? err.message : err);
  process.exitCode = 1;
}
