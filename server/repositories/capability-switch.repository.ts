/** All Kysely code for the capability switches (the three rows always exist, see the catalog migration). */
import type { Kysely, Selectable } from 'kysely';
import type { CapabilitySwitches, DB } from '../../generated/db.d.ts';

export type CapabilitySwitchRow = Selectable<CapabilitySwitches>;

export class CapabilitySwitchRepository {
  constructor(private readonly db: Kysely<DB>) {}

  list(): Promise<CapabilitySwitchRow[]> {
    return this.db.selectFrom('capabilitySwitches').select(['name', 'enabled', 'updatedAt']).execute();
  }

  /** Sets a switch; undefined for an unknown name. */
  set(name: string, enabled: boolean): Promise<CapabilitySwitchRow | undefined> {
    return this.db
      .updateTable('capabilitySwitches')
      .set({ enabled })
      .where('name', '=', name)
      .returning(['name', 'enabled', 'updatedAt'])
      .executeTakeFirst();
  }
}
