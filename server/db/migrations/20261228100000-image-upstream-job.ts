import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// The upstream job a background image task is waiting for (a job queue: fal, Replicate, Kling),
// as the adapter reported it once the upstream accepted it (ImageEvents.submitted): a step that
// stops while the job runs (the process died, the engine stopped, the lease was lost) leaves it
// here, and the task's next step collects that job on the member `member_id` names instead of
// submitting (and paying for) a new one. Null while no job is waiting; cleared with member_id.
const statements: string[] = [`alter table image_tasks add column upstream_job jsonb`];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
