import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { generateApiKey, hashApiKey, looksLikeApiKey } from '../../server/lib/api-key-material.ts';
import { BASE62_ALPHABET, newId, randomBase62, randomHex } from '../../server/lib/ids.ts';

describe('generateApiKey', () => {
  it('returns mg_ + 33 base62 characters (192 random bits)', () => {
    const { key } = generateApiKey();
    expect(key).toMatch(/^mg_[0-9A-Za-z]{33}$/);
    // 33 base62 digits carry 33 * log2(62) ≈ 196 bits of room for the 192 random bits.
    expect(33 * Math.log2(62)).toBeGreaterThanOrEqual(192);
  });

  it('derives hash, prefix and last four from the key', () => {
    const { key, hash, prefix, lastFour } = generateApiKey();
    expect(hash).toEqual(createHash('sha256').update(key).digest());
    expect(hash.length).toBe(32);
    expect(hashApiKey(key).equals(hash)).toBe(true);
    expect(prefix).toBe(key.slice(0, 8));
    expect(prefix).toMatch(/^mg_[0-9A-Za-z]{5}$/);
    expect(lastFour).toBe(key.slice(-4));
  });

  it('never repeats and uses the whole alphabet', () => {
    const keys = Array.from({ length: 2000 }, () => generateApiKey().key);
    expect(new Set(keys).size).toBe(keys.length);
    const chars = new Set(keys.flatMap((k) => [...k.slice(3)]));
    expect(chars.size).toBe(62);
  });
});

describe('looksLikeApiKey', () => {
  it('accepts generated keys and rejects other strings', () => {
    expect(looksLikeApiKey(generateApiKey().key)).toBe(true);
    for (const s of ['', 'mg_', 'sk-abc', `mg_${'a'.repeat(32)}`, `mg_${'a'.repeat(34)}`, `mg_${'a'.repeat(32)}!`, `MG_${'a'.repeat(33)}`]) {
      expect(looksLikeApiKey(s)).toBe(false);
    }
  });
});

describe('newId', () => {
  it('is the prefix, an underscore and 20 base62 characters', () => {
    expect(newId('acct')).toMatch(/^acct_[0-9A-Za-z]{20}$/);
    expect(newId('hold')).toMatch(/^hold_[0-9A-Za-z]{20}$/);
    expect(randomBase62(100)).toMatch(/^[0-9A-Za-z]{100}$/);
  });

  it('draws uniformly from the pool across its refills, and never repeats', () => {
    // 10,000 ids × 20 characters cross the 4 KiB pool's refill about 50 times.
    const ids = Array.from({ length: 10_000 }, () => newId('img'));
    expect(new Set(ids).size).toBe(ids.length);
    const counts = new Map<string, number>();
    for (const id of ids) for (const c of id.slice(4)) counts.set(c, (counts.get(c) ?? 0) + 1);
    expect(counts.size).toBe(62);
    // 200,000 characters: about 3,226 each; a biased modulo would put the first 8 characters 25% higher.
    for (const c of BASE62_ALPHABET) expect(Math.abs(counts.get(c)! - 200_000 / 62)).toBeLessThan(400);
    const hex = Array.from({ length: 2_000 }, () => randomHex(12));
    expect(hex.every((h) => /^[0-9a-f]{24}$/.test(h))).toBe(true);
    expect(new Set(hex).size).toBe(hex.length);
  });
});
