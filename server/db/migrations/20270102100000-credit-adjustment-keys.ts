import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Idempotent operator credit adjustments (POST /admin/v1/accounts/{id}/credits `idempotency_key`,
// `accounts credit --idempotency-key`): a grant or debit retried after a lost answer (a commit
// whose answer a dropped connection lost is `503 database_unavailable`), a console button clicked
// again or a billing script's retry on 5xx was applied twice. One row per key used on an account,
// kept forever: the adjustment's signed amount (micro-credits) and reason, to tell a retry from a
// different request under the same key, and the ledger entry it wrote, to answer the retry with.
//
// The adjustment claims its row first in its transaction: a twin sent at the same time waits on
// the primary key for the first's commit, then finds the row; a first that rolled back (a debit
// beyond the balance) left no row, so the retry applies.
//
// A new table, not a column of ledger_entries: no lock or index build on that hot table. For the
// same reason ledger_entry_id has no foreign key (one would lock ledger_entries while it is
// added); the adjustment draws the entry's id from the ledger's own sequence in the claim and
// inserts the entry with it in the same transaction, and ledger entries are never deleted
// (append-only trigger), so the id always names the entry.
const statements: string[] = [
  `create table credit_adjustment_keys (
     account_id text not null constraint credit_adjustment_keys_account_fk references accounts (id),
     idempotency_key text not null constraint credit_adjustment_keys_key_length check (char_length(idempotency_key) between 1 and 255),
     amount bigint not null constraint credit_adjustment_keys_amount_nonzero check (amount <> 0),
     reason text not null,
     ledger_entry_id bigint not null constraint credit_adjustment_keys_ledger_entry_key unique,
     created_at timestamptz not null default now(),
     constraint credit_adjustment_keys_pkey primary key (account_id, idempotency_key)
   )`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
