import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Media files (design §7) and video tasks (design §6). A task is claimed by a worker with a short
// `FOR UPDATE SKIP LOCKED` transaction that bumps `attempt` and sets a lease; every later write of
// that worker is fenced by `attempt`, so a worker whose lease expired cannot overwrite a newer one.
const statements = [
  // Raises from inside a single statement so that the whole statement rolls back (used by the
  // one-statement credit hold: a key reservation without the account's must not survive).
  `create function mg_abort(reason text) returns text language plpgsql volatile as $$
   begin
     raise exception '%', reason using errcode = 'MG001';
   end $$`,
  `create table files (
     id text primary key,
     account_id text not null references accounts (id),
     purpose text not null,
     content_type text not null,
     bytes bigint not null,
     storage_key text not null unique,
     width int,
     height int,
     task_id text,
     created_at timestamptz not null default now(),
     constraint files_id_format check (id ~ '^file_[0-9A-Za-z]+$' and char_length(id) <= 128),
     constraint files_purpose_check check (purpose in ('image_output', 'video_output', 'input')),
     constraint files_bytes_check check (bytes >= 0)
   )`,
  `create index files_account_id_idx on files (account_id, created_at)`,

  `create table video_tasks (
     id text primary key,
     account_id text not null references accounts (id),
     api_key_id text not null,
     group_id text not null references backend_groups (id),
     client_request_id text not null,
     model text not null,
     prompt text not null,
     negative_prompt text,
     duration_seconds int not null,
     aspect_ratio text not null,
     resolution text not null,
     generate_audio boolean not null,
     input_mode text not null,
     input_file_ids text[] not null default '{}',
     reference_videos text[] not null default '{}',
     reference_audios text[] not null default '{}',
     callback_url text,
     -- Billing snapshot (immutable after insert, enforced by trigger below). Legacy rows have no
     -- unit price or quote: nothing is invented for them.
     billing_kind text not null default 'snapshot',
     billing_mode text,
     unit_price bigint,
     quoted_credits bigint,
     actual_credits bigint not null default 0,
     status text not null default 'queued',
     error_code text,
     error_message text,
     attempt int not null default 0,
     lease_owner text,
     lease_expires_at timestamptz,
     run_after timestamptz not null default now(),
     deadline_at timestamptz not null,
     member_id text,
     upstream_job_id text,
     output_file_id text references files (id),
     created_at timestamptz not null default now(),
     updated_at timestamptz not null default now(),
     started_at timestamptz,
     completed_at timestamptz,
     constraint video_tasks_id_format check (id ~ '^vid_[0-9A-Za-z]+$' and char_length(id) <= 128),
     constraint video_tasks_api_key_fk foreign key (api_key_id, account_id) references api_keys (id, account_id),
     constraint video_tasks_client_request_id_key unique (account_id, client_request_id),
     constraint video_tasks_client_request_id_length check (char_length(client_request_id) between 1 and 128),
     constraint video_tasks_duration_check check (duration_seconds > 0),
     constraint video_tasks_status_check check (status in ('queued', 'in_progress', 'completed', 'failed')),
     constraint video_tasks_input_mode_check check (input_mode in ('text', 'first_frame', 'first_and_last_frame', 'reference_images')),
     constraint video_tasks_billing_kind_check check (billing_kind in ('snapshot', 'legacy')),
     constraint video_tasks_billing_snapshot_check check (
       billing_kind = 'legacy'
       or (billing_mode in ('per_second', 'per_item') and unit_price >= 0 and quoted_credits >= 0)),
     constraint video_tasks_actual_credits_check check (actual_credits >= 0 and (quoted_credits is null or actual_credits <= quoted_credits)),
     constraint video_tasks_completed_check check ((status in ('completed', 'failed')) = (completed_at is not null)),
     constraint video_tasks_output_check check (status <> 'completed' or output_file_id is not null),
     constraint video_tasks_failed_check check (status <> 'failed' or error_message is not null),
     constraint video_tasks_attempt_check check (attempt >= 0)
   )`,
  // The claim query: due, unfinished tasks.
  `create index video_tasks_due_idx on video_tasks (run_after) where status in ('queued', 'in_progress')`,
  `create index video_tasks_account_id_idx on video_tasks (account_id, created_at)`,

  // The billing snapshot and the request are immutable; finished tasks stay finished.
  `create function video_tasks_guard() returns trigger language plpgsql as $$
   begin
     if new.billing_kind is distinct from old.billing_kind or new.billing_mode is distinct from old.billing_mode
        or new.unit_price is distinct from old.unit_price or new.quoted_credits is distinct from old.quoted_credits
        or new.duration_seconds <> old.duration_seconds or new.model <> old.model or new.resolution <> old.resolution
        or new.account_id <> old.account_id or new.client_request_id <> old.client_request_id then
       raise exception 'video task %: the request and billing snapshot are immutable', old.id using errcode = 'P0001';
     end if;
     if old.status in ('completed', 'failed') and new.status <> old.status then
       raise exception 'video task % is already %', old.id, old.status using errcode = 'P0001';
     end if;
     new.updated_at := now();
     return new;
   end $$`,
  `create trigger video_tasks_guard before update on video_tasks
     for each row execute function video_tasks_guard()`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
