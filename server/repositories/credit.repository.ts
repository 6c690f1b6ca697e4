/** Reads of the credit state of a key and its account. */
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { totalSpentOf } from './account.repository.ts';

export interface CreditViewRow {
  balance: number;
  totalEarned: number;
  totalSpent: number;
  accountStatus: string;
  id: string;
  name: string;
  keyPrefix: string;
  lastFour: string;
  isActive: boolean;
  creditLimit: number | null;
  creditsUsed: number;
  lastUsedAt: Date | null;
  createdAt: Date;
}

export class CreditRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /** One query: the key and its account. */
  findView(apiKeyId: string): Promise<CreditViewRow | undefined> {
    return this.db
      .selectFrom('apiKeys as k')
      .innerJoin('accounts as a', 'a.id', 'k.accountId')
      .select([
        'a.balance',
        'a.totalEarned',
        totalSpentOf('a').as('totalSpent'),
        'a.status as accountStatus',
        'k.id',
        'k.name',
        'k.keyPrefix',
        'k.lastFour',
        'k.isActive',
        'k.creditLimit',
        'k.creditsUsed',
        'k.lastUsedAt',
        'k.createdAt',
      ])
      .where('k.id', '=', apiKeyId)
      .executeTakeFirst();
  }
}
