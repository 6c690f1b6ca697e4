/**
 * The account pool (design §8): which upstream account (group member) serves a request, and that
 * account with its credentials decrypted, as adapters receive it. Jobs already accepted upstream
 * always go back to the member that accepted them (`account(memberId)`, cached for a few seconds:
 * a changed or deleted member is seen by running jobs within ACCOUNT_CACHE_MS).
 */
import { decryptSecret } from '../lib/secret-box.ts';
import type { ProviderRegistry } from '../providers/registry.ts';
import type { UpstreamAccount } from '../providers/types.ts';
import type { MemberCandidate, RoutingRepository } from '../repositories/routing.repository.ts';
import { pickMember } from './member-selection.ts';

/** How long a member's decrypted account is reused by `account()` (poll steps of thousands of jobs). */
export const ACCOUNT_CACHE_MS = 5000;

export class Pool {
  private readonly accounts = new Map<string, { account: UpstreamAccount | undefined; until: number }>();

  constructor(
    private readonly routing: RoutingRepository,
    private readonly providers: ProviderRegistry,
    private readonly secretKey: Buffer,
    private readonly random: () => number = Math.random,
  ) {}

  /** A member of the group that can run `model` for `capability` here, or undefined. */
  async pick(groupId: string, model: string, capability: 'image' | 'video'): Promise<UpstreamAccount | undefined> {
    const candidates = await this.routing.candidates(groupId, model, this.providers.kindsFor(capability), this.providers.credentialFreeKinds());
    const member = pickMember(candidates, this.random);
    return member && this.toAccount(member);
  }

  /** The account of a member that already holds a job (sticky), or undefined when it was deleted. */
  async account(memberId: string): Promise<UpstreamAccount | undefined> {
    const now = Date.now();
    const cached = this.accounts.get(memberId);
    if (cached && cached.until > now) return cached.account;
    const member = await this.routing.find(memberId);
    const account = member && this.toAccount(member);
    if (this.accounts.size > 10_000) this.accounts.clear();
    this.accounts.set(memberId, { account, until: now + ACCOUNT_CACHE_MS });
    return account;
  }

  private toAccount(member: MemberCandidate): UpstreamAccount {
    const credentials = member.credentialsCiphertext ? (JSON.parse(decryptSecret(this.secretKey, member.credentialsCiphertext)) as Record<string, string>) : {};
    return { memberId: member.id, provider: member.provider as UpstreamAccount['provider'], baseUrl: member.baseUrl, credentials };
  }
}
