/**
 * A migration runs while instances of the previous version serve (README, "Upgrading"): it may
 * wait for a lock a bounded time, but once it has one it must not hold it for as long as a scan of
 * a big table takes. Migrations since FIRST_CHECKED are read for the two ways that happened before
 * (client-limits and operator-views built indexes on the task and ledger tables in a transaction;
 * files-orientation validated a CHECK over all of files): an index on a table the migration did not
 * create is built CONCURRENTLY (outside a transaction: `inTransaction = false`), and a CHECK or
 * FOREIGN KEY added to such a table is NOT VALID (validated later, if at all, without blocking writes).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { migrations } from '../../server/db/migrations/index.ts';
import { repoRoot } from '../support/server-process.ts';

const FIRST_CHECKED = '20270101100000-pending-deletes';
const dir = join(repoRoot, 'server/db/migrations');

/** What in a migration's SQL would hold a lock on an existing table while it scans it. */
function longLocks(source: string): string[] {
  const text = source.replace(/\s+/g, ' ').toLowerCase();
  const created = new Set([...text.matchAll(/create table (?:if not exists )?(\w+)/g)].map((m) => m[1]));
  const found: string[] = [];
  for (const m of text.matchAll(/create (?:unique )?index (concurrently )?(?:if not exists )?\w+ on (?:only )?(\w+)/g)) {
    if (!m[1] && !created.has(m[2])) found.push(`index on ${m[2]} built without CONCURRENTLY`);
  }
  for (const [, table = '', clauses = ''] of text.matchAll(/alter table (?:only )?(?:if exists )?(\w+)([^`'"]*)/g)) {
    if (created.has(table)) continue;
    for (const [, kind, rest = ''] of clauses.matchAll(/add constraint \w+ (check|foreign key)(.*?)(?=, add |, alter |$)/g)) {
      if (!/not valid/.test(rest)) found.push(`${kind} on ${table} added without NOT VALID`);
    }
  }
  if (found.some((f) => f.includes('CONCURRENTLY')) && !/export const intransaction = false/.test(text)) found.push('CONCURRENTLY needs `export const inTransaction = false`');
  return found;
}

it('finds what it looks for (the earlier migrations that held hot tables)', () => {
  const read = (name: string) => readFileSync(join(dir, `${name}.ts`), 'utf8');
  expect(longLocks(read('20261220100000-operator-views'))).toContain('index on video_tasks built without CONCURRENTLY');
  expect(longLocks(read('20261229100000-files-orientation'))).toEqual(['check on files added without NOT VALID']);
  expect(longLocks(read('20261227100000-files-task-index'))).toEqual([]);
});

it('keeps every migration since FIRST_CHECKED to short locks on existing tables', () => {
  const names = Object.keys(migrations).filter((name) => name >= FIRST_CHECKED);
  expect(names.length).toBeGreaterThan(0);
  expect(readdirSync(dir).filter((f) => f.endsWith('.ts') && f !== 'index.ts').length).toBe(Object.keys(migrations).length);
  expect(Object.fromEntries(names.map((name) => [name, longLocks(readFileSync(join(dir, `${name}.ts`), 'utf8'))]))).toEqual(Object.fromEntries(names.map((name) => [name, []])));
});
