/** All Kysely code for API keys. Returns rows or undefined; never throws HTTP errors. */
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';

export interface KeyAuthRow {
  id: string;
  accountId: string;
  groupId: string;
  isActive: boolean;
  accountStatus: string;
  /** The key's and the account's own limits as stored (NULL: the operator's default, 0: none). */
  requestsPerMinute: number | null;
  maxInFlight: number | null;
  accountRequestsPerMinute: number | null;
  accountMaxInFlight: number | null;
}

export class ApiKeyRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /** The auth hot path: one indexed lookup by hash, joined with the account's status and limits. */
  findAuthByHash(hash: Buffer): Promise<KeyAuthRow | undefined> {
    return this.db
      .selectFrom('apiKeys as k')
      .innerJoin('accounts as a', 'a.id', 'k.accountId')
      .select([
        'k.id',
        'k.accountId',
        'k.groupId',
        'k.isActive',
        'a.status as accountStatus',
        'k.requestsPerMinute',
        'k.maxInFlight',
        'a.requestsPerMinute as accountRequestsPerMinute',
        'a.maxInFlight as accountMaxInFlight',
      ])
      .where('k.keyHash', '=', hash)
      .executeTakeFirst();
  }

  /** Sets last_used_at unless another request (on any instance) did so within the last minute. */
  async touchLastUsed(id: string): Promise<void> {
    await this.db
      .updateTable('apiKeys')
      .set({ lastUsedAt: sql`now()` })
      .where('id', '=', id)
      .where((eb) => eb.or([eb('lastUsedAt', 'is', null), eb('lastUsedAt', '<', sql<Date>`now() - interval '1 minute'`)]))
      .execute();
  }
}
