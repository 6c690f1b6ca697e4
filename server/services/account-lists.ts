/**
 * A client's listings of its own files and tasks (GET /v1/files, /v1/videos, /v1/images) in
 * OpenAI's list shape, which the official SDKs page through: `after` is the id of the previous
 * page's last item (repositories/account-pages.ts turns it into a keyset position), and the answer
 * is `{object: 'list', data, first_id, last_id, has_more}`.
 */
import { badRequest, type ApiError } from '../errors.ts';
import type { AccountPage } from '../repositories/account-pages.ts';
import { pageSize, splitPage } from './admin/cursor.ts';

/** The query parameters every listing takes (validated by the contract). */
export interface ListQuery {
  after?: string;
  limit?: number;
  order?: 'asc' | 'desc';
  created_after?: string;
  created_before?: string;
}

/** A task listing's query: the common parameters and its filters. */
export interface TaskListQuery<S extends string> extends ListQuery {
  status?: S[];
  model?: string;
}

export interface ListPage<T> {
  object: 'list';
  data: T[];
  first_id: string | null;
  last_id: string | null;
  has_more: boolean;
}

/** The keyset page a listing reads: one row more than it shows tells whether more follow. */
export function accountPage(accountId: string, query: ListQuery): { page: AccountPage; size: number } {
  const size = pageSize(query.limit);
  return {
    size,
    page: {
      accountId,
      limit: size + 1,
      order: query.order ?? 'desc',
      ...(query.after !== undefined && { after: query.after }),
      ...(query.created_after !== undefined && { createdAfter: query.created_after }),
      ...(query.created_before !== undefined && { createdBefore: query.created_before }),
    },
  };
}

/** The envelope of the first `size` rows (of `size + 1` fetched), each mapped to its API object. */
export async function listPage<R extends { id: string }, T>(rows: R[], size: number, map: (row: R) => T | Promise<T>): Promise<ListPage<T>> {
  const { page } = splitPage(rows, size);
  return {
    object: 'list',
    data: await Promise.all(page.map(map)),
    first_id: page[0]?.id ?? null,
    last_id: page.at(-1)?.id ?? null,
    has_more: rows.length > size,
  };
}

/**
 * `after` named nothing this listing of the account holds: a forged or foreign id, or a file deleted
 * more than a week ago (a recently deleted one keeps its position: repositories/account-pages.ts).
 */
export function invalidAfter(what: 'file' | 'video task' | 'image task'): ApiError {
  return badRequest('invalid_cursor', `'after' names no ${what} of this account; pass the last_id of the previous page unchanged.`, 'after');
}
