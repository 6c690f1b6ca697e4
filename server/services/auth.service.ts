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
  /** The key's hash (the cache's key) and when it was checked: what `current` reads again. */
  keyHash?: string;
  checkedAt?: number;
}

/**
 * How old a request's authentication may be when its credit hold is written before `current` reads
 * the key's limits again: a synchronous image's body takes milliseconds (no lookup on the hot path),
 * a video's or an edit's may stream, or its inputs download, for minutes.
 */
const FRESH_MS = 1_000;

const LAST_USED_INTERVAL_MS = 60_000;

export class AuthService {
  /** Lookups by key hash, including in-flight ones, so concurrent misses share one query. */
  private readonly cache: TtlCache<KeyAuthRow | undefined>;
  /**
   * Hashes no key has, kept apart (and fewer): a client sending made-up keys fills this, never
   * `cache`, whose known keys it would otherwise push out (each of their requests a query again).
   */
  private readonly unknown: TtlCache<undefined>;
  /** Misses being looked up, shared by concurrent requests for one key. */
  private readonly loading = new Map<string, Promise<KeyAuthRow | undefined>>();
  /** Bumped by `invalidate`: a lookup that started before it keeps its answer out of the caches. */
  private generation = 0;
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
    this.unknown = new TtlCache(cacheTtlMs, 1_000, now);
  }

  async authenticate(authorization: string | undefined): Promise<AuthContext> {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? '');
    const key = match?.[1];
    if (!key || !looksLikeApiKey(key)) throw invalidApiKey();
    const keyHash = hashApiKey(key).toString('base64');
    const row = await this.lookup(keyHash);
    if (!row) throw invalidApiKey();
    if (!row.isActive) throw apiKeyInactive();
    if (row.accountStatus !== 'active') throw accountSuspended();
    this.touch(row.id);
    return { apiKeyId: row.id, accountId: row.accountId, groupId: row.groupId, limits: this.limitsOf(row), keyHash, checkedAt: this.now() };
  }

  /**
   * `auth` with the limits its key and account have now, read again (through the cache, which an
   * operator's change drops on every instance) when it was checked more than FRESH_MS ago: the caps
   * on generations in flight that a credit hold enforces are the ones set when it is written, not
   * when a body that streamed for minutes began. Whether the key is still active and its account
   * still in use is the hold statement's own check; a key no longer found keeps what it had.
   */
  async current(auth: AuthContext): Promise<AuthContext> {
    if (this.isFresh(auth)) return auth;
    const row = await this.lookup(auth.keyHash!);
    if (!row || row.id !== auth.apiKeyId) return auth;
    return { ...auth, limits: this.limitsOf(row), checkedAt: this.now() };
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
    this.generation++;
    this.cache.clear();
    this.unknown.clear();
  }

  /** Whether `auth`'s limits are as current as a lookup would make them (checked within FRESH_MS): `current` is then `auth` itself. */
  private isFresh(auth: AuthContext): boolean {
    return auth.keyHash === undefined || auth.checkedAt === undefined || this.now() - auth.checkedAt <= FRESH_MS;
  }

  /** The key's row by its hash (base64, the cache's key). */
  private async lookup(keyHash: string): Promise<KeyAuthRow | undefined> {
    if (this.cache.has(keyHash)) return this.cache.get(keyHash, () => this.keys.findAuthByHash(Buffer.from(keyHash, 'base64')));
    if (this.unknown.has(keyHash)) return undefined;
    // A miss: concurrent ones share the query; its answer goes into the cache it belongs to, unless
    // the caches were dropped meanwhile (an admin change the answer may predate).
    const generation = this.generation;
    let pending = this.loading.get(keyHash);
    if (!pending) {
      pending = this.keys.findAuthByHash(Buffer.from(keyHash, 'base64')).finally(() => this.loading.delete(keyHash));
      this.loading.set(keyHash, pending);
    }
    const row = await pending;
    if (generation === this.generation) {
      if (row) this.cache.set(keyHash, row);
      else this.unknown.set(keyHash, undefined);
    }
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
