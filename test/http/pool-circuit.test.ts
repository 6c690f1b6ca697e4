/**
 * The circuit of a member through the public API (issue 26, item 7), against two fake OpenAI Images
 * upstreams: the `flaky` member's (priority 10), which goes away, and the `spare` member's (priority
 * 0), which serves whatever the flaky one cannot. The calls in flight when an upstream goes away
 * count as one failure; once the cooldown is over exactly one probe goes through, whose success
 * closes the circuit at once and whose failure re-opens it for twice as long; a success of a call
 * that started after the last counted failure closes it too, one of a call already running does not.
 * The end of a cooldown is brought forward in the database instead of waited for.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { CIRCUIT } from '../../server/pool/member-health.ts';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';
import { IMAGE_PRO, addUpstreamMember } from '../support/upstreams.ts';

let server: TestServer;
let flaky: OpenAIImagesFake;
let spare: OpenAIImagesFake;

beforeAll(async () => {
  flaky = await startOpenAIImagesFake({ apiKeys: ['sk-flaky'] });
  spare = await startOpenAIImagesFake({ apiKeys: ['sk-spare'] });
  server = await startTestServer();
  await seedCatalog(server.db, [IMAGE_PRO]);
});
afterAll(async () => {
  await server?.close();
  await flaky?.close();
  await spare?.close();
});
beforeEach(() => {
  flaky.faults.clear();
  flaky.resume();
});

/** A customer whose group has the flaky member and, below it, the spare one. */
async function customer() {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const member = async (name: string, fake: OpenAIImagesFake, priority: number) =>
    (
      await addUpstreamMember(server.db, server.secretKey, {
        groupId: group.id,
        name,
        provider: 'openai',
        baseUrl: `${fake.url}/v1`,
        credentials: { api_key: `sk-${name}` },
        models: [IMAGE_PRO.id],
        modelMap: { [IMAGE_PRO.id]: 'gpt-image-1.5' },
        priority,
      })
    ).id;
  const ids = { flaky: await member('flaky', flaky, 10), spare: await member('spare', spare, 0) };
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { key: key.key, groupId: group.id, ids };
}
type Customer = Awaited<ReturnType<typeof customer>>;

/** One synchronous generation; `memberId` is the member that served it (from its task row). */
async function generate(c: Customer, prompt = 'a lighthouse at dusk') {
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: IMAGE_PRO.id, prompt, size: '1024x1024', response_format: 'url' }),
  });
  await res.arrayBuffer();
  const taskId = res.headers.get('x-task-id')!;
  const task = await server.db.selectFrom('imageTasks').select('memberId').where('id', '=', taskId).executeTakeFirstOrThrow();
  return { status: res.status, memberId: task.memberId };
}

/**
 * The member's shared health, with the time left of its cooldown on the database's clock, and the
 * length of the cooldown: from the counted failure that set it (both written by one statement, with
 * one now()) to its end.
 */
async function health(memberId: string) {
  return server.db
    .selectFrom('memberHealth')
    .select([
      'consecutiveFailures',
      'cooldownReason',
      'probeUntil',
      'failures',
      sql<number | null>`(extract(epoch from cooldown_until - now()) * 1000)::float8`.as('cooldownLeftMs'),
      sql<number | null>`(extract(epoch from cooldown_until - failure_counted_at) * 1000)::float8`.as('cooldownMs'),
    ])
    .where('memberId', '=', memberId)
    .executeTakeFirstOrThrow();
}

async function circuitView(c: Customer) {
  const { data } = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: c.groupId } } });
  return data!.data.find((m) => m.id === c.ids.flaky)!.health.circuit;
}

/** Three failures in a row, one request after the other: the flaky member's circuit opens for 30 s. */
async function openCircuit(c: Customer) {
  for (let i = 0; i < CIRCUIT.threshold; i++) {
    flaky.serverErrorNext('generations', 503);
    expect(await generate(c)).toEqual({ status: 200, memberId: c.ids.spare });
  }
  expect(await health(c.ids.flaky)).toMatchObject({ consecutiveFailures: 3, cooldownReason: 'circuit_open' });
}

/** The cooldown is over (as if its time had passed); the in-process server has no cluster listener to hear the NOTIFY. */
async function endCooldown(memberId: string) {
  await server.db.updateTable('memberHealth').set({ cooldownUntil: sql`now() - interval '1 millisecond'` }).where('memberId', '=', memberId).execute();
  server.ctx.pool.invalidate();
}

/**
 * Sends `n` requests while the probe is held upstream; resolves once they are all answered, or as
 * soon as a second call reached the flaky member (a member without a half-open state lets them all
 * through, and they would wait there as long as the probe).
 */
async function meanwhile(c: Customer, n: number) {
  const answers: Awaited<ReturnType<typeof generate>>[] = [];
  const requests = Array.from({ length: n }, (_, i) => generate(c, `meanwhile ${i}`).then((r) => answers.push(r)));
  await until(() => answers.length === n || (flaky.inFlightByKey['sk-flaky'] ?? 0) > 1, 15_000, 'the other requests');
  return { answers, requests };
}

