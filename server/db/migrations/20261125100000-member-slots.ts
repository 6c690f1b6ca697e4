import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// A member's concurrency limit counts upstream calls, not tasks: an image adapter may split one
// task into parallel calls (Gemini renders one image per call), so an image task takes between 1
// and that many of the member's slots, as many as are free when it starts. `member_slots` records
// how many it holds while it names the member; the pool sums them as the member's in-flight work.
// Video tasks still hold one slot each.
const statements = [
  `alter table image_tasks add column member_slots integer not null default 1
     constraint image_tasks_member_slots_check check (member_slots >= 1)`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
