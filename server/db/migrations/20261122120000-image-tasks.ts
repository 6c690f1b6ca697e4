import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Image tasks (product spec §2.4, §3.1). Every image request creates one. A synchronous request
// holds the task's lease while it renders; `Prefer: respond-async` tasks are claimed by the task
// engine like video tasks; a task whose lease expired (its process died) is resumed by the engine.
// `needs_attention`: the upstream outcome is unknown (it produced images that could not be stored),
// so the credits stay held until an operator settles the task as completed or refunded.
const statements = [
  `create table image_tasks (
     id text primary key,
     account_id text not null references accounts (id),
     api_key_id text not null,
     group_id text not null references backend_groups (id),
     operation text not null,
     model text not null,
     prompt text not null,
     -- The normalized request: size, format, quality, n, response format, … (never image bytes).
     params jsonb not null,
     input_file_ids text[] not null default '{}',
     mask_file_id text references files (id),
     n int not null,
     unit_price bigint not null,
     quoted_credits bigint not null,
     actual_credits bigint not null default 0,
     delivered int not null default 0,
     status text not null default 'processing',
     error_code text,
     error_message text,
     result_file_ids text[] not null default '{}',
     revised_prompt text,
     run_async boolean not null default false,
     attempt int not null default 0,
     lease_owner text,
     lease_expires_at timestamptz,
     member_id text,
     settled_reason text,
     created_at timestamptz not null default now(),
     updated_at timestamptz not null default now(),
     completed_at timestamptz,
     constraint image_tasks_id_format check (id ~ '^img_[0-9A-Za-z]+$' and char_length(id) <= 128),
     constraint image_tasks_api_key_fk foreign key (api_key_id, account_id) references api_keys (id, account_id),
     constraint image_tasks_operation_check check (operation in ('generation', 'edit')),
     constraint image_tasks_status_check check (status in ('processing', 'needs_attention', 'completed', 'failed')),
     constraint image_tasks_n_check check (n between 1 and 10),
     constraint image_tasks_delivered_check check (delivered between 0 and n),
     constraint image_tasks_price_check check (unit_price >= 0 and quoted_credits = unit_price * n),
     constraint image_tasks_actual_check check (actual_credits between 0 and quoted_credits),
     constraint image_tasks_completed_check check ((status in ('completed', 'failed')) = (completed_at is not null)),
     -- No "completed needs results" check: an operator may settle a needs_attention task as
     -- completed after delivering its results out of band.
     constraint image_tasks_failed_check check (status <> 'failed' or error_message is not null)
   )`,
  `create index image_tasks_due_idx on image_tasks (lease_expires_at nulls first) where status = 'processing'`,
  `create index image_tasks_account_id_idx on image_tasks (account_id, created_at)`,
  `create function image_tasks_guard() returns trigger language plpgsql as $$
   begin
     if new.unit_price <> old.unit_price or new.quoted_credits <> old.quoted_credits or new.n <> old.n
        or new.account_id <> old.account_id or new.model <> old.model then
       raise exception 'image task %: the request and its price are immutable', old.id using errcode = 'P0001';
     end if;
     if old.status in ('completed', 'failed') and new.status <> old.status then
       raise exception 'image task % is already %', old.id, old.status using errcode = 'P0001';
     end if;
     new.updated_at := now();
     return new;
   end $$`,
  `create trigger image_tasks_guard before update on image_tasks
     for each row execute function image_tasks_guard()`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
