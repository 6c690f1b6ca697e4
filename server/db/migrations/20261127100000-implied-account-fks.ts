import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// A credit hold, an image task and a video task each name their API key together with their
// account, and a composite foreign key to api_keys (id, account_id) already requires that pair to
// exist, while api_keys.account_id references accounts: the account exists whenever the composite
// key holds. Their own foreign keys to accounts checked it a second time on every hold (an index
// lookup and a row lock each, about 0.06 ms of the hold statement). Ledger entries keep theirs:
// grants and debits have no key.
const statements = [
  `alter table credit_holds drop constraint credit_holds_account_fk`,
  `alter table image_tasks drop constraint image_tasks_account_id_fkey`,
  `alter table video_tasks drop constraint video_tasks_account_id_fkey`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
