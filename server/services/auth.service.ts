/**
 * API key authentication (product spec §5). Keys are looked up by SHA-256 hash, cached in-process
 * for at most KEY_CACHE_TTL_MS (≤ 5 s), and last_used_at is written at most once a minute per key,
 * in the background, so it never delays a response.
 */
import type { Logger } from '../logger.ts';
import { ApiError, invalidApiKey } from '../errors.ts';
import type { ApiKeyRepository, KeyAuthRow } from '../repositories/api-key.repository.ts';
import { hashApiKey, looksLikeApiKey } from '../lib/api-key-material.ts';

export interface AuthContext {
  apiKeyId: string;
  accountId: string;
  groupId: string;
}

const LAST_USED_INTERVAL_MS = 60_000;
const MAX_CACHE_ENTRIES = 10_000;

export class AuthService {
  /** Lookups by key hash, including in-flight ones, so concurrent misses share one query. */
  private readonly cache = new Map<string, { row: Promise<KeyAuthRow | undefined>; expiresAt: number }>();
  private readonly lastTouched = new Map<string, number>();

  constructor(
    private readonly keys: ApiKeyRepository,
    private readonly log: Logger,
    private readonly cacheTtlMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  async authenticate(authorization: string | undefined): Promise<AuthContext> {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? '');
    const key = match?.[1];
    if (!key || !looksLikeApiKey(key)) throw invalidApiKey();
    const row = await this.lookup(hashApiKey(key));
    if (!row) throw invalidApiKey();
    if (!row.isActive) throw new ApiError(403, 'api_key_inactive', 'This API key is inactive.');
    if (row.accountStatus !== 'active') throw new ApiError(403, 'account_suspended', 'The account that owns this API key is suspended.');
    this.touch(row.id);
    return { apiKeyId: row.id, accountId: row.accountId, groupId: row.groupId };
  }

  /** Drops cached lookups (after an admin change on this instance; other instances expire within the TTL). */
  invalidate(): void {
    this.cache.clear();
  }

  private lookup(hash: Buffer): Promise<KeyAuthRow | undefined> {
    if (this.cacheTtlMs <= 0) return this.keys.findAuthByHash(hash);
    const cacheKey = hash.toString('base64');
    const now = this.now();
    const hit = this.cache.get(cacheKey);
    if (hit && hit.expiresAt > now) return hit.row;
    const row = this.keys.findAuthByHash(hash);
    if (this.cache.size >= MAX_CACHE_ENTRIES) this.cache.delete(this.cache.keys().next().value as string);
    this.cache.set(cacheKey, { row, expiresAt: now + this.cacheTtlMs });
    // A failed lookup (database down) is not cached.
    row.catch(() => this.cache.delete(cacheKey));
    return row;
  }

  private touch(keyId: string): void {
    const now = this.now();
    const last = this.lastTouched.get(keyId);
    if (last !== undefined && now - last < LAST_USED_INTERVAL_MS) return;
    this.lastTouched.set(keyId, now);
    this.keys.touchLastUsed(keyId).catch((err: unknown) => this.log.warn({ err, apiKeyId: keyId }, 'could not record last_used_at'));
  }
}
