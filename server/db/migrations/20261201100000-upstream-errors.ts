import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Errors that blame the right party (issue 27, item 1):
// 1. member_model_faults: a member the upstream told it cannot serve one model (a 404 for the
//    model or the API path: a wrong base URL or model map; later issues add "model not activated
//    on the account"). The pool skips the member for that model only, until `until` (null: until an
//    operator changes the member); the reason is shown in the member's health. Inserts and deletes
//    change what the candidate caches hold: they notify like member_health.
// 2. last_error / last_error_at on video and image tasks: the sanitized reason of the last failed
//    attempt of a task that is retried, for the operator's view (the client's lookup shows `error`
//    only once the task failed).
const statements: string[] = [
  `create table member_model_faults (
     member_id text not null constraint member_model_faults_member_fk references group_members (id) on delete cascade,
     model text not null,
     kind text not null constraint member_model_faults_kind_check check (kind in ('misconfigured', 'model_not_open')),
     reason text not null,
     until timestamptz,
     created_at timestamptz not null default now(),
     constraint member_model_faults_pkey primary key (member_id, model)
   )`,
  `create trigger member_model_faults_config_notify after insert or update or delete or truncate on member_model_faults
     for each statement execute function mediagate_notify_config()`,
  `alter table video_tasks add column last_error text, add column last_error_at timestamptz`,
  `alter table image_tasks add column last_error text, add column last_error_at timestamptz`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
