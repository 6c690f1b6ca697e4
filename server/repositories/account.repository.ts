/** All Kysely code for accounts, their manual ledger entries and the idempotency keys of those. Returns rows or undefined. */
import { sql, type Kysely, type Selectable } from 'kysely';
import type { Accounts, DB } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';

export type AccountRow = Selectable<Accounts>;

export interface LedgerEntryRow {
  id: number;
  kind: string;
  amount: number;
  accountId: string;
  apiKeyId: string | null;
  taskId: string | null;
  holdId: string | null;
  reason: string | null;
  createdAt: Date;
}

/** An idempotency key of an account's credit adjustments: what it was first used for (amount signed, micro-credits). */
export interface AdjustmentKeyRow {
  amount: number;
  reason: string;
  ledgerEntryId: number;
}

const LEDGER_ENTRY_COLUMNS = ['id', 'kind', 'amount', 'accountId', 'apiKeyId', 'taskId', 'holdId', 'reason', 'createdAt'] as const;

/** Keyset position of a newest-first listing: created_at in epoch microseconds (exact), then id. */
export interface CreatedAtPosition {
  createdAtMicros: number;
  id: string;
}

/**
 * An account's total_spent: its row's column (admin debits, and captures settled before the spend
 * shards) plus its spend shards (what settlements captured since: migration spend-shards). `table`
 * is the name or alias the accounts row goes by in the query.
 */
export function totalSpentOf(table: string) {
  return sql<number>`(${sql.ref(`${table}.total_spent`)} + coalesce((select sum(sp.spent) from account_spend sp where sp.account_id = ${sql.ref(`${table}.id`)}), 0))::bigint`;
}

const ACCOUNT_COLUMNS = [
  'id',
  'name',
  'status',
  'balance',
  'totalEarned',
  totalSpentOf('accounts').as('totalSpent'),
  'outputRetentionDays',
  'inputRetentionDays',
  'requestsPerMinute',
  'maxInFlight',
  'createdAt',
  'updatedAt',
] as const;

/** `created_at` as integer epoch microseconds: JS Dates keep only milliseconds, which would skip rows on a page boundary. */
export const createdAtMicros = (column: string) => sql<number>`(extract(epoch from ${sql.ref(column)}) * 1000000)::bigint`;
export const microsToTimestamp = (micros: number) => sql<Date>`(timestamptz 'epoch' + ${micros} * interval '1 microsecond')`;

