/**
 * The 429 backoff of a member without Retry-After (1 s, doubling up to 60 s), as member health
 * records it on real Postgres: a Kling member at its parallel-task limit refuses every submit with
 * 1303 while the polls of the jobs it runs keep succeeding. Those polls (`observeAccepted`) do not
 * restart the doubling; new work the member takes (`observe`) in a call that started after the
 * 429 does, and a submit that was already in flight when the 429 came does not. A burst (the calls in
 * flight when the member began refusing, answered 429 together) is one step of the doubling. A
 * client refused by such a member is told the cooldown the gateway put it under (Retry-After), not 1 s;
 * refused by several, the wait of the one that is free first.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RATE_LIMIT_BACKOFF } from '../../server/pool/member-health.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { UpstreamAccount } from '../../server/providers/types.ts';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { createAccount, createApiKey, createGroup, createMember, seedCatalog } from '../support/factories.ts';
import { IMAGE_PRO, addUpstreamMember } from '../support/upstreams.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
let openai: OpenAIImagesFake;
beforeAll(async () => {
  openai = await startOpenAIImagesFake({ apiKeys: ['sk-a'] });
  server = await startTestServer({ env: { IMAGE_CAPACITY_WAIT_MS: '0' } });
  await seedCatalog(server.db, [IMAGE_PRO]);
});
afterAll(async () => {
  await server?.close();
  await openai?.close();
});

async function klingMember(): Promise<UpstreamAccount> {
  const group = await createGroup(server.db);
  const { id } = await createMember(server.db, group.id, { provider: 'kling', models: ['local-video-1'] });
  return { memberId: id, provider: 'kling', baseUrl: null, credentials: {}, modelMap: {} };
}

/** A submit refused at Kling's parallel-task limit (1303: rate limited, no Retry-After). */
async function refusedSubmit(account: UpstreamAccount): Promise<void> {
  const limited = new ProviderError('rate_limited', 'parallel task over resource pack limit', { upstreamCode: '1303' });
  await expect(server.ctx.pool.health.observe(account, () => Promise.reject(limited))).rejects.toBe(limited);
}

async function healthOf(account: UpstreamAccount) {
  const row = await server.db.selectFrom('memberHealth').select(['cooldownUntil', 'updatedAt', 'rateLimitStrikes']).where('memberId', '=', account.memberId).executeTakeFirstOrThrow();
  return { cooldownSeconds: (row.cooldownUntil!.getTime() - row.updatedAt.getTime()) / 1000, strikes: row.rateLimitStrikes };
}

describe('the 429 backoff of a member', () => {
  it('keeps doubling over refused submits while polls of the jobs it runs succeed', async () => {
    const account = await klingMember();
    const health = server.ctx.pool.health;
    const cooldowns: number[] = [];
    for (let i = 0; i < 4; i++) {
      await refusedSubmit(account);
      cooldowns.push((await healthOf(account)).cooldownSeconds);
      await health.observeAccepted(account, async () => ({ state: 'running' }));
      await health.flush();
    }
    expect(cooldowns).toEqual([1, 2, 4, 8].map((n) => (n * RATE_LIMIT_BACKOFF.baseMs) / 1000));
  });

  it('counts a burst of concurrent 429s as one strike: 1 s for the burst, then 2 s for the next 429', async () => {
    const account = await klingMember();
    const limited = new ProviderError('rate_limited', 'parallel task over resource pack limit', { upstreamCode: '1303' });
    // Eight calls in flight together, refused together.
    let refuse!: () => void;
    const refused = new Promise<void>((resolve) => (refuse = resolve));
    const calls = Array.from({ length: 8 }, () => server.ctx.pool.health.observe(account, async () => {
      await refused;
      throw limited;
    }));
    // Refused a while after they started, as an upstream answers (a burst is told apart by start times).
    await new Promise((r) => setTimeout(r, 300));
    refuse();
    const outcomes = await Promise.allSettled(calls);
    expect(outcomes.map((o) => (o.status === 'rejected' ? o.reason : o))).toEqual(Array(8).fill(limited));
    // (Their statements commit in any order: the cooldown is the latest one's 1 s, give or take its start.)
    const burst = await healthOf(account);
    expect(burst.strikes).toBe(1);
    expect(burst.cooldownSeconds).toBeCloseTo(1, 1);
    // The next 429, a call started after the burst was recorded: the next step, not the ninth.
    await refusedSubmit(account);
    expect(await healthOf(account)).toEqual({ cooldownSeconds: 2, strikes: 2 });
  });

  it('cools for the Retry-After the upstream gave, whatever the strikes', async () => {
    const account = await klingMember();
    for (let i = 0; i < 3; i++) await refusedSubmit(account);
    const told = new ProviderError('rate_limited', 'slow down', { retryAfterMs: 1500 });
    await expect(server.ctx.pool.health.observe(account, () => Promise.reject(told))).rejects.toBe(told);
    // The longer cooldown already set (4 s) stays; a Retry-After never shortens it.
    expect((await healthOf(account)).cooldownSeconds).toBeCloseTo(4, 1);
    const fresh = await klingMember();
    await expect(server.ctx.pool.health.observe(fresh, () => Promise.reject(told))).rejects.toBe(told);
    expect(await healthOf(fresh)).toEqual({ cooldownSeconds: 1.5, strikes: 1 });
  });

  it('restarts on new work the member took after the 429, not on a submit already in flight when it came', async () => {
    const account = await klingMember();
    const health = server.ctx.pool.health;
    let accept!: (jobId: string) => void;
    const inFlight = health.observe(account, () => new Promise<string>((resolve) => (accept = resolve)));
    // The 429 is recorded after the in-flight submit started (the database's clock: its own trip apart).
    await new Promise((r) => setTimeout(r, 50));
    await refusedSubmit(account);
    accept('job-started-before');
    await inFlight;
    await health.flush();
    expect((await healthOf(account)).strikes).toBe(1);

    await health.observe(account, async () => 'job-started-after');
    await health.flush();
    expect((await healthOf(account)).strikes).toBe(0);
  });
});

