import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { QuoteTokens } from '../../server/services/quote-token.ts';

const claims = { k: 'key_1', m: 'local-video-1', r: '720p', b: 'per_second' as const, p: 120_000 };

describe('QuoteTokens (injected clock)', () => {
  let now = 1_700_000_000_000;
  const tokens = new QuoteTokens(randomBytes(32), 900, () => now);

  it('accepts its own token for the same key, model, resolution and price until it expires', () => {
    const token = tokens.issue(claims);
    expect(token).toMatch(/^q1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/);
    expect(tokens.check(token, claims)).toEqual({ ok: true });
    now += 899_000;
    expect(tokens.check(token, claims)).toEqual({ ok: true });
    now += 1_000;
    expect(tokens.check(token, claims)).toEqual({ ok: false, reason: 'expired' });
  });

  it('tells a stale price from a mismatch and from a forgery', () => {
    const token = tokens.issue(claims);
    expect(tokens.check(token, { ...claims, p: 130_000 })).toEqual({ ok: false, reason: 'stale' });
    expect(tokens.check(token, { ...claims, b: 'per_item' })).toEqual({ ok: false, reason: 'stale' });
    expect(tokens.check(token, { ...claims, k: 'key_2' })).toEqual({ ok: false, reason: 'mismatch' });
    expect(tokens.check(token, { ...claims, r: '480p' })).toEqual({ ok: false, reason: 'mismatch' });
    const other = new QuoteTokens(randomBytes(32), 900, () => now);
    expect(other.check(token, claims)).toEqual({ ok: false, reason: 'invalid' });
    expect(tokens.check('q1.bm90IGpzb24.AAAA', claims)).toEqual({ ok: false, reason: 'invalid' });
    expect(tokens.check('garbage', claims)).toEqual({ ok: false, reason: 'invalid' });
    const [v, payload, mac] = token.split('.');
    const tampered = Buffer.from(JSON.stringify({ ...JSON.parse(Buffer.from(payload!, 'base64url').toString()), p: 1 })).toString('base64url');
    expect(tokens.check(`${v}.${tampered}.${mac}`, { ...claims, p: 1 })).toEqual({ ok: false, reason: 'invalid' });
  });
});
