import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// rate_limit_counted_at: when the last 429 counted in rate_limit_strikes was recorded (database
// clock). A 429 counts only when its call started after that moment, as failures of the circuit do
// (failure_counted_at): the calls in flight when a member began refusing are one burst and one
// strike, not one each, so that one burst of 8 concurrent 429s cools the member 1 s, not 4 s, and
// its next 429 2 s, not 60 s.
const statements = [`alter table member_health add column rate_limit_counted_at timestamptz`];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