describe('a client refused by a rate-limited member', () => {
  it('is told the cooldown the gateway put the member under (its backoff), when the upstream gave no Retry-After', async () => {
    const account = await createAccount(server.db, { balance: 100 });
    const group = await createGroup(server.db);
    const member = await addUpstreamMember(server.db, server.secretKey, {
      groupId: group.id, name: 'only', provider: 'openai', baseUrl: `${openai.url}/v1`, credentials: { api_key: 'sk-a' },
      models: [IMAGE_PRO.id], modelMap: { [IMAGE_PRO.id]: 'gpt-image-1.5' }, priority: 0, weight: 1, concurrencyLimit: null,
    });
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    // Four strikes already: the next 429 puts the member aside 16 s.
    await sql`insert into member_health (member_id, rate_limit_strikes) values (${member.id}, 4)`.execute(server.db);
    server.ctx.services.invalidateCaches();
    openai.faults.push('generations', { status: 429, body: { error: { message: 'Rate limit reached', type: 'requests', param: null, code: 'rate_limit_exceeded' } } }, 1);
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: IMAGE_PRO.id, prompt: 'x', size: '1024x1024' }),
    });
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect([res.status, body.error.code, res.headers.get('retry-after')]).toEqual([503, 'no_upstream_capacity', '16']);
    expect(body.error.message).toContain('retry in 16 s');
  });

  it("is told the shortest wait of the members it was refused by, not the last one's", async () => {
    const account = await createAccount(server.db, { balance: 100 });
    const group = await createGroup(server.db);
    const member = (name: string, priority: number, apiKey: string) =>
      addUpstreamMember(server.db, server.secretKey, {
        groupId: group.id, name, provider: 'openai', baseUrl: `${openai.url}/v1`, credentials: { api_key: apiKey },
        models: [IMAGE_PRO.id], modelMap: { [IMAGE_PRO.id]: 'gpt-image-1.5' }, priority, weight: 1, concurrencyLimit: null,
      });
    // Tried first: Retry-After 3. Tried last: four strikes already, so its 429 puts it aside 16 s.
    await member('first', 10, 'sk-a');
    const last = await member('last', 0, 'sk-a');
    await sql`insert into member_health (member_id, rate_limit_strikes) values (${last.id}, 4)`.execute(server.db);
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    server.ctx.services.invalidateCaches();
    openai.rateLimitNext('generations', 3);
    openai.faults.push('generations', { status: 429, body: { error: { message: 'Rate limit reached', type: 'requests', param: null, code: 'rate_limit_exceeded' } } }, 1);
    const calls = openai.calls.length;
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: IMAGE_PRO.id, prompt: 'x', size: '1024x1024' }),
    });
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect(openai.calls.length - calls).toBe(2);
    expect([res.status, body.error.code, res.headers.get('retry-after')]).toEqual([503, 'no_upstream_capacity', '3']);
    expect(body.error.message).toContain('retry in 3 s');
  });
});
