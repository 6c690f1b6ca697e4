/**
 * Periodic jobs that must run on one instance at a time (table sweepers): a lease any instance may
 * take once it has run out, and the job's place in a walk (cursor) that the next run, on any
 * instance, continues from.
 */
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';

export class SweeperRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /**
   * Takes (or renews) the lease of job `name` for `ms`, unless another owner holds it; returns the
   * job's cursor when taken, undefined when not.
   */
  async take(name: string, owner: string, ms: number): Promise<{ cursor: string | null } | undefined> {
    const { rows } = await sql<{ cursor: string | null }>`
      insert into sweepers as s (name, owner, lease_until) values (${name}, ${owner}, now() + ${ms} * interval '1 millisecond')
      on conflict (name) do update set owner = excluded.owner, lease_until = excluded.lease_until, updated_at = now()
        where s.lease_until is null or s.lease_until < now() or s.owner = excluded.owner
      returning s.cursor`.execute(this.db);
    return rows[0];
  }

  /** Saves the cursor (while the lease is held) and, with `release`, ends the lease. */
  async save(name: string, owner: string, cursor: string | null, release: boolean): Promise<void> {
    await this.db
      .updateTable('sweepers')
      .set({ cursor, ...(release && { leaseUntil: null, owner: null }), updatedAt: sql`now()` })
      .where('name', '=', name)
      .where('owner', '=', owner)
      .execute();
  }
}
