import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// What an operator asks of a running gateway (issue 32, items 2-4):
// 1. task_attempts: one row per call a task made upstream (a submit to a member, including the ones
//    it failed over from; a generate; a download; a cancel; a status check that saw the job end or
//    failed): member and provider (kept: a member may be deleted later), upstream job id, outcome
//    (`ok`, `aborted`, or the error kind), the sanitized error, when it started and how long it
//    took. Written by the runners where the call happens, a synchronous image's by the statement
//    that settles it (no statement of its own on that path). A task's detail tells its story from them.
// 2. Indexes of the admin listings (GET /admin/v1/tasks, /ledger, /webhook-deliveries) and usage
//    reports, each a keyset page in (created_at, id) or id order:
//    - every task, newest first, and a created range: (created_at, id) per task table (also the
//      usage report's range scan);
//    - one key's tasks: (api_key_id, created_at, id) (one account's: the account listings' index);
//    - one member's tasks, and a provider's (its members' pages merged): (member_id, created_at, id);
//    - the unfinished ones (status filters, the deadline sweeper, the needs_attention gauge):
//      (created_at, id) over the unfinished rows only, a few thousand however old the table;
//    - ledger entries of a task, of a time range (the usage report), and the manual ones (grants
//      and debits, a needle in the holds' haystack);
//    - webhook deliveries newest first, and by state.
//    Model filters are few-valued: they read the (created_at, id) order and skip the rows of other
//    models (no index of their own, none to keep up on every insert).
const statements: string[] = [
  `create table task_attempts (
     id bigserial constraint task_attempts_pkey primary key,
     task_id text not null,
     step text not null constraint task_attempts_step_check check (step in ('submit', 'poll', 'download', 'cancel', 'generate')),
     member_id text,
     provider text,
     upstream_job_id text,
     outcome text not null,
     error text,
     started_at timestamptz not null,
     duration_ms integer not null constraint task_attempts_duration_check check (duration_ms >= 0),
     constraint task_attempts_task_id_format check (task_id ~ '^(vid|img)_[0-9A-Za-z]+$' and char_length(task_id) <= 128)
   )`,
  `create index task_attempts_task_idx on task_attempts (task_id, id)`,

  `create index video_tasks_created_idx on video_tasks (created_at, id)`,
  `create index image_tasks_created_idx on image_tasks (created_at, id)`,
  `create index video_tasks_key_created_idx on video_tasks (api_key_id, created_at, id)`,
  `create index image_tasks_key_created_idx on image_tasks (api_key_id, created_at, id)`,
  `create index video_tasks_member_created_idx on video_tasks (member_id, created_at, id) where member_id is not null`,
  `create index image_tasks_member_created_idx on image_tasks (member_id, created_at, id) where member_id is not null`,
  `create index video_tasks_unfinished_created_idx on video_tasks (created_at, id) where status in ('queued', 'in_progress')`,
  `create index image_tasks_unfinished_created_idx on image_tasks (created_at, id) where status in ('processing', 'needs_attention')`,

  `create index ledger_entries_task_idx on ledger_entries (task_id, id) where task_id is not null`,
  `create index ledger_entries_created_idx on ledger_entries (created_at)`,
  `create index ledger_entries_manual_idx on ledger_entries (id) where kind in ('grant', 'debit')`,

  `create index webhook_deliveries_created_idx on webhook_deliveries (created_at, id)`,
  `create index webhook_deliveries_status_created_idx on webhook_deliveries (status, created_at, id)`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
