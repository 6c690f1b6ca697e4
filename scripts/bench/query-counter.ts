/**
 * Counts the SQL statements this process sends, by wrapping pg.Client.prototype.query (every
 * pg.Pool of the process, Kysely's included, goes through it). Statements are grouped by their
 * first words, so the report shows what each request executes.
 *
 * The load generator resets the counts while no request is in flight (between warm-up and the
 * measured window) and reports only once every measured request has completed, so statements per
 * request are exact. (Not AsyncLocalStorage: its promise hooks would slow the app down.)
 */
import pg from 'pg';

const counts = new Map<string, number>();
let requests = 0;
let installed = false;

/** Counts one HTTP request (servers call it for each request they receive). */
export function countRequest(): void {
  requests++;
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
    if (text !== undefined) {
      const key = label(text);
      counts.set(key, (counts.get(key) ?? 0) + 1);
    }
    return original.apply(this, args);
  } as typeof pg.Client.prototype.query;
}

export function resetQueryCounts(): void {
  counts.clear();
  requests = 0;
}

export interface QueryCounts {
  total: number;
  /** HTTP requests received since the reset. */
  requests: number;
  /** Statement label -> count, most frequent first. */
  statements: [string, number][];
}

export function queryCounts(): QueryCounts {
  const statements = [...counts.entries()].sort((a, b) => b[1] - a[1]);
  return { total: statements.reduce((n, [, c]) => n + c, 0), requests, statements };
}

/** "SQL: 1.00 statements per operation" and every statement with its count per operation. */
export function formatQueryCounts(q: QueryCounts, ops: number): string {
  if (ops === 0) return '  SQL: (no operations)';
  const lines = [`  SQL: ${(q.total / ops).toFixed(2)} statements per operation (${q.total} for ${ops})`];
  for (const [text, n] of q.statements) lines.push(`    ${(n / ops).toFixed(3).padStart(7)}  (${n}x)  ${text}`);
  return lines.join('\n');
}
