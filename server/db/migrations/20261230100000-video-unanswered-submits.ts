import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// video_tasks.unanswered_submits: how many submits of the task were sent (or about to be) without
// an answer the gateway heard — a process that died mid-call, a timeout after the body was sent —
// each of which the upstream may be running, billed. Counted before each send and taken back when
// its answer says the job was not taken. Once an upstream that cannot be asked about an earlier
// submit (no idempotency key, no lookup) has two of them, the task is failed and refunded instead of
// submitted a third time (VideoRunner.resubmit). A constant default: no table rewrite.
const statements: string[] = [
  `alter table video_tasks add column unanswered_submits smallint not null default 0`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