describe('the circuit of a member', () => {
  it('counts the calls in flight when the upstream went away as one failure: the circuit opens for its base length, not 5 minutes', async () => {
    const c = await customer();
    // Two failures in a row first: the outage is the third.
    for (let i = 0; i < 2; i++) {
      flaky.serverErrorNext('generations', 503);
      expect(await generate(c)).toEqual({ status: 200, memberId: c.ids.spare });
    }
    expect(await health(c.ids.flaky)).toMatchObject({ consecutiveFailures: 2, cooldownReason: null });

    flaky.pause();
    const pending = Array.from({ length: 20 }, (_, i) => generate(c, `in flight ${i}`));
    await until(() => flaky.inFlightByKey['sk-flaky'] === 20, 15_000, '20 calls in flight');
    // They have been running a while when the upstream goes away. A failure's start is placed on
    // PostgreSQL's clock from the time since it, measured as its statement leaves: on a loaded
    // machine that statement's trip can make a call started just before the outage look started
    // after the first counted failure (harmless: an outage counted twice), which this test is not about.
    await new Promise((r) => setTimeout(r, 300));
    // The upstream goes away: every connection to it drops at once.
    flaky.server.closeAllConnections();
    const results = await Promise.all(pending);
    flaky.resume();

    // Each request failed there, none moved to the spare: its call was sent, so the upstream may have
    // taken it (and billed it). All 20 failures are in the member's recent counts.
    expect(results).toEqual(Array(20).fill({ status: 502, memberId: c.ids.flaky }));
    const h = await health(c.ids.flaky);
    expect(h).toMatchObject({ consecutiveFailures: 3, cooldownReason: 'circuit_open', failures: 22, cooldownMs: CIRCUIT.baseMs });
    expect(h.cooldownLeftMs).toBeGreaterThan(0);
    expect(await circuitView(c)).toBe('open');
  });

  it('lets exactly one probe through once the cooldown is over, and closes the circuit the moment it succeeds', async () => {
    const c = await customer();
    await openCircuit(c);
    await endCooldown(c.ids.flaky);

    flaky.pause();
    try {
      const probe = generate(c, 'probe');
      await until(() => flaky.inFlightByKey['sk-flaky'] === 1, 15_000, 'the probe');
      expect(await circuitView(c)).toBe('half_open');
      // While the probe runs, the member is left alone.
      const { answers } = await meanwhile(c, 4);
      expect(flaky.inFlightByKey['sk-flaky']).toBe(1);
      expect(answers).toEqual(Array(4).fill({ status: 200, memberId: c.ids.spare }));
      flaky.resume();
      expect(await probe).toEqual({ status: 200, memberId: c.ids.flaky });
    } finally {
      flaky.resume();
    }
    // Written with the answer, not with the next batch of successes a second later.
    expect(await health(c.ids.flaky)).toMatchObject({ consecutiveFailures: 0, cooldownReason: null, cooldownLeftMs: null, probeUntil: null });
    expect(await circuitView(c)).toBe('closed');
    expect(await generate(c, 'right after')).toEqual({ status: 200, memberId: c.ids.flaky });
  });

  it('re-opens the circuit for twice as long when the probe fails', async () => {
    const c = await customer();
    await openCircuit(c);
    await endCooldown(c.ids.flaky);

    flaky.pause();
    try {
      const probe = generate(c, 'probe');
      await until(() => flaky.inFlightByKey['sk-flaky'] === 1, 15_000, 'the probe');
      const { answers } = await meanwhile(c, 3);
      expect(flaky.inFlightByKey['sk-flaky']).toBe(1);
      expect(answers).toEqual(Array(3).fill({ status: 200, memberId: c.ids.spare }));
      // The upstream is still away: the probe's connection drops after it was sent, so the request
      // fails there rather than moving to the spare (the upstream may have taken it).
      flaky.server.closeAllConnections();
      expect(await probe).toEqual({ status: 502, memberId: c.ids.flaky });
    } finally {
      flaky.resume();
    }
    const h = await health(c.ids.flaky);
    expect(h).toMatchObject({ consecutiveFailures: 4, cooldownReason: 'circuit_open', probeUntil: null, cooldownMs: 2 * CIRCUIT.baseMs });
    expect(h.cooldownLeftMs).toBeGreaterThan(0);
    expect(await circuitView(c)).toBe('open');
    expect(await generate(c, 'after the probe')).toEqual({ status: 200, memberId: c.ids.spare });
  });

  it('closes on a success of a call that started after the last counted failure, not of one that was already running', async () => {
    const c = await customer();
    const { pool } = server.ctx;
    const account = (await pool.account(c.ids.flaky))!;
    // A call already running when the member began failing (a long download of an accepted job, say).
    let finish!: () => void;
    const running = pool.health.observe(account, () => new Promise<void>((resolve) => (finish = resolve)));
    await openCircuit(c);
    finish();
    await running;
    await pool.health.flush();
    expect(await health(c.ids.flaky)).toMatchObject({ consecutiveFailures: 3, cooldownReason: 'circuit_open' });

    // A call that started after (a sticky poll, say) is answered: the member is back for everyone.
    await pool.health.observe(account, async () => undefined);
    await pool.health.flush();
    expect(await health(c.ids.flaky)).toMatchObject({ consecutiveFailures: 0, cooldownReason: null, cooldownLeftMs: null });
    server.ctx.pool.invalidate();
    expect(await generate(c)).toEqual({ status: 200, memberId: c.ids.flaky });
  });
});
