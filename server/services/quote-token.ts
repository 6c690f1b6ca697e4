/**
 * Video quote tokens (product spec §2.7, §4.6): short-lived, HMAC-signed, bound to the key, the
 * model, the resolution and the price at issue time. Format: `q1.<base64url json>.<base64url mac>`.
 */
import type { BillingMode } from '../catalog/capabilities.ts';
import { hmac, signatureMatches } from '../lib/signing.ts';

export interface QuoteClaims {
  /** api key id */
  k: string;
  /** model id */
  m: string;
  /** resolution */
  r: string;
  /** billing mode */
  b: BillingMode;
  /** unit price, micro-credits */
  p: number;
  /** expiry, unix seconds */
  e: number;
}

export type QuoteCheck =
  | { ok: true }
  | { ok: false; reason: 'invalid' | 'mismatch' | 'stale' | 'expired' };

export class QuoteTokens {
  constructor(
    private readonly key: Buffer,
    private readonly ttlSeconds: number,
    private readonly now: () => number = Date.now,
  ) {}

  issue(claims: Omit<QuoteClaims, 'e'>): string {
    const payload = Buffer.from(JSON.stringify({ ...claims, e: Math.floor(this.now() / 1000) + this.ttlSeconds })).toString('base64url');
    return `q1.${payload}.${hmac(this.key, `q1.${payload}`).toString('base64url')}`;
  }

  /** Checks a token against the request and the current price, in the order of the contract. */
  check(token: string, current: Omit<QuoteClaims, 'e'>): QuoteCheck {
    const parts = token.split('.');
    if (parts.length !== 3 || parts[0] !== 'q1') return { ok: false, reason: 'invalid' };
    const [, payload, mac] = parts as [string, string, string];
    if (!signatureMatches(hmac(this.key, `q1.${payload}`), mac)) return { ok: false, reason: 'invalid' };
    let claims: QuoteClaims;
    try {
      claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as QuoteClaims;
    } catch {
      return { ok: false, reason: 'invalid' };
    }
    if (claims.k !== current.k || claims.m !== current.m || claims.r !== current.r) return { ok: false, reason: 'mismatch' };
    if (claims.p !== current.p || claims.b !== current.b) return { ok: false, reason: 'stale' };
    if (claims.e * 1000 <= this.now()) return { ok: false, reason: 'expired' };
    return { ok: true };
  }
}
