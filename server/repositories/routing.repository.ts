/** Which group members can serve a model (design §8), with the encrypted credentials the pool decrypts. */
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';

export interface MemberCandidate {
  id: string;
  provider: string;
  baseUrl: string | null;
  credentialsCiphertext: Buffer | null;
  priority: number;
  weight: number;
  concurrencyLimit: number | null;
}

const COLUMNS = ['id', 'provider', 'baseUrl', 'credentialsCiphertext', 'priority', 'weight', 'concurrencyLimit'] as const;

export class RoutingRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /**
   * Enabled members of the group that list the model and can run here: their provider is one of
   * `kinds`, and they have credentials unless their provider needs none.
   */
  candidates(groupId: string, model: string, kinds: readonly string[], credentialFree: readonly string[]): Promise<MemberCandidate[]> {
    return this.db
      .selectFrom('groupMembers')
      .select(COLUMNS)
      .where('groupId', '=', groupId)
      .where('enabled', '=', true)
      .where(sql<boolean>`${model} = any(models)`)
      .where('provider', 'in', kinds.length > 0 ? [...kinds] : [''])
      .where((eb) => eb.or([eb('provider', 'in', credentialFree.length > 0 ? [...credentialFree] : ['']), eb('credentialsCiphertext', 'is not', null)]))
      .orderBy('priority', 'desc')
      .orderBy('id')
      .execute();
  }

  find(id: string): Promise<MemberCandidate | undefined> {
    return this.db.selectFrom('groupMembers').select(COLUMNS).where('id', '=', id).executeTakeFirst();
  }
}
