import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Media retention (issue 29):
// 1. accounts.output_retention_days / input_retention_days: an account's own periods (null: the
//    operator's defaults, OUTPUT_RETENTION_DAYS and INPUT_RETENTION_DAYS). Files get their
//    expires_at from them when they are written (outputs) or adopted by a task (inputs), and the
//    media sweeper removes what has expired.
// 2. sweepers: one row per periodic job that must run on one instance at a time (a lease any
//    instance may take once it runs out), with the job's place in a walk over the store (cursor).
// 3. files_created_at_idx: the check for rows whose bytes never landed walks recent rows by time.
// 4. Files written before retention existed (outputs and adopted inputs, kept forever until now) get
//    the default periods from their creation (30 days for outputs, 7 for inputs), and at least 7
//    days from this upgrade: nothing disappears the minute an operator upgrades.
// The statements run in an order that takes the strongest locks last (changed after release: the
// same statements, the same schema). Each lock is held until the commit, and instances of the
// previous version keep serving during an upgrade: the ACCESS EXCLUSIVE lock on accounts taken
// first stopped every API key lookup for the whole rewrite of files (about 30 s at 2 million rows),
// and the SHARE lock of the index build stopped writes of files for it too.
const statements: string[] = [
  `create table sweepers (
     name text constraint sweepers_pkey primary key,
     owner text,
     lease_until timestamptz,
     cursor text,
     updated_at timestamptz not null default now()
   )`,
  `update files set expires_at = greatest(created_at + interval '30 days', now() + interval '7 days')
     where expires_at is null and purpose in ('image_output', 'video_output')`,
  `update files set expires_at = greatest(created_at + interval '7 days', now() + interval '7 days')
     where expires_at is null and purpose = 'input'`,
  `create index files_created_at_idx on files (created_at, id)`,
  `alter table accounts
     add column output_retention_days integer constraint accounts_output_retention_days_check check (output_retention_days between 1 and 36500),
     add column input_retention_days integer constraint accounts_input_retention_days_check check (input_retention_days between 1 and 36500)`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
