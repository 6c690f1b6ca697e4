/** Admin-only Kysely code for API keys (the auth hot path lives in api-key.repository.ts). */
import { sql, type Kysely, type Selectable } from 'kysely';
import type { ApiKeys, DB } from '../../generated/db.d.ts';
import { createdAtMicros, microsToTimestamp, type CreatedAtPosition } from './account.repository.ts';

/** Every column but the hash, which never leaves the database. */
export type ApiKeyAdminRow = Omit<Selectable<ApiKeys>, 'keyHash' | 'updatedAt'>;

const KEY_COLUMNS = [
  'id',
  'accountId',
  'groupId',
  'name',
  'keyPrefix',
  'lastFour',
  'isActive',
  'creditLimit',
  'creditsUsed',
  'requestsPerMinute',
  'maxInFlight',
  'lastUsedAt',
  'createdAt',
] as const;

export class ApiKeyAdminRepository {
  constructor(private readonly db: Kysely<DB>) {}

  insert(values: {
    id: string;
    accountId: string;
    groupId: string;
    name: string;
    keyHash: Buffer;
    keyPrefix: string;
    lastFour: string;
    creditLimit: number | null;
    requestsPerMinute?: number | null;
    maxInFlight?: number | null;
  }): Promise<ApiKeyAdminRow> {
    return this.db.insertInto('apiKeys').values(values).returning(KEY_COLUMNS).executeTakeFirstOrThrow();
  }

  findById(id: string): Promise<ApiKeyAdminRow | undefined> {
    return this.db.selectFrom('apiKeys').select(KEY_COLUMNS).where('id', '=', id).executeTakeFirst();
  }

  /** Newest first; `limit + 1` rows tell the caller whether another page follows. */
  list(opts: { limit: number; accountId?: string; after?: CreatedAtPosition }): Promise<(ApiKeyAdminRow & { createdAtMicros: number })[]> {
    let query = this.db
      .selectFrom('apiKeys')
      .select([...KEY_COLUMNS, createdAtMicros('createdAt').as('createdAtMicros')])
      .orderBy('createdAt', 'desc')
      .orderBy('id', 'desc')
      .limit(opts.limit);
    if (opts.accountId !== undefined) query = query.where('accountId', '=', opts.accountId);
    if (opts.after) query = query.where(sql<boolean>`(created_at, id) < (${microsToTimestamp(opts.after.createdAtMicros)}, ${opts.after.id})`);
    return query.execute();
  }

  update(
    id: string,
    patch: { name?: string; creditLimit?: number | null; groupId?: string; isActive?: boolean; requestsPerMinute?: number | null; maxInFlight?: number | null },
  ): Promise<ApiKeyAdminRow | undefined> {
    return this.db.updateTable('apiKeys').set(patch).where('id', '=', id).returning(KEY_COLUMNS).executeTakeFirst();
  }
}
