import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// 1. Any instance starts a new task at once: inserting a task that no process holds yet sends
//    NOTIFY mediagate_tasks with the kind ('video' | 'image'); every worker process LISTENs
//    (workers/task-listener.ts). Synchronous image tasks are inserted already leased by their API
//    process, so they wake nobody. Notifications are delivered at commit, deduplicated per
//    transaction; the periodic claim stays the fallback.
// 2. video_tasks.submit_started_at: set (fenced) right before a job is sent upstream and kept until
//    the job id is saved, so a step that finds it set without a job id knows an earlier submit may
//    have reached the upstream (a crash in between) and says so instead of resubmitting silently.
const statements = [
  `create function mediagate_notify_task() returns trigger language plpgsql as $$
   begin
     perform pg_notify('mediagate_tasks', tg_argv[0]);
     return null;
   end $$`,
  `create trigger video_tasks_notify after insert on video_tasks
     for each row when (new.lease_owner is null) execute function mediagate_notify_task('video')`,
  `create trigger image_tasks_notify after insert on image_tasks
     for each row when (new.lease_owner is null) execute function mediagate_notify_task('image')`,
  `alter table video_tasks add column submit_started_at timestamptz`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
