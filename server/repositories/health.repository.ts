/** Database reachability, for readiness checks. */
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';

export class HealthRepository {
  constructor(private readonly db: Kysely<DB>) {}

  async ping(): Promise<void> {
    await sql`select 1`.execute(this.db);
  }
}
