/**
 * Kling's API token (upstream-apis.md §6.1): a JWT signed HS256 with the member's `secret_key`,
 * `iss` = its `access_key`, `exp` = now + 30 min, `nbf` = now - 5 s (Kling's own Python and Java
 * samples), sent as `Authorization: Bearer <jwt>`. Signed with `jose` (a maintained JOSE library)
 * rather than by hand.
 *
 * One cache per process, keyed by the access key: a token is reused until it has less than
 * `renewBeforeSeconds` left, so that a call that starts with it (an upload can take minutes) never
 * reaches Kling with an expired token; a changed secret key (an admin updated the member) signs a
 * new one at once. Tokens and keys are never logged: nothing here logs at all.
 */
import { createHash } from 'node:crypto';
import { SignJWT } from 'jose';
import { ProviderError } from '../provider-error.ts';
import type { UpstreamAccount } from '../types.ts';

export interface KlingTokenOptions {
  /** Lifetime of a token (default 1800 s, as Kling's samples). */
  ttlSeconds?: number;
  /** A cached token with less than this left is replaced (default 300 s). */
  renewBeforeSeconds?: number;
  /** How far `nbf` lies in the past, for clocks that differ a little (default 5 s, as Kling's samples). */
  notBeforeSeconds?: number;
  /** The clock, in milliseconds (tests). */
  now?: () => number;
}

interface CachedToken {
  token: string;
  /** SHA-256 of the secret it was signed with: a new secret signs a new token. */
  secret: string;
  /** Unix seconds. */
  expiresAt: number;
}

/** Most access keys remembered; past it the cache starts over (a token is cheap to sign). */
const MAX_CACHED = 10_000;

export class KlingTokens {
  private readonly cache = new Map<string, CachedToken>();
  private readonly ttl: number;
  private readonly renewBefore: number;
  private readonly notBefore: number;
  private readonly now: () => number;

  constructor(options: KlingTokenOptions = {}) {
    this.ttl = options.ttlSeconds ?? 1800;
    this.renewBefore = Math.min(options.renewBeforeSeconds ?? 300, Math.floor(this.ttl / 2));
    this.notBefore = options.notBeforeSeconds ?? 5;
    this.now = options.now ?? Date.now;
  }

  /** The member's current token, signed anew when none is cached or it is about to expire. */
  async token(account: UpstreamAccount): Promise<string> {
    const accessKey = account.credentials.access_key ?? '';
    const secretKey = account.credentials.secret_key ?? '';
    if (accessKey === '' || secretKey === '') throw new ProviderError('auth', 'the member has no access_key and secret_key for Kling');
    const secret = createHash('sha256').update(secretKey).digest('hex');
    const nowSeconds = Math.floor(this.now() / 1000);
    const cached = this.cache.get(accessKey);
    if (cached && cached.secret === secret && cached.expiresAt - nowSeconds > this.renewBefore) return cached.token;
    const expiresAt = nowSeconds + this.ttl;
    const token = await new SignJWT({})
      .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
      .setIssuer(accessKey)
      .setExpirationTime(expiresAt)
      .setNotBefore(nowSeconds - this.notBefore)
      .sign(new TextEncoder().encode(secretKey));
    if (this.cache.size >= MAX_CACHED) this.cache.clear();
    this.cache.set(accessKey, { token, secret, expiresAt });
    return token;
  }

  /** Forgets the member's token (Kling said it expired: its clock runs ahead of ours). */
  forget(account: UpstreamAccount): void {
    this.cache.delete(account.credentials.access_key ?? '');
  }
}
