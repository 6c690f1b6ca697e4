/** GET /v1/credits (product spec §2.2). */
import type { components } from '../../generated/api.d.ts';
import type { CreditRepository, CreditViewRow } from '../repositories/credit.repository.ts';
import type { AuthContext } from './auth.service.ts';
import { toCredits } from '../lib/money.ts';

type CreditBalance = components['schemas']['CreditBalance'];

export function toCreditBalance(row: CreditViewRow): CreditBalance {
  const unlimited = row.creditLimit === null;
  return {
    object: 'credit_balance',
    account: {
      balance: toCredits(row.balance),
      total_earned: toCredits(row.totalEarned),
      total_spent: toCredits(row.totalSpent),
      status: row.accountStatus as CreditBalance['account']['status'],
    },
    api_key: {
      id: row.id,
      name: row.name,
      key_prefix: row.keyPrefix,
      last_four: row.lastFour,
      is_active: row.isActive,
      credit_limit: unlimited ? null : toCredits(row.creditLimit as number),
      credits_used: toCredits(row.creditsUsed),
      credits_remaining: unlimited ? null : toCredits(Math.max(0, (row.creditLimit as number) - row.creditsUsed)),
      unlimited,
      last_used_at: row.lastUsedAt ? row.lastUsedAt.toISOString() : null,
      created_at: row.createdAt.toISOString(),
    },
  };
}

export class CreditService {
  constructor(private readonly credits: CreditRepository) {}

  async getBalance(auth: AuthContext): Promise<CreditBalance> {
    const row = await this.credits.findView(auth.apiKeyId);
    // The key authenticated a moment ago; it can only vanish if deleted in between.
    if (!row) throw new Error(`api key ${auth.apiKeyId} disappeared`);
    return toCreditBalance(row);
  }
}
