import { CamelCasePlugin, Kysely, PostgresDialect, type Transaction } from 'kysely';
import pg from 'pg';
import type { DB } from '../../generated/db.d.ts';
import { preparingClient } from './prepared.ts';
import { StorageError } from '../storage/storage-error.ts';

/**
 * What a repository method runs on. Methods that must be part of a caller's transaction take a
 * required `Executor` (or `Transaction<DB>`) parameter; they never default to the pool.
 */
export type Executor = Kysely<DB> | Transaction<DB>;

/** Minimal logger the database layer needs; a pino logger fits. */
export interface DbLogger {
  info(msg: string): void;
  warn(msg: string): void;
}

const INT8_OID = 20;
const NUMERIC_OID = 1700;

/**
 * int8 decision: money is integer micro-credits (1 credit = 1,000,000) in `bigint` columns, and
 * pg returns int8 as a string by default. We parse int8 to a JS `number`, not `bigint` or string:
 * a Number holds every integer up to 2^53 − 1 exactly, i.e. ~9 billion credits, far above any
 * balance, and `number` keeps arithmetic, JSON and the generated types simple. A value outside
 * that range throws instead of silently losing precision.
 */
export function parseInt8(value: string): number {
  const n = Number(value);
  if (!Number.isSafeInteger(n)) throw new RangeError(`int8 value ${value} is outside Number.MAX_SAFE_INTEGER`);
  return n;
}

/**
 * numeric: `sum(bigint)` returns numeric, so integer-valued numerics follow the int8 rule (exact
 * or throw). Fractional values (e.g. `avg`) become plain numbers; money never has fractions.
 */
export function parseNumeric(value: string): number {
  if (/^-?\d+$/.test(value)) return parseInt8(value);
  return Number(value);
}

// Per-pool parsers (the `types` option) instead of mutating the global pg.types, so other pg users
// in the process (tools, tests) are unaffected.
const typeParsers: pg.CustomTypesConfig = {
  getTypeParser: (oid, format) => {
    if (format !== 'binary' && oid === INT8_OID) return parseInt8;
    if (format !== 'binary' && oid === NUMERIC_OID) return parseNumeric;
    return pg.types.getTypeParser(oid, format);
  },
};

export interface CreateDatabaseOptions {
  /** Pool size (pg default 10). */
  max?: number;
  /** Shown in pg_stat_activity; helps tell API instances, workers and scripts apart. */
  applicationName?: string;
  /**
   * Errors of pooled connections, idle or checked out (the server restarted or crashed, the
   * network dropped): pg drops such a client itself; this only hears about it.
   */
  onConnectionError?: (err: Error) => void;
  /** How long getting a connection may take (connect, or wait for a free one) before it fails (default 10 s). */
  connectTimeoutMs?: number;
  /** Called for every statement Kysely runs (a metrics counter). */
  onQuery?: () => void;
  /** Run statements marked with `prepared()` as named prepared statements (default true; see prepared.ts). */
  preparedStatements?: boolean;
}

/**
 * SQLSTATE classes and codes that mean the session or the server is gone, or the server cannot do
 * any work now, not that the statement was wrong: connection_exception; insufficient_resources
 * (53: its disk is full, out of memory, too many connections); admin_shutdown, crash_shutdown,
 * cannot_connect_now, database_dropped.
 */
const CONNECTION_LOST = /^(08|53[123]00|57P0[1-4])/;
const SOCKET_ERRORS = new Set(['ECONNREFUSED', 'ECONNRESET', 'ECONNABORTED', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN']);
/** node-postgres' own messages for a connection that broke or could not be made (pg and pg-pool 8.x). */
const PG_CONNECTION_MESSAGES = /^(Connection terminated|Client has encountered a connection error and is not queryable|Client was closed and is not queryable|timeout exceeded when trying to connect)/;

/**
 * Whether `err` says the database cannot be reached right now (down, restarting, crashed, the
 * network), as opposed to an error of the statement: a request that meets it is answered with a
 * retryable 503, and a task step that meets it is simply resumed later (the database is not the
 * task's fault). A FATAL error always ends the session, so it counts too.
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  // The media store's failures carry its socket's code and call too (an S3 endpoint refusing
  // connections: ECONNREFUSED): they are the store's, with their own answer (503 storage_unavailable).
  if (typeof err !== 'object' || err === null || err instanceof StorageError) return false;
  const e = err as { code?: unknown; severity?: unknown; syscall?: unknown; message?: unknown };
  if (typeof e.severity === 'string') return e.severity === 'FATAL' || e.severity === 'PANIC' || (typeof e.code === 'string' && CONNECTION_LOST.test(e.code));
  if (typeof e.code === 'string' && typeof e.syscall === 'string') return SOCKET_ERRORS.has(e.code);
  return typeof e.message === 'string' && PG_CONNECTION_MESSAGES.test(e.message);
}

/** A Kysely instance over its own pg.Pool; callers own it and call `destroy()` when done. */
export function createDatabase(url: string, opts: CreateDatabaseOptions = {}): Kysely<DB> {
  const pool = new pg.Pool({
    connectionString: url,
    max: opts.max ?? 10,
    application_name: opts.applicationName ?? 'mediagate',
    types: typeParsers,
    connectionTimeoutMillis: opts.connectTimeoutMs ?? 10_000,
  });
  // An 'error' event without a listener kills the process. pg-pool listens on idle clients only
  // (and re-emits on the pool); a client checked out by a transaction or a running statement
  // emits on itself when its server goes away (`Client._handleErrorEvent`), so every client gets
  // a listener of its own for its whole life. The statement in flight fails with the error
  // anyway, and the pool drops the broken client when it is released.
  const onError = (err: Error) => opts.onConnectionError?.(err);
  pool.on('error', () => undefined); // the client's own listener below has reported it
  pool.on('connect', (client) => {
    client.on('error', onError);
    if (opts.preparedStatements !== false) preparingClient(client);
  });
  const onQuery = opts.onQuery;
  return new Kysely<DB>({ dialect: new PostgresDialect({ pool }), plugins: [new CamelCasePlugin()], log: onQuery ? () => onQuery() : undefined });
}
