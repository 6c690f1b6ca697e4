/**
 * Keyset pages of one account's rows (files, video tasks, image tasks), in the shape OpenAI's list
 * endpoints page: ordered by (created_at, id), and `after` is the id of the previous page's last
 * item, whose position the same statement looks up. Stable under concurrent inserts: a page
 * continues strictly after that position, so no row is listed twice or skipped. Served by the
 * (account_id, created_at, id) index of each table.
 *
 * A deleted file keeps its position for at least a week (file_tombstones, written by the deleting
 * statement itself: the file-tombstones migration), so a client that deletes what it lists, or a
 * sweeper that deletes a file between two pages, does not break the walk. Task rows are never
 * deleted and need none.
 */
import { sql, type RawBuilder } from 'kysely';
import type { Executor } from '../db/database.ts';

export type PagedTable = 'files' | 'video_tasks' | 'image_tasks';

/** Where the positions of a table's deleted rows are kept (id, account_id, created_at). */
const TOMBSTONES: Partial<Record<PagedTable, string>> = { files: 'file_tombstones' };

export interface AccountPage {
  accountId: string;
  /** Rows to fetch (the page size + 1 tells whether more follow). */
  limit: number;
  order: 'asc' | 'desc';
  /** The id of the last item of the previous page. */
  after?: string;
  /**
   * Exclusive bounds of created_at as the API shows it (RFC 3339, milliseconds), kept as text for
   * PostgreSQL to parse: the stored microseconds must not put an item "after" its own shown time.
   */
  createdAfter?: string;
  createdBefore?: string;
}

/**
 * The WHERE conditions of a page of `table` (its account, time bounds and position), to AND with
 * the listing's own filters. The position is the `after` row's, or its tombstone's once deleted;
 * an `after` with neither matches nothing: the page is empty, and `afterExists` tells the caller
 * whether that was the end or a cursor of nothing.
 */
export function pageConditions(table: PagedTable, page: AccountPage): RawBuilder<boolean> {
  const t = sql.table(table);
  const conditions: RawBuilder<unknown>[] = [sql`${t}.account_id = ${page.accountId}`];
  // Millisecond bounds on the parameter side (the column stays bare, for the index): shown after
  // `a` is at or after the next millisecond; shown before `b` is before `b` rounded up to one.
  if (page.createdAfter !== undefined) conditions.push(sql`${t}.created_at >= date_trunc('milliseconds', ${page.createdAfter}::timestamptz) + interval '1 millisecond'`);
  if (page.createdBefore !== undefined) conditions.push(sql`${t}.created_at < date_trunc('milliseconds', ${page.createdBefore}::timestamptz + interval '999 microseconds')`);
  if (page.after !== undefined) {
    const direction = page.order === 'asc' ? sql`>` : sql`<`;
    conditions.push(sql`(${t}.created_at, ${t}.id) ${direction} (${positionOf(table, page.after, page.accountId)})`);
  }
  return sql<boolean>`(${sql.join(conditions, sql` and `)})`;
}

/** ORDER BY of a page: creation time, then id, both in the page's direction. */
export function pageOrder(table: PagedTable, page: AccountPage): RawBuilder<unknown> {
  const t = sql.table(table);
  return page.order === 'asc' ? sql`${t}.created_at asc, ${t}.id asc` : sql`${t}.created_at desc, ${t}.id desc`;
}

/**
 * The (created_at, id) of `id` in the account's `table`: its row, else its tombstone (a row and a
 * tombstone of one id never both exist; the row is read first, and the LIMIT stops there).
 */
function positionOf(table: PagedTable, id: string, accountId: string): RawBuilder<unknown> {
  const live = sql`select c.created_at, c.id from ${sql.table(table)} c where c.id = ${id} and c.account_id = ${accountId}`;
  const tombstones = TOMBSTONES[table];
  if (tombstones === undefined) return live;
  return sql`${live} union all select g.created_at, g.id from ${sql.table(tombstones)} g where g.id = ${id} and g.account_id = ${accountId} limit 1`;
}

/** Whether `id` is a row of the account in `table`, or a deleted one with a tombstone (an `after` that matched nothing). */
export async function afterExists(db: Executor, table: PagedTable, id: string, accountId: string): Promise<boolean> {
  const { rows } = await sql<{ found: boolean }>`select exists (${positionOf(table, id, accountId)}) as found`.execute(db);
  return rows[0]?.found === true;
}
