import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// The account pool (design §8), shared by every instance:
// 1. group_members.model_map: catalog model id -> the upstream's model id (`image-pro` sold, the
//    upstream calls it `gpt-image-1.5`); a model missing from the map goes upstream under its own id.
// 2. member_health: what the pool learned about a member from its answers. `cooldown_until` keeps
//    new work away (429 Retry-After or backoff, or an open circuit after repeated 5xx/timeouts);
//    `credentials_rejected_at` (401/403) keeps it away until an admin changes the member; recent
//    counts restart every hour (`window_started_at`).
// 3. In-flight work is not a counter: a member's slots are the active task rows that name it
//    (video tasks from submit to a terminal state, image tasks while their upstream call runs), so a
//    crashed process can never leak one. The partial indexes make that count cheap.
const statements = [
  `alter table group_members add column model_map jsonb not null default '{}'::jsonb
     constraint group_members_model_map_check check (jsonb_typeof(model_map) = 'object')`,
  `create table member_health (
     member_id text primary key references group_members (id) on delete cascade,
     cooldown_until timestamptz,
     cooldown_reason text,
     rate_limit_strikes integer not null default 0,
     consecutive_failures integer not null default 0,
     credentials_rejected_at timestamptz,
     last_error text,
     last_error_at timestamptz,
     last_success_at timestamptz,
     window_started_at timestamptz not null default now(),
     successes integer not null default 0,
     failures integer not null default 0,
     updated_at timestamptz not null default now(),
     constraint member_health_cooldown_reason_check check (cooldown_reason in ('rate_limited', 'quota_exhausted', 'circuit_open'))
   )`,
  `create index video_tasks_member_in_flight_idx on video_tasks (member_id) where member_id is not null and status in ('queued', 'in_progress')`,
  `create index image_tasks_member_in_flight_idx on image_tasks (member_id) where member_id is not null and status = 'processing'`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
