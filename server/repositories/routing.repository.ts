/** Which group members can serve a model (design §8). */
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { sql } from 'kysely';

export interface MemberCandidate {
  id: string;
  provider: string;
  baseUrl: string | null;
  credentialsCiphertext: Buffer | null;
  priority: number;
  weight: number;
  concurrencyLimit: number | null;
}

export class RoutingRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /** Enabled members of the group that list the model, highest priority first. */
  candidates(groupId: string, model: string): Promise<MemberCandidate[]> {
    return this.db
      .selectFrom('groupMembers')
      .select(['id', 'provider', 'baseUrl', 'credentialsCiphertext', 'priority', 'weight', 'concurrencyLimit'])
      .where('groupId', '=', groupId)
      .where('enabled', '=', true)
      .where(sql<boolean>`${model} = any(models)`)
      .orderBy('priority', 'desc')
      .orderBy('id')
      .execute();
  }

  find(id: string): Promise<MemberCandidate | undefined> {
    return this.db
      .selectFrom('groupMembers')
      .select(['id', 'provider', 'baseUrl', 'credentialsCiphertext', 'priority', 'weight', 'concurrencyLimit'])
      .where('id', '=', id)
      .executeTakeFirst();
  }
}
