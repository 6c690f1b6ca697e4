import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Aggregators (issue 31): a catalog model served by `fal` or `replicate` carries, per provider kind,
// the operator's mapping (endpoint, JSONata input and output expressions, media form), checked
// when saved by the catalog admin service.
const statements: string[] = [`alter table catalog_models add column upstream_mappings jsonb not null default '{}'::jsonb`];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
