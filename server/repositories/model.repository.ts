/** Catalog reads for the public API: which models a key's group can reach. */
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';

export interface VisibleModelRow {
  id: string;
  kind: string;
  createdAt: Date;
}

export class ModelRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /**
   * Models visible to a group, in one query: enabled in the catalog, switched on by the capability
   * switches of their kind, and listed by an enabled member of the group that can run (a `local`
   * member, or an upstream member with credentials). Configuration only, not live capacity.
   */
  listVisible(groupId: string, kind?: 'image' | 'video'): Promise<VisibleModelRow[]> {
    let query = this.db
      .selectFrom('catalogModels as m')
      .select(['m.id', 'm.kind', 'm.createdAt'])
      .where('m.enabled', '=', true)
      .where(({ exists, selectFrom }) =>
        exists(
          selectFrom('capabilitySwitches as s')
            .select(sql`1`.as('one'))
            .where('s.enabled', '=', true)
            .where(sql<boolean>`((m.kind = 'image' and s.name in ('image_generation', 'image_edit')) or (m.kind = 'video' and s.name = 'video_generation'))`),
        ),
      )
      .where(({ exists, selectFrom }) =>
        exists(
          selectFrom('groupMembers as g')
            .select(sql`1`.as('one'))
            .where('g.groupId', '=', groupId)
            .where('g.enabled', '=', true)
            .where(sql<boolean>`m.id = any(g.models)`)
            .where(sql<boolean>`(g.provider = 'local' or g.credentials_ciphertext is not null)`),
        ),
      );
    if (kind) query = query.where('m.kind', '=', kind);
    return query.orderBy('m.kind').orderBy('m.id').execute();
  }
}
