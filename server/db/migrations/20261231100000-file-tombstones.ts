import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// A deleted file keeps its place in the account's listing for a week: `after` names the previous
// page's last item, and a client that deletes what it lists (the OpenAI SDK's
// `for await (const f of client.files.list()) await client.files.delete(f.id)`), or a sweeper that
// deletes a file between two pages, must not turn that id into 400 invalid_cursor. Every statement
// that deletes rows of the Files API's purposes records them in file_tombstones (id, account and
// created_at: the keyset position) in the same statement, whatever path deletes them — a client's
// DELETE, the media sweeper's expiry and unlanded rows, a dropped result, a discarded output — so no
// code path can forget it. Request inputs are never listed and get none.
//
// Retention: at least 7 days after the deletion (a pagination paused overnight or over a weekend,
// a weekly sync). Each deleting statement also purges up to 1000 older tombstones, more than any
// statement adds (the sweeper deletes at most a few hundred), skipping rows another deleting
// transaction holds so that deletions never wait for each other; with no deletions nothing grows.
const statements = [
  `create table file_tombstones (
     id text primary key,
     account_id text not null references accounts (id),
     created_at timestamptz not null,
     deleted_at timestamptz not null default now()
   )`,
  `create index file_tombstones_deleted_at_idx on file_tombstones (deleted_at)`,
  `create function mediagate_file_tombstones() returns trigger language plpgsql as $$
   begin
     if not exists (select 1 from gone where purpose in ('upload', 'image_output', 'video_output')) then
       return null;
     end if;
     insert into file_tombstones (id, account_id, created_at)
       select id, account_id, created_at from gone where purpose in ('upload', 'image_output', 'video_output')
       on conflict (id) do nothing;
     delete from file_tombstones where id in (
       select id from file_tombstones where deleted_at < now() - interval '7 days'
       order by deleted_at limit 1000 for update skip locked);
     return null;
   end $$`,
  `create trigger files_tombstones after delete on files
     referencing old table as gone for each statement execute function mediagate_file_tombstones()`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
