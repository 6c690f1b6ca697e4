/**
 * The one way to open a transaction: `inTransaction(db, log, fn)`. Transactions are opened by
 * services and passed down to repositories as an executor.
 *
 * Statements take their row locks in one documented order (ledger.repository.ts), so deadlocks
 * should not happen; a serialization failure or deadlock is still retried a few times as a safety
 * net, and every retry is logged, so that one showing up in the logs is investigated.
 */
import type { Kysely, Transaction } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { Executor } from './database.ts';

const RETRYABLE = new Set(['40001', '40P01']); // serialization_failure, deadlock_detected
const MAX_ATTEMPTS = 3;

export interface TransactionLogger {
  warn(obj: object, msg: string): void;
}

export async function inTransaction<T>(db: Kysely<DB>, log: TransactionLogger, fn: (trx: Transaction<DB>) => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await db.transaction().execute(fn);
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (!code || !RETRYABLE.has(code) || attempt >= MAX_ATTEMPTS) throw err;
      log.warn({ err, sqlState: code, attempt }, 'transaction conflicted; retrying (locks should be taken in the documented order)');
      await new Promise((r) => setTimeout(r, 5 * attempt + Math.random() * 20));
    }
  }
}

/**
 * `inTransaction` bound to a database and logger: what services hold instead of the database.
 * `single` is the executor for a statement that needs no transaction but goes to a repository
 * method that can also join one (so the method can take a required executor).
 */
export interface Transactor {
  run<T>(fn: (trx: Transaction<DB>) => Promise<T>): Promise<T>;
  readonly single: Executor;
}

export function createTransactor(db: Kysely<DB>, log: TransactionLogger): Transactor {
  return { run: (fn) => inTransaction(db, log, fn), single: db };
}
