/**
 * `POST /v1/webhooks/test` holds its request and a connection to the receiver until the receiver
 * answers (or WEBHOOK_TIMEOUT_MS): the key's requests per minute apply to it as to a generation,
 * a key has at most TESTS_IN_FLIGHT_PER_KEY tests in flight (429) and the instance at most
 * TESTS_IN_FLIGHT_TOTAL (503). A receiver on this machine holds every request until the test lets
 * it answer, so the tests in flight are exactly the requests it holds.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { TESTS_IN_FLIGHT_PER_KEY, TESTS_IN_FLIGHT_TOTAL } from '../../server/services/webhooks/webhook-tester.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

let server: TestServer;
let receiver: Server;
/** Requests the receiver holds, unanswered. */
const held: ServerResponse[] = [];
/** Requests the receiver got in all. */
let arrived = 0;
/** false: the receiver answers at once. */
let holding = true;

beforeAll(async () => {
  receiver = createServer((req, res) => {
    arrived++;
    req.resume();
    req.on('end', () => (holding ? held.push(res) : res.writeHead(204).end()));
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  server = await startTestServer({ workers: false, env: { ALLOW_PRIVATE_TARGETS: '1', WEBHOOK_TIMEOUT_MS: '20000' } });
  await seedCatalog(server.db);
});
afterEach(() => {
  release();
  holding = true;
});
afterAll(async () => {
  release();
  await server?.close();
  await new Promise<void>((r) => (receiver ? receiver.close(() => r()) : r()));
});

/** The receiver answers every request it holds. */
function release(): void {
  for (const res of held.splice(0)) res.writeHead(204).end();
}

const hookUrl = () => `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;

async function sendTest(key: string) {
  const res = await fetch(`${server.directUrl}/v1/webhooks/test`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ url: hookUrl() }),
  });
  const body = (await res.json()) as { delivered?: boolean; error?: { code: string; message: string } };
  return { status: res.status, retryAfter: res.headers.get('retry-after'), limit: res.headers.get('x-ratelimit-limit-requests'), body };
}

/** Starts `n` tests of each key and waits until the receiver holds them all (the tests are then in flight). */
async function inFlight(keys: string[], n: number) {
  const expected = held.length + keys.length * n;
  const answers = keys.flatMap((key) => Array.from({ length: n }, () => sendTest(key)));
  await until(() => held.length === expected, 10_000, `${expected} held requests`);
  return answers;
}

describe('POST /v1/webhooks/test limits', () => {
  it('refuses a key a test beyond its tests in flight with 429 too_many_in_flight, sending nothing', async () => {
    const c = await createCustomer(server.db);
    const first = await inFlight([c.key], TESTS_IN_FLIGHT_PER_KEY);
    const before = arrived;

    const refused = await sendTest(c.key);
    expect([refused.status, refused.body.error?.code, refused.retryAfter]).toEqual([429, 'too_many_in_flight', '1']);
    expect(refused.body.error?.message).toBe(`This API key already has ${TESTS_IN_FLIGHT_PER_KEY} webhook test events in flight, its limit; retry when one of them has been answered.`);
    expect(arrived).toBe(before);

    // Another key of the same instance is not held back by this one's.
    const other = await createCustomer(server.db);
    const [otherTest] = await inFlight([other.key], 1);

    release();
    for (const answer of [...first, otherTest!]) expect(await answer).toMatchObject({ status: 200, body: { delivered: true } });
    // Answered tests give their places back.
    holding = false;
    expect(await sendTest(c.key)).toMatchObject({ status: 200, body: { delivered: true } });
  });

  it(`sends ${TESTS_IN_FLIGHT_TOTAL} tests at most at once on an instance, then answers 503 server_busy`, async () => {
    const keys = await Promise.all(Array.from({ length: TESTS_IN_FLIGHT_TOTAL / TESTS_IN_FLIGHT_PER_KEY }, () => createCustomer(server.db)));
    const answers = await inFlight(keys.map((c) => c.key), TESTS_IN_FLIGHT_PER_KEY);
    expect(held).toHaveLength(TESTS_IN_FLIGHT_TOTAL);
    const before = arrived;

    const late = await createCustomer(server.db);
    const refused = await sendTest(late.key);
    expect([refused.status, refused.body.error?.code, refused.retryAfter]).toEqual([503, 'server_busy', '1']);
    expect(arrived).toBe(before);

    release();
    for (const answer of answers) expect((await answer).status).toBe(200);
    holding = false;
    expect((await sendTest(late.key)).status).toBe(200);
  });

  it("takes a token of the key's requests per minute, the same bucket as its generations", async () => {
    holding = false;
    const c = await createCustomer(server.db, { balance: 10 });
    await server.db.updateTable('apiKeys').set({ requestsPerMinute: 2 }).where('id', '=', c.apiKeyId).execute();
    const before = arrived;
    for (let i = 0; i < 2; i++) expect(await sendTest(c.key)).toMatchObject({ status: 200, limit: '2', body: { delivered: true } });

    const refused = await sendTest(c.key);
    expect([refused.status, refused.body.error?.code, refused.limit]).toEqual([429, 'rate_limited', '2']);
    expect(Number(refused.retryAfter)).toBeGreaterThanOrEqual(1);
    expect(arrived).toBe(before + 2);

    // The tests used the key's bucket: a generation of the same key is refused too.
    const generation = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'local-image-1', prompt: 'a lighthouse' }),
    });
    expect(generation.status).toBe(429);
    expect(((await generation.json()) as { error: { code: string } }).error.code).toBe('rate_limited');
  });
});
