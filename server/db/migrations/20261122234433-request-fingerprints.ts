import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Idempotency (product spec §4.6 rule 3): a retry with an existing client_request_id returns the
// original task only when it is the same request. The fingerprint is a SHA-256 of the normalized
// request minus client_request_id and quote_token (services/video/video-request.ts); tasks created
// before this migration have none and are returned for any retry, as before.
const statements = [`alter table video_tasks add column request_fingerprint text`];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
