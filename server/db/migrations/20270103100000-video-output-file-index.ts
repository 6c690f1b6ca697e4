import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// video_tasks.output_file_id references files (video-tasks-files migration) with no index: every
// statement that deletes files rows (a client's DELETE, the media sweeper's expiry batches and
// unlanded rows, discarded outputs) checked the foreign key by reading all of video_tasks, which is
// never deleted from. At 300,000 video tasks one sweeper batch of 100 files took 36 s (28 ms with
// the index): retention fell behind, a stop during a batch outlasted its grace, and migrations that
// needed a lock on files kept missing it. Only completed videos name a file, so the index holds those.
//
// Built CONCURRENTLY (writes to video_tasks go on), outside a transaction; safe to run again as
// files-task-index is: an invalid index left by an interrupted build is dropped first.
export const inTransaction = false;

const statements: string[] = [
  `drop index concurrently if exists video_tasks_output_file_idx`,
  `create index concurrently video_tasks_output_file_idx on video_tasks (output_file_id) where output_file_id is not null`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
