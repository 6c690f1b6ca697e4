/**
 * API key authentication (product spec §5). Keys are looked up by SHA-256 hash, cached in-process
 * for at most KEY_CACHE_TTL_MS (≤ 5 s), and last_used_at is written at most once a minute per key,
 * in the background, so it never delays a response.
 */
import type { Logger } from '../logger.ts';
import { accountSuspended, apiKeyInactive, invalidApiKey } from '../errors.ts';
import type { ApiKeyRepository, KeyAuthRow } from '../repositories/api-key.repository.ts';
import { hashApiKey, looksLikeApiKey } from '../lib/api-key-material.ts';
import { TtlCache } from '../lib/ttl-cache.ts';
import { effectiveLimit, NO_LIMITS, type RequestLimits } from './limits/client-limits.ts';

export interface AuthContext {
  apiKeyId: string;
  accountId: string;
  groupId: string;
  /** The key's and its account's limits, the operator's defaults applied. */
  limits: RequestLimits;
}

const LAST_USED_INTERVAL_MS = 60_000;

export class AuthService {
  /** Lookups by key hash, including in-flight ones, so concurrent misses share one query. */
  private readonly cache: TtlCache<KeyAuthRow | undefined>;
  private readonly lastTouched = new Map<string, number>();

  constructor(
    private readonly keys: ApiKeyRepository,
    private readonly log: Logger,
    cacheTtlMs: number,
    private readonly now: () => number = Date.now,
    /** DEFAULT_KEY_RPM, DEFAULT_ACCOUNT_MAX_IN_FLIGHT, …: what rows without limits of their own get. */
    private readonly defaults: RequestLimits = NO_LIMITS,
  ) {
    this.cache = new TtlCache(cacheTtlMs, 10_000, now);
  }

  async authenticate(authorization: string | undefined): Promise<AuthContext> {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? '');
    const key = match?.[1];
    if (!key || !looksLikeApiKey(key)) throw invalidApiKey();
    const row = await this.lookup(hashApiKey(key));
    if (!row) throw invalidApiKey();
    if (!row.isActive) throw apiKeyInactive();
    if (row.accountStatus !== 'active') throw accountSuspended();
    this.touch(row.id);
    return { apiKeyId: row.id, accountId: row.accountId, groupId: row.groupId, limits: this.limitsOf(row) };
  }

  private limitsOf(row: KeyAuthRow): RequestLimits {
    const { key, account } = this.defaults;
    return {
      key: { requestsPerMinute: effectiveLimit(row.requestsPerMinute, key.requestsPerMinute), maxInFlight: effectiveLimit(row.maxInFlight, key.maxInFlight) },
      account: {
        requestsPerMinute: effectiveLimit(row.accountRequestsPerMinute, account.requestsPerMinute),
        maxInFlight: effectiveLimit(row.accountMaxInFlight, account.maxInFlight),
      },
    };
  }

  /** Drops cached lookups (after an admin change on this instance; other instances expire within the TTL). */
  invalidate(): void {
    this.cache.clear();
  }

  private lookup(hash: Buffer): Promise<KeyAuthRow | undefined> {
    return this.cache.get(hash.toString('base64'), () => this.keys.findAuthByHash(hash));
  }

  private touch(keyId: string): void {
    const now = this.now();
    const last = this.lastTouched.get(keyId);
    if (last !== undefined && now - last < LAST_USED_INTERVAL_MS) return;
    this.lastTouched.set(keyId, now);
    this.keys.touchLastUsed(keyId).catch((err: unknown) => this.log.warn({ err, apiKeyId: keyId }, 'could not record last_used_at'));
  }
}
