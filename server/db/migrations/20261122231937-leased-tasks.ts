import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Every leased task table (video tasks, image tasks, and the webhook deliveries to come) has the
// same columns, so one repository helper claims, heartbeats, reschedules and fences them all:
//   attempt           fencing token: bumped by every claim; a worker's writes carry the attempt it claimed
//   lease_owner       the worker (or request) running the task now
//   lease_expires_at  the lease; renewed by heartbeat, free to claim again once it passed
//   next_run_at       when the task's next step is due (a claim takes due, unleased rows)
//   retries           transient failures so far; the kind's retry policy gives up after its maximum
const statements = [
  `alter table video_tasks rename column run_after to next_run_at`,
  `alter table video_tasks add column retries int not null default 0`,
  `alter table video_tasks add constraint video_tasks_retries_check check (retries >= 0)`,
  `drop index video_tasks_due_idx`,
  `create index video_tasks_due_idx on video_tasks (next_run_at) where status in ('queued', 'in_progress')`,

  `alter table image_tasks add column next_run_at timestamptz not null default now()`,
  `alter table image_tasks add column retries int not null default 0`,
  `alter table image_tasks add constraint image_tasks_retries_check check (retries >= 0)`,
  `alter table image_tasks add constraint image_tasks_attempt_check check (attempt >= 0)`,
  `drop index image_tasks_due_idx`,
  `create index image_tasks_due_idx on image_tasks (next_run_at) where status = 'processing'`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
