import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Large media inputs (design §7): inputs are streamed into the media store while the request body
// is read, before the task that will use them exists, and clients can upload a file once and use
// it in many requests (POST /v1/files).
// 1. files.expires_at: a file with an expiry is removed by the sweeper after it. An input stored
//    by a request that did not create a task (rejected, or its client went away, or its process
//    died) expires an hour later; creating the task adopts it (task_id set, expiry cleared) in the
//    same statement as the credit hold. An upload (purpose 'upload') expires when its client said;
//    a task using it pushes the expiry past the task's lifetime, so it cannot vanish under a
//    running task.
// 2. files.filename: the name an upload was sent with (shown back to its owner).
// 3. image_tasks.mask_file_id no longer references files: a mask is an input like the images in
//    input_file_ids (never a foreign key), and an expired upload used as a mask must be removable.
const statements = [
  `alter table files add column expires_at timestamptz`,
  `alter table files add column filename text`,
  `alter table files add constraint files_filename_check check (filename is null or char_length(filename) <= 255)`,
  `alter table files drop constraint files_purpose_check`,
  `alter table files add constraint files_purpose_check check (purpose in ('image_output', 'video_output', 'input', 'upload'))`,
  `alter table files add constraint files_upload_expires_check check (purpose <> 'upload' or expires_at is not null)`,
  `create index files_expires_at_idx on files (expires_at) where expires_at is not null`,
  `alter table image_tasks drop constraint image_tasks_mask_file_id_fkey`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
