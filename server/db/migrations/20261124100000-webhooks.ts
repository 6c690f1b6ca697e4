import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Video completion webhooks (design §6, product spec §6.2):
// 1. webhook_secrets: each account's Standard Webhooks signing secret (`whsec_…`), encrypted with
//    the server secret like member credentials. After a rotation the previous secret keeps signing
//    (a second signature) until `previous_expires_at`, so receivers can switch without a gap.
// 2. webhook_deliveries: the outbox. A row is written in the same transaction that moves a video
//    task with a callback_url to `completed` or `failed`, with the exact body to send (the task's
//    lookup object at that moment), so no crash can lose a webhook and every retry sends the same
//    bytes under the same id (`webhook-id` = the row id). The leased-task columns let any instance
//    claim due deliveries with FOR UPDATE SKIP LOCKED; `retries` counts failed attempts.
// 3. webhook_attempts: one row per attempt (time, status code or error class, latency, next retry)
//    for operators.
// 4. Inserting a delivery wakes the workers of every instance, as a new task does.
const statements = [
  `create table webhook_secrets (
     account_id text primary key references accounts (id),
     secret_ciphertext bytea not null,
     previous_ciphertext bytea,
     previous_expires_at timestamptz,
     created_at timestamptz not null default now(),
     rotated_at timestamptz not null default now()
   )`,
  `create table webhook_deliveries (
     id text primary key,
     account_id text not null references accounts (id),
     task_id text not null references video_tasks (id),
     event_type text not null,
     url text not null,
     payload text not null,
     status text not null default 'pending',
     attempt integer not null default 0,
     lease_owner text,
     lease_expires_at timestamptz,
     next_run_at timestamptz not null default now(),
     retries integer not null default 0,
     last_status_code integer,
     last_error text,
     delivered_at timestamptz,
     created_at timestamptz not null default now(),
     updated_at timestamptz not null default now(),
     constraint webhook_deliveries_id_format check (id ~ '^msg_[0-9A-Za-z]+$' and char_length(id) <= 128),
     constraint webhook_deliveries_status_check check (status in ('pending', 'delivered', 'gone', 'failed')),
     constraint webhook_deliveries_event_type_check check (event_type in ('video.completed', 'video.failed')),
     constraint webhook_deliveries_attempt_check check (attempt >= 0),
     constraint webhook_deliveries_retries_check check (retries >= 0),
     constraint webhook_deliveries_task_key unique (task_id)
   )`,
  `create index webhook_deliveries_due_idx on webhook_deliveries (next_run_at) where status = 'pending'`,
  `create index webhook_deliveries_account_idx on webhook_deliveries (account_id, created_at)`,
  `create table webhook_attempts (
     id bigserial primary key,
     delivery_id text not null references webhook_deliveries (id) on delete cascade,
     attempted_at timestamptz not null default now(),
     status_code integer,
     error_class text,
     error text,
     latency_ms integer not null,
     next_retry_at timestamptz,
     constraint webhook_attempts_latency_check check (latency_ms >= 0)
   )`,
  `create index webhook_attempts_delivery_idx on webhook_attempts (delivery_id, id)`,
  `create trigger webhook_deliveries_notify after insert on webhook_deliveries
     for each row execute function mediagate_notify_task('webhook')`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
