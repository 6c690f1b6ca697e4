/**
 * Opaque list cursors: base64url of a small JSON position tagged with its listing. They are not
 * signed: a forged cursor can only move the caller (an operator) within a listing it may read
 * anyway. A malformed one, or another listing's, is `400 invalid_cursor` (another listing's
 * position would otherwise read as a valid one and end the listing early, silently).
 */
import { badRequest } from '../../errors.ts';
import type { CreatedAtPosition } from '../../repositories/account.repository.ts';

const invalidCursor = () => badRequest('invalid_cursor', 'The cursor was not issued by this server (pass next_cursor unchanged).', 'cursor');

function decode(cursor: string): Record<string, unknown> {
  try {
    const value: unknown = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
    if (typeof value === 'object' && value !== null && !Array.isArray(value)) return value as Record<string, unknown>;
  } catch {
    // fall through
  }
  throw invalidCursor();
}

const encode = (value: unknown) => Buffer.from(JSON.stringify(value), 'utf8').toString('base64url');

/** The listings that page with a cursor. */
export type Listing = 'accounts' | 'api_keys' | 'groups' | 'ledger' | 'tasks' | 'webhook_deliveries';

/** Cursor of a newest-first listing: (created_at in epoch microseconds, id). */
export function encodeCreatedAtCursor(listing: Listing, position: CreatedAtPosition): string {
  return encode({ l: listing, c: position.createdAtMicros, i: position.id });
}

export function decodeCreatedAtCursor(listing: Listing, cursor: string): CreatedAtPosition {
  const { l, c, i } = decode(cursor);
  if (l !== listing || typeof c !== 'number' || !Number.isSafeInteger(c) || c < 0 || typeof i !== 'string' || i === '' || i.length > 128) throw invalidCursor();
  return { createdAtMicros: c, id: i };
}

/** Cursor of a listing in name order. */
export function encodeNameCursor(listing: Listing, name: string): string {
  return encode({ l: listing, n: name });
}

export function decodeNameCursor(listing: Listing, cursor: string): string {
  const { l, n } = decode(cursor);
  if (l !== listing || typeof n !== 'string' || n === '' || n.length > 128) throw invalidCursor();
  return n;
}

/** Cursor of a listing in the order of a numbered id (the ledger's entries, numbered as written). */
export function encodeIdCursor(listing: Listing, id: number): string {
  return encode({ l: listing, d: id });
}

export function decodeIdCursor(listing: Listing, cursor: string): number {
  const { l, d } = decode(cursor);
  if (l !== listing || typeof d !== 'number' || !Number.isSafeInteger(d) || d < 1) throw invalidCursor();
  return d;
}

/** Splits a `limit + 1` row fetch into the page and whether more rows follow. */
export function splitPage<T>(rows: T[], limit: number): { page: T[]; last: T | undefined } {
  const page = rows.slice(0, limit);
  return { page, last: rows.length > limit ? page[page.length - 1] : undefined };
}

export const DEFAULT_PAGE_SIZE = 50;
export const MAX_PAGE_SIZE = 200;

/** The page size: the contract's default and range, also for CLI callers that skip validation. */
export function pageSize(limit: number | undefined): number {
  if (limit === undefined || Number.isNaN(limit)) return DEFAULT_PAGE_SIZE;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_PAGE_SIZE) {
    throw badRequest('invalid_request', `'limit' must be an integer between 1 and ${MAX_PAGE_SIZE}.`, 'limit');
  }
  return limit;
}
