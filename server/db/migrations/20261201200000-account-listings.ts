import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// A client lists its own files and tasks, and deletes its own files (issue 27, items 4 and 5).
// 1. Listings are keyset pages of one account, newest first: `(created_at, id) < (the previous
//    page's last item)`. (account_id, created_at, id) serves that comparison and its order from
//    the index alone; it replaces the (account_id, created_at) indexes, of which it is an extension.
// 2. A client may delete the output of a finished video task: the deleting statement detaches it
//    (output_file_id set to null), so "a completed task has an output" no longer holds for the
//    tasks whose owner deleted it. The foreign key stays: output_file_id is null or a stored file.
const statements = [
  `create index files_account_created_idx on files (account_id, created_at, id)`,
  `drop index files_account_id_idx`,
  `create index video_tasks_account_created_idx on video_tasks (account_id, created_at, id)`,
  `drop index video_tasks_account_id_idx`,
  `create index image_tasks_account_created_idx on image_tasks (account_id, created_at, id)`,
  `drop index image_tasks_account_id_idx`,
  `alter table video_tasks drop constraint video_tasks_output_check`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
