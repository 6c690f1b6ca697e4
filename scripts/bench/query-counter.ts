/**
 * Counts the SQL statements this process sends, by wrapping pg.Client.prototype.query (every
 * pg.Pool of the process, Kysely's included, goes through it). Statements are grouped by their
 * first words, so the report shows what each request executes.
 *
 * HTTP requests run inside `inRequestScope`, so a statement is attributed to the request that sent
 * it: after `resetQueryCounts()`, statements of requests that started before the reset are not
 * counted, and `queryCounts().requests` is the number of requests started since. Per-request
 * figures are then exact, not skewed by the requests in flight when the window opens.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import pg from 'pg';

const counts = new Map<string, number>();
const scope = new AsyncLocalStorage<{ epoch: number }>();
let epoch = 0;
let requests = 0;
let unscoped = 0;
let installed = false;

/** Runs an HTTP request handler so that its statements are attributed to it. */
export function inRequestScope(fn: () => void): void {
  requests++;
  scope.run({ epoch }, fn);
}

function label(text: string): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  return flat.length > 90 ? `${flat.slice(0, 87)}...` : flat;
}

export function installQueryCounter(): void {
  if (installed) return;
  installed = true;
  const original = pg.Client.prototype.query as (...args: unknown[]) => unknown;
  pg.Client.prototype.query = function countedQuery(this: pg.Client, ...args: unknown[]) {
    const first = args[0];
    const text = typeof first === 'string' ? first : (first as { text?: string } | undefined)?.text;
    const request = scope.getStore();
    if (text !== undefined && (request === undefined || request.epoch === epoch)) {
      const key = label(text);
      counts.set(key, (counts.get(key) ?? 0) + 1);
      if (request === undefined) unscoped++;
    }
    return original.apply(this, args);
  } as typeof pg.Client.prototype.query;
}

export function resetQueryCounts(): void {
  counts.clear();
  epoch++;
  requests = 0;
  unscoped = 0;
}

export interface QueryCounts {
  total: number;
  /** HTTP requests started since the reset. */
  requests: number;
  /** Statements sent outside any HTTP request (background work, or the hold scenario). */
  unscoped: number;
  /** Statement label -> count, most frequent first. */
  statements: [string, number][];
}

export function queryCounts(): QueryCounts {
  const statements = [...counts.entries()].sort((a, b) => b[1] - a[1]);
  return { total: statements.reduce((n, [, c]) => n + c, 0), requests, unscoped, statements };
}

/** "SQL: 1.00 statements per operation" and every statement with its count per operation. */
export function formatQueryCounts(q: QueryCounts, ops: number): string {
  if (ops === 0) return '  SQL: (no operations)';
  const lines = [`  SQL: ${(q.total / ops).toFixed(2)} statements per operation (${q.total} for ${ops})`];
  for (const [text, n] of q.statements) lines.push(`    ${(n / ops).toFixed(3).padStart(7)}  (${n}x)  ${text}`);
  if (q.requests > 0 && q.unscoped > 0) lines.push(`    (${q.unscoped} of these ran outside any request)`);
  return lines.join('\n');
}
