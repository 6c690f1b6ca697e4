import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { generateApiKey, hashApiKey, looksLikeApiKey } from '../../server/lib/api-key-material.ts';
import { newId, randomBase62 } from '../../server/lib/ids.ts';

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
});
