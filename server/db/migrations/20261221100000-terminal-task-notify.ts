import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Every instance keeps the video tasks it has read in a terminal state (completed, failed) and
// answers their polls without a database round trip (VideoService, issue 34): a terminal task's
// row changes only when retention or an operator touches it. Those changes send NOTIFY
// mediagate_config (as configuration changes do, 20261126100000-config-notify), and every instance
// drops what it keeps when it hears it. A task becoming terminal sends nothing (nobody keeps it
// yet): the hot path stays silent.
const statements = [
  `create trigger video_tasks_terminal_notify after update on video_tasks
     for each row when (old.status in ('completed', 'failed')) execute function mediagate_notify_config()`,
  `create trigger video_tasks_terminal_notify_delete after delete on video_tasks
     for each statement execute function mediagate_notify_config()`,
  // A completed task's media_expires_at is its output file's expires_at (an account's retention).
  `create trigger files_video_output_expiry_notify after update on files
     for each row when (old.purpose = 'video_output' and old.expires_at is distinct from new.expires_at)
     execute function mediagate_notify_config()`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
