import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// The bytes of a file a client deleted, until the store has deleted them. DELETE /v1/files/{id}
// deletes the file's rows (its own and its sendable copies') and records their storage keys here in
// the same statement, commits, then deletes the bytes and, once the store has, these rows. A store
// that failed or refused one of those deletes (an outage, AccessDenied, a crash between the commit
// and the store call) leaves its row, and the media sweeper tries it again every minute
// (next_attempt_at, backing off up to an hour for a store that keeps refusing), instead of leaving
// the bytes — served by any presigned link handed out before — to the orphan walk, which reaches a
// key only once per walk of the whole store (500 keys a minute). A new table: no lock on a hot one.
const statements: string[] = [
  `create table pending_deletes (
     storage_key text primary key,
     created_at timestamptz not null default now(),
     attempts integer not null default 0,
     next_attempt_at timestamptz not null default now(),
     last_error text
   )`,
  `create index pending_deletes_next_attempt_at_idx on pending_deletes (next_attempt_at)`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
