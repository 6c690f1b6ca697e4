/**
 * Opaque list cursors: base64url of a small JSON position. They are not signed: a forged cursor
 * can only move the caller within a listing it may read anyway, and a malformed one is
 * `400 invalid_cursor`.
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

/** Cursor of a newest-first listing: (created_at in epoch microseconds, id). */
export function encodeCreatedAtCursor(position: CreatedAtPosition): string {
  return encode({ c: position.createdAtMicros, i: position.id });
}

export function decodeCreatedAtCursor(cursor: string): CreatedAtPosition {
  const { c, i } = decode(cursor);
  if (typeof c !== 'number' || !Number.isSafeInteger(c) || c < 0 || typeof i !== 'string' || i === '' || i.length > 128) throw invalidCursor();
  return { createdAtMicros: c, id: i };
}

/** Cursor of a listing in name order. */
export function encodeNameCursor(name: string): string {
  return encode({ n: name });
}

export function decodeNameCursor(cursor: string): string {
  const { n } = decode(cursor);
  if (typeof n !== 'string' || n === '' || n.length > 128) throw invalidCursor();
  return n;
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