export class AccountRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /** Inserts an account; undefined when the name is taken. */
  insert(values: { id: string; name: string; status: string; balance: number; requestsPerMinute?: number | null; maxInFlight?: number | null }, trx: Executor): Promise<AccountRow | undefined> {
    return trx
      .insertInto('accounts')
      .values({
        id: values.id,
        name: values.name,
        status: values.status,
        balance: values.balance,
        totalEarned: values.balance,
        requestsPerMinute: values.requestsPerMinute,
        maxInFlight: values.maxInFlight,
      })
      .onConflict((oc) => oc.constraint('accounts_name_key').doNothing())
      .returning(ACCOUNT_COLUMNS)
      .executeTakeFirst();
  }

  findById(id: string): Promise<AccountRow | undefined> {
    return this.db.selectFrom('accounts').select(ACCOUNT_COLUMNS).where('id', '=', id).executeTakeFirst();
  }

  findByName(name: string): Promise<AccountRow | undefined> {
    return this.db.selectFrom('accounts').select(ACCOUNT_COLUMNS).where('name', '=', name).executeTakeFirst();
  }

  /** Newest first; `limit + 1` rows tell the caller whether another page follows. */
  list(opts: { limit: number; status?: string; after?: CreatedAtPosition }): Promise<(AccountRow & { createdAtMicros: number })[]> {
    let query = this.db
      .selectFrom('accounts')
      .select([...ACCOUNT_COLUMNS, createdAtMicros('createdAt').as('createdAtMicros')])
      .orderBy('createdAt', 'desc')
      .orderBy('id', 'desc')
      .limit(opts.limit);
    if (opts.status !== undefined) query = query.where('status', '=', opts.status);
    if (opts.after) {
      const { createdAtMicros: micros, id } = opts.after;
      query = query.where(sql<boolean>`(created_at, id) < (${microsToTimestamp(micros)}, ${id})`);
    }
    return query.execute();
  }

  update(
    id: string,
    patch: { name?: string; status?: string; outputRetentionDays?: number | null; inputRetentionDays?: number | null; requestsPerMinute?: number | null; maxInFlight?: number | null },
  ): Promise<AccountRow | undefined> {
    return this.db.updateTable('accounts').set(patch).where('id', '=', id).returning(ACCOUNT_COLUMNS).executeTakeFirst();
  }

  /**
   * Guarded grant: adds micro-credits to balance and total_earned, or returns undefined when the
   * account is missing or either would pass Number.MAX_SAFE_INTEGER, the most an int8 read back as
   * a number holds exactly (db/database.ts). The guard is the UPDATE's, so concurrent grants cannot
   * pass it together.
   */
  grant(id: string, amount: number, trx: Executor): Promise<AccountRow | undefined> {
    const room = Number.MAX_SAFE_INTEGER - amount;
    return trx
      .updateTable('accounts')
      .set((eb) => ({ balance: eb('balance', '+', amount), totalEarned: eb('totalEarned', '+', amount) }))
      .where('id', '=', id)
      .where('balance', '<=', room)
      .where('totalEarned', '<=', room)
      .returning(ACCOUNT_COLUMNS)
      .executeTakeFirst();
  }

  /** Guarded debit: undefined when the account is missing or its balance is below `amount`. */
  debit(id: string, amount: number, trx: Executor): Promise<AccountRow | undefined> {
    return trx
      .updateTable('accounts')
      .set((eb) => ({ balance: eb('balance', '-', amount), totalSpent: eb('totalSpent', '+', amount) }))
      .where('id', '=', id)
      .where('balance', '>=', amount)
      .returning(ACCOUNT_COLUMNS)
      .executeTakeFirst();
  }

  /**
   * Appends a grant or debit entry (positive amount; the kind gives the direction). `id`: the one a
   * claimed idempotency key drew for it (`claimAdjustmentKey`), else the ledger's next.
   */
  insertLedgerEntry(values: { id?: number; accountId: string; kind: 'grant' | 'debit'; amount: number; reason: string }, trx: Executor): Promise<LedgerEntryRow> {
    return trx.insertInto('ledgerEntries').values(values).returning(LEDGER_ENTRY_COLUMNS).executeTakeFirstOrThrow();
  }

  findLedgerEntry(id: number, trx: Executor): Promise<LedgerEntryRow | undefined> {
    return trx.selectFrom('ledgerEntries').select(LEDGER_ENTRY_COLUMNS).where('id', '=', id).executeTakeFirst();
  }

  /**
   * Claims an idempotency key of the account for one adjustment (amount signed, micro-credits) and
   * draws the id of the ledger entry it will write: the id, or undefined when the account does not
   * exist or already has the key. A claim of a key another transaction claimed and has not ended
   * waits for it on the primary key: undefined once it commits, the claim once it rolls back.
   * Call it first in the adjustment's transaction, before the account's row is locked.
   */
  async claimAdjustmentKey(values: { accountId: string; idempotencyKey: string; amount: number; reason: string }, trx: Executor): Promise<number | undefined> {
    const row = await trx
      .insertInto('creditAdjustmentKeys')
      .columns(['accountId', 'idempotencyKey', 'amount', 'reason', 'ledgerEntryId'])
      .expression((eb) =>
        eb
          .selectFrom('accounts')
          .select([
            'id',
            sql<string>`${values.idempotencyKey}::text`.as('idempotencyKey'),
            sql<number>`${values.amount}::bigint`.as('amount'),
            sql<string>`${values.reason}::text`.as('reason'),
            // Drawn here so the row names its entry from the start (migration credit-adjustment-keys).
            sql<number>`nextval(pg_get_serial_sequence('ledger_entries', 'id'))`.as('ledgerEntryId'),
          ])
          .where('id', '=', values.accountId),
      )
      .onConflict((oc) => oc.constraint('credit_adjustment_keys_pkey').doNothing())
      .returning('ledgerEntryId')
      .executeTakeFirst();
    return row?.ledgerEntryId;
  }

  /** What the account's idempotency key was first used for; undefined when the account never used it. */
  findAdjustmentKey(accountId: string, idempotencyKey: string, trx: Executor): Promise<AdjustmentKeyRow | undefined> {
    return trx
      .selectFrom('creditAdjustmentKeys')
      .select(['amount', 'reason', 'ledgerEntryId'])
      .where('accountId', '=', accountId)
      .where('idempotencyKey', '=', idempotencyKey)
      .executeTakeFirst();
  }
}
