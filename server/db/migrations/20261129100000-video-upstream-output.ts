import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// What a video task knows once its upstream job is done (issue 26, item 2): where the output is
// (the adapter's opaque reference, e.g. {"uri": …}) and when a poll said so. A task that has it is
// never polled again: a failed download retries the download alone, with its own retry budget,
// counted in download_retries (failures to store the output, the gateway's own, are not counted).
const statements: string[] = [
  `alter table video_tasks add column upstream_output jsonb, add column upstream_done_at timestamptz,
     add column download_retries integer not null default 0 constraint video_tasks_download_retries_check check (download_retries >= 0)`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
