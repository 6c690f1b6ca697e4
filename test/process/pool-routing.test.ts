/**
 * The account pool across two real server processes sharing one database, against the fake
 * OpenAI Images upstream (one key per member; the fake's own per-key counters are the witness):
 * weights inside the top priority tier over 1,000 requests, the lower tier untouched while the top
 * one is healthy and taking over when it cools down, and a concurrency limit that holds across
 * both instances.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { spawnServer, type ServerProcess } from '../support/server-process.ts';
import { IMAGE_PRO, addUpstreamMember } from '../support/upstreams.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase;
let fake: OpenAIImagesFake;
const secret = randomBytes(32);
const servers: ServerProcess[] = [];

beforeAll(async () => {
  t = await createTestDatabase();
  await seedCatalog(t.db, [IMAGE_PRO]);
  fake = await startOpenAIImagesFake({ apiKeys: ['sk-heavy', 'sk-light', 'sk-spare', 'sk-limited'] });
  for (let i = 0; i < 2; i++) {
    servers.push(
      await spawnServer({
        env: {
          DATABASE_URL: t.url,
          MEDIAGATE_SECRET_KEY: secret.toString('hex'),
          MEDIAGATE_DATA_DIR: `/tmp/mediagate-pool-routing-${process.pid}-${i}`,
          DEMO_DATA: '0',
          IMAGE_CAPACITY_WAIT_MS: '20000',
          DB_POOL_MAX: '20',
        },
      }),
    );
  }
}, 120_000);
afterAll(async () => {
  await Promise.all(servers.map((s) => s.kill('SIGKILL')));
  await fake?.close();
  await t?.destroy();
});

async function customer(members: { key: string; priority: number; weight?: number; concurrencyLimit?: number }[]) {
  const account = await createAccount(t.db, { balance: 100_000 });
  const group = await createGroup(t.db);
  for (const m of members) {
    await addUpstreamMember(t.db, secret, {
      groupId: group.id,
      name: m.key,
      provider: 'openai',
      baseUrl: `${fake.url}/v1`,
      credentials: { api_key: m.key },
      models: [IMAGE_PRO.id],
      modelMap: { [IMAGE_PRO.id]: 'gpt-image-1' },
      priority: m.priority,
      weight: m.weight ?? 1,
      concurrencyLimit: m.concurrencyLimit ?? null,
    });
  }
  return (await createApiKey(t.db, { accountId: account.id, groupId: group.id })).key;
}

/** `n` generations spread over both servers, `concurrency` at a time; returns the status codes. */
async function generateMany(key: string, n: number, concurrency: number): Promise<number[]> {
  const statuses: number[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const i = next++;
        const res = await fetch(`${servers[i % 2]!.url}/v1/images/generations`, {
          method: 'POST',
          headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
          body: JSON.stringify({ model: IMAGE_PRO.id, prompt: `request ${i}`, size: '1024x1024', response_format: 'url' }),
        });
        await res.arrayBuffer();
        statuses.push(res.status);
      }
    }),
  );
  return statuses;
}

/** Calls the fake answered with images, per member key. */
function servedByKey(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const call of fake.calls) if (call.outcome === 'ok') out[call.apiKey] = (out[call.apiKey] ?? 0) + 1;
  return out;
}

describe('pool routing across two instances', () => {
  it('splits 1,000 requests 3:1 by weight inside the top tier, never touching the lower tier while the top one is healthy', async () => {
    const key = await customer([
      { key: 'sk-heavy', priority: 10, weight: 3 },
      { key: 'sk-light', priority: 10, weight: 1 },
      { key: 'sk-spare', priority: 0 },
    ]);
    const before = servedByKey();
    const statuses = await generateMany(key, 1000, 16);
    expect(statuses.filter((s) => s === 200)).toHaveLength(1000);
    const got = (k: string) => (servedByKey()[k] ?? 0) - (before[k] ?? 0);
    // Expected 750 / 250: a share within ±5 points is over 3.6 standard deviations of a fair split.
    expect(Math.abs(got('sk-heavy') / 1000 - 0.75)).toBeLessThanOrEqual(0.05);
    expect(Math.abs(got('sk-light') / 1000 - 0.25)).toBeLessThanOrEqual(0.05);
    expect(got('sk-spare')).toBe(0);

    // Both top members rate-limited: the lower tier takes over, on both instances, with one charge each.
    fake.rateLimitNext('generations', 30, 2);
    const failover = await generateMany(key, 10, 1);
    expect(failover.every((s) => s === 200)).toBe(true);
    expect(got('sk-spare')).toBeGreaterThanOrEqual(9);
  }, 180_000);

  it('holds a member to its concurrency limit across both instances', async () => {
    const key = await customer([{ key: 'sk-limited', priority: 0, concurrencyLimit: 3 }]);
    fake.resetInFlightStats();
    fake.holdMs = 250;
    try {
      const statuses = await generateMany(key, 24, 24);
      expect(statuses.every((s) => s === 200)).toBe(true);
    } finally {
      fake.holdMs = 0;
    }
    expect(fake.maxInFlightByKey['sk-limited']).toBe(3);
  }, 120_000);
});
