import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// The files of a task: a video's finalize deletes the outputs an earlier attempt stored
// (VideoTaskRepository.deleteUnpublishedOutputs) and an interrupted image stream collects the images
// it recorded (ImageTaskRepository.interruptedStream), both by files.task_id, which no index served:
// each read the whole table (every input, upload and output of the retention period). Uploads have
// no task, so the index leaves them out.
//
// Built CONCURRENTLY, so writes to files go on while it builds; that cannot run in a transaction
// (server/db/migrate.ts). Safe to run again: a build that failed or was interrupted leaves an
// invalid index of that name, dropped first (a valid one left by a crash before the migration was
// recorded is simply rebuilt).
export const inTransaction = false;

const statements: string[] = [
  `drop index concurrently if exists files_task_idx`,
  `create index concurrently files_task_idx on files (task_id) where task_id is not null`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
