import { describe, expect, it } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import type { ApiKeyRepository, KeyAuthRow } from '../../server/repositories/api-key.repository.ts';
import { AuthService } from '../../server/services/auth.service.ts';
import { generateApiKey, hashApiKey } from '../../server/lib/api-key-material.ts';

/** A strict fake repository that counts lookups. */
function fakeKeys(row: KeyAuthRow | undefined, opts: { failFirst?: boolean } = {}) {
  let lookups = 0;
  let touches = 0;
  const repo = {
    async findAuthByHash() {
      lookups++;
      await new Promise((r) => setTimeout(r, 10));
      if (opts.failFirst && lookups === 1) throw new Error('database down');
      return row;
    },
    async touchLastUsed() {
      touches++;
    },
  } as unknown as ApiKeyRepository;
  return { repo, lookups: () => lookups, touches: () => touches };
}

const row: KeyAuthRow = {
  id: 'key_1',
  accountId: 'acct_1',
  groupId: 'grp_1',
  isActive: true,
  accountStatus: 'active',
  requestsPerMinute: null,
  maxInFlight: null,
  accountRequestsPerMinute: null,
  accountMaxInFlight: null,
};
const log = createLogger('silent');

describe('AuthService', () => {
  it('shares one lookup between concurrent requests and caches it for the TTL', async () => {
    let now = 1_000_000;
    const keys = fakeKeys(row);
    const auth = new AuthService(keys.repo, log, 5000, () => now);
    const { key } = generateApiKey();
    const results = await Promise.all(Array.from({ length: 20 }, () => auth.authenticate(`Bearer ${key}`)));
    expect(results.every((r) => r.apiKeyId === 'key_1')).toBe(true);
    expect(keys.lookups()).toBe(1);
    now += 4999;
    await auth.authenticate(`Bearer ${key}`);
    expect(keys.lookups()).toBe(1);
    now += 2;
    await auth.authenticate(`Bearer ${key}`);
    expect(keys.lookups()).toBe(2);
  });

  it('keeps a known key cached however many made-up keys are tried, and caches those apart', async () => {
    const found = new Set<string>();
    let lookups = 0;
    const { key } = generateApiKey();
    const knownHash = hashApiKey(key).toString('base64');
    const repo = {
      async findAuthByHash(hash: Buffer) {
        lookups++;
        found.add(hash.toString('base64'));
        return hash.toString('base64') === knownHash ? row : undefined;
      },
      async touchLastUsed() {},
    } as unknown as ApiKeyRepository;
    const auth = new AuthService(repo, log, 5000);
    await auth.authenticate(`Bearer ${key}`);
    // More made-up keys than the cache holds.
    const madeUp = Array.from({ length: 10_050 }, () => generateApiKey().key);
    for (const bogus of madeUp) await expect(auth.authenticate(`Bearer ${bogus}`)).rejects.toMatchObject({ code: 'invalid_api_key' });
    const before = lookups;
    await auth.authenticate(`Bearer ${key}`);
    expect(lookups).toBe(before);
    // The latest made-up key is remembered as unknown: no query for it again within the TTL.
    await expect(auth.authenticate(`Bearer ${madeUp.at(-1)!}`)).rejects.toMatchObject({ code: 'invalid_api_key' });
    expect(lookups).toBe(before);
  });

  it('keeps a miss answered after the caches were dropped out of them: a key created meanwhile works at once', async () => {
    let answer: KeyAuthRow | undefined;
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let lookups = 0;
    const repo = {
      async findAuthByHash() {
        lookups++;
        // What the database said when the statement ran: the first one, before the key existed.
        const said = answer;
        if (lookups === 1) await gate;
        return said;
      },
      async touchLastUsed() {},
    } as unknown as ApiKeyRepository;
    const auth = new AuthService(repo, log, 5000);
    const { key } = generateApiKey();
    const first = auth.authenticate(`Bearer ${key}`);
    // The key is created while the first lookup runs (an admin change: the caches are dropped).
    auth.invalidate();
    answer = row;
    release();
    await expect(first).rejects.toMatchObject({ code: 'invalid_api_key' });
    await expect(auth.authenticate(`Bearer ${key}`)).resolves.toMatchObject({ apiKeyId: 'key_1' });
    expect(lookups).toBe(2);
  });

  it('does not cache a failed lookup', async () => {
    const keys = fakeKeys(row, { failFirst: true });
    const auth = new AuthService(keys.repo, log, 5000);
    const { key } = generateApiKey();
    await expect(auth.authenticate(`Bearer ${key}`)).rejects.toThrow('database down');
    await expect(auth.authenticate(`Bearer ${key}`)).resolves.toMatchObject({ apiKeyId: 'key_1' });
  });

  it('writes last_used_at at most once a minute per key', async () => {
    let now = 0;
    const keys = fakeKeys(row);
    const auth = new AuthService(keys.repo, log, 0, () => now);
    const { key } = generateApiKey();
    await auth.authenticate(`Bearer ${key}`);
    now += 59_999;
    await auth.authenticate(`Bearer ${key}`);
    expect(keys.touches()).toBe(1);
    now += 2;
    await auth.authenticate(`Bearer ${key}`);
    expect(keys.touches()).toBe(2);
  });

  it('rejects malformed keys without a database lookup', async () => {
    const keys = fakeKeys(row);
    const auth = new AuthService(keys.repo, log, 5000);
    for (const header of [undefined, '', 'Bearer', 'Basic abc', 'Bearer mg_short', 'Bearer sk-123']) {
      await expect(auth.authenticate(header)).rejects.toMatchObject({ status: 401, code: 'invalid_api_key' });
    }
    expect(keys.lookups()).toBe(0);
  });
});
