import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// An account's spending, counted without its row (issue 34): the settlement of a task that captures
// its whole hold (the common case: every image delivered) used to update the key's row (releasing
// nothing) and the account's (total_spent), and held both locks until its commit was flushed, so
// the tasks of one key or account settled one WAL flush at a time. Now such a settlement touches
// neither: the key's row only when credits are released, the account's only when balance comes
// back, and what it captures is added to one of 16 shard rows of the account, picked at random
// (concurrent settlements of one account mostly land on different rows and commit together).
// account.total_spent = accounts.total_spent (debits, and captures before this migration) + the sum
// of the account's shards. Only settlements write shards; they take a shard's lock after the
// account's (lock order: task, hold, key, account, shard).
const statements: string[] = [
  `create table account_spend (
     account_id text not null constraint account_spend_account_fk references accounts (id) on delete cascade,
     shard smallint not null constraint account_spend_shard_check check (shard between 0 and 15),
     spent bigint not null default 0 constraint account_spend_spent_check check (spent >= 0),
     constraint account_spend_pkey primary key (account_id, shard)
   )`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
