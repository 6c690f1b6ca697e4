/**
 * The 429 backoff of a member without Retry-After (1 s, doubling up to 60 s), as member health
 * records it on real Postgres: a Kling member at its parallel-task limit refuses every submit with
 * 1303 while the polls of the jobs it runs keep succeeding. Those polls (`observeAccepted`) do not
 * restart the doubling; new work the member takes (`observe`) in a call that started after the
 * 429 does, and a submit that was already in flight when the 429 came does not. A burst (the calls in
 * flight when the member began refusing, answered 429 together) is one step of the doubling.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RATE_LIMIT_BACKOFF } from '../../server/pool/member-health.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { UpstreamAccount } from '../../server/providers/types.ts';
import { createGroup, createMember } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => server?.close());

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
