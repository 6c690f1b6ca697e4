/**
 * Named prepared statements for the statements of the hot path (the credit hold, a task's
 * settlement). Sent as text, PostgreSQL parses, analyzes and plans such a statement on every call:
 * for the hold and the settlement that took 0.6–0.8 ms each here, more than running them. Sent
 * with a name, each pooled connection parses a statement once and then only binds and runs it.
 *
 * `runPrepared(query, db)` runs a raw query with a mark in front of its text. The pool's clients
 * (`preparingClient`, installed by createDatabase) send marked text as a named statement whose name
 * is a hash of the text, so each variant of a statement (another column set, another CTE) gets its
 * own name, and the number of names per connection is the number of variants in the code.
 *
 * Rules for a marked statement:
 * - its result columns are listed (never `*` or `t.*` over `returning *`): PostgreSQL refuses to
 *   run a cached plan whose result columns changed, which a migration adding a column while older
 *   instances run would otherwise cause (see `columnsOf`);
 * - its text is the same for every call of a variant: values go in as parameters.
 *
 * With `DB_PREPARED_STATEMENTS=0` the pool does not install `preparingClient` and marked statements
 * run as plain text (the mark is a comment): for a pooler in transaction mode that does not carry
 * named statements across server connections, such as PgBouncer before 1.21.
 */
import { createHash } from 'node:crypto';
import { sql, type RawBuilder } from 'kysely';
import type pg from 'pg';
import type { Executor } from './database.ts';
import { dbColumns } from '../../generated/db-columns.ts';

/** The comment a marked statement starts with (PostgreSQL ignores it). */
export const PREPARE_MARK = '/*mg:prepared*/ ';

/**
 * Runs `query` (written in SQL's snake_case) as a named prepared statement and returns its rows
 * with camelCase keys. It skips the CamelCasePlugin's rewrite of the query, which walks and copies
 * every node of a large raw statement (about 0.1 ms for the hold): raw SQL names nothing in
 * camelCase, so there is nothing to rewrite.
 */
export async function runPrepared<R>(query: RawBuilder<R>, db: Executor): Promise<R[]> {
  const result = await sql<Record<string, unknown>>`${sql.raw(PREPARE_MARK)}${query}`.execute(withoutPlugins(db));
  return result.rows.map(camelRow) as R[];
}

/** `db.withoutPlugins()` once per database (a new Kysely each call costs a few objects and freezes on the hot path); transactions as they come. */
const plain = new WeakMap<Executor, Executor>();

function withoutPlugins(db: Executor): Executor {
  if (db.isTransaction) return db.withoutPlugins();
  let found = plain.get(db);
  if (!found) {
    found = db.withoutPlugins();
    plain.set(db, found);
  }
  return found;
}

/** snake_case column name -> camelCase key, as the CamelCasePlugin maps them (`result_file_ids` -> `resultFileIds`). */
const camelKeys = new Map<string, string>();

function camelRow(row: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const key in row) {
    let camel = camelKeys.get(key);
    if (camel === undefined) {
      camel = key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
      camelKeys.set(key, camel);
    }
    out[camel] = row[key];
  }
  return out;
}

/** Statement names by text: a hash per call would cost more than the lookup. Bounded by the code's variants. */
const names = new Map<string, string>();

function nameOf(text: string): string {
  let name = names.get(text);
  if (name === undefined) {
    name = `mg_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`;
    names.set(text, name);
  }
  return name;
}

type QueryFn = (...args: unknown[]) => unknown;

/**
 * Makes `client` send marked text as a named statement (node-postgres parses a name once per
 * connection and binds it afterwards). Everything else passes through unchanged.
 */
export function preparingClient(client: pg.PoolClient): void {
  const query = client.query.bind(client) as QueryFn;
  (client as unknown as { query: QueryFn }).query = (first: unknown, ...rest: unknown[]) => {
    if (typeof first === 'string' && first.startsWith(PREPARE_MARK)) {
      return query({ name: nameOf(first), text: first, values: rest[0] });
    }
    return query(first, ...rest);
  };
}

/**
 * The columns of `table` as a list (`"id", "account_id", …`), from generated/db-columns.ts: the
 * result list of a marked statement that returns whole rows. It is the list this build was
 * generated with, so a column a later migration adds is not returned until the code knows of it.
 */
export function columnsOf(table: keyof typeof dbColumns): RawBuilder<unknown> {
  let list = columnLists.get(table);
  if (!list) {
    list = identifierList(dbColumns[table]);
    columnLists.set(table, list);
  }
  return list;
}

const columnLists = new Map<string, RawBuilder<unknown>>();

/** Column names by field (the batched hold converts every field of every task row): bounded by the schema's fields. */
const snakeNames = new Map<string, string>();

/** A field's column name: `resultFileIds` -> `result_file_ids` (the reverse of camelRow's keys). */
export function snake(name: string): string {
  let column = snakeNames.get(name);
  if (column === undefined) {
    column = name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
    snakeNames.set(name, column);
  }
  return column;
}

/**
 * Fields of a row (camelCase, as the code names them) as the list of their columns (snake_case):
 * the result list of a marked statement that returns only some of a row's columns.
 */
export function fieldList(fields: readonly string[]): RawBuilder<unknown> {
  return identifierList(fields.map(snake));
}

/**
 * Names as one piece of SQL text (`"a", "b"`): the query compiler copies it instead of visiting a
 * node per name, which for the hold's 50-odd names was most of the statement's compile time. Only
 * for names written in the code (quotes inside would be doubled, as identifiers need).
 */
export function identifierList(names: readonly string[]): RawBuilder<unknown> {
  return sql.raw(names.map((n) => `"${n.replaceAll('"', '""')}"`).join(', '));
}
