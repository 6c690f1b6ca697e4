import { CamelCasePlugin, Kysely, PostgresDialect, type Transaction } from 'kysely';
import pg from 'pg';
import type { DB } from '../../generated/db.d.ts';
import { preparingClient } from './prepared.ts';

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
  /** Errors of idle pooled connections (server restart, network); pg drops the client itself. */
  onPoolError?: (err: Error) => void;
  /** Called for every statement Kysely runs (a metrics counter). */
  onQuery?: () => void;
  /** Run statements marked with `prepared()` as named prepared statements (default true; see prepared.ts). */
  preparedStatements?: boolean;
}

/** A Kysely instance over its own pg.Pool; callers own it and call `destroy()` when done. */
export function createDatabase(url: string, opts: CreateDatabaseOptions = {}): Kysely<DB> {
  const pool = new pg.Pool({
    connectionString: url,
    max: opts.max ?? 10,
    application_name: opts.applicationName ?? 'mediagate',
    types: typeParsers,
  });
  // Without a listener an idle connection error would crash the process.
  pool.on('error', (err) => opts.onPoolError?.(err));
  if (opts.preparedStatements !== false) pool.on('connect', preparingClient);
  const onQuery = opts.onQuery;
  return new Kysely<DB>({ dialect: new PostgresDialect({ pool }), plugins: [new CamelCasePlugin()], log: onQuery ? () => onQuery() : undefined });
}
