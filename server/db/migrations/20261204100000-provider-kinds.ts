import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Four more provider kinds (issues 30 and 31): `minimax` (MiniMax Hailuo video), `dashscope`
// (Alibaba DashScope / Model Studio: Wan and the vendors it hosts), `fal` and `replicate` (the
// aggregators, driven by operator-written model mappings).
const statements: string[] = [
  `alter table group_members drop constraint group_members_provider_check`,
  `alter table group_members add constraint group_members_provider_check
     check (provider in ('local', 'openai', 'gemini', 'ark', 'kling', 'minimax', 'dashscope', 'fal', 'replicate'))`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
