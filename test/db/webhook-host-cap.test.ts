/**
 * The cap of webhook deliveries in flight per target host (WEBHOOK_HOST_CONCURRENCY), under the task
 * engine on real PostgreSQL: one receiver that holds its answers takes no more than its cap of the
 * engine's slots, so another host's deliveries go out meanwhile; the deliveries put back record no
 * attempt and keep their retries; once the receiver answers, every delivery is delivered. So for the
 * cap per account (WEBHOOK_ACCOUNT_CONCURRENCY): one account's receivers that never answer, under
 * as many hosts and ports as it likes, take no more than its cap.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTransactor } from '../../server/db/transaction.ts';
import { createLogger } from '../../server/logger.ts';
import { createMetrics } from '../../server/metrics.ts';
import { WebhookRepository } from '../../server/repositories/webhook.repository.ts';
import { WebhookRunner } from '../../server/services/webhooks/webhook-runner.ts';
import { WebhookSecrets } from '../../server/services/webhooks/webhook-secrets.ts';
import { TaskEngine, type StepOutcome } from '../../server/workers/task-engine.ts';
import { createCustomer } from '../support/factories.ts';
import { until } from '../support/tasks.ts';
import { insertPendingDelivery } from '../support/webhook-delivery.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

const log = createLogger('silent');
const HOST_CAP = 2;

let t: TestDatabase;
let repo: WebhookRepository;
let slow: Server;
let healthy: Server;
let slowUrl: string;
let healthyUrl: string;
/** Answers the slow receiver holds until `releaseSlow`; after it, it answers at once. */
let held: ServerResponse[] = [];
let slowAnswers = false;
/** Requests each receiver got, and the most the slow one held at once. */
let slowRequests = 0;
let healthyRequests = 0;
let mostHeld = 0;

function listen(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<[Server, string]> {
  const server = createServer(handler);
  return new Promise((r) => server.listen(0, '127.0.0.1', () => r([server, `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`])));
}

beforeAll(async () => {
  t = await createTestDatabase();
  repo = new WebhookRepository(t.db);
  [slow, slowUrl] = await listen((req, res) => {
    slowRequests++;
    req.resume();
    req.on('end', () => {
      if (slowAnswers) return void res.writeHead(204).end();
      held.push(res);
      mostHeld = Math.max(mostHeld, held.length);
    });
  });
  [healthy, healthyUrl] = await listen((req, res) => {
    healthyRequests++;
    req.resume();
    req.on('end', () => res.writeHead(204).end());
  });
});
afterAll(async () => {
  releaseSlow();
  for (const s of [slow, healthy]) if (s) await new Promise<void>((r) => s.close(() => r()));
  await t?.destroy();
});

function releaseSlow(): void {
  slowAnswers = true;
  for (const res of held) res.writeHead(204).end();
  held = [];
}

function runner(accountConcurrency?: number) {
  return new WebhookRunner({
    repo,
    tx: createTransactor(t.db, log),
    secrets: new WebhookSecrets(repo, randomBytes(32), 86_400),
    metrics: createMetrics({ defaultMetrics: false }),
    scheduleMs: [60_000],
    timeoutMs: 20_000,
    hostConcurrency: HOST_CAP,
    ...(accountConcurrency !== undefined && { accountConcurrency }),
    allowPrivate: true,
  });
}

const deliveries = (ids: string[]) => t.db.selectFrom('webhookDeliveries').select(['id', 'status', 'retries']).where('id', 'in', ids).execute();
const attemptsOf = async (ids: string[]) => (await t.db.selectFrom('webhookAttempts').select('deliveryId').where('deliveryId', 'in', ids).execute()).length;

describe('webhook deliveries per host', () => {
  it('sends other hosts\' deliveries while one host holds its cap, puts the rest back without an attempt, and delivers all once it answers', async () => {
    // The slow host's deliveries are due first: without a cap they would fill every slot of the engine.
    const slowIds: string[] = [];
    for (let i = 0; i < 6; i++) slowIds.push(await insertPendingDelivery(t.db, slowUrl));
    const healthyIds: string[] = [];
    for (let i = 0; i < 3; i++) healthyIds.push(await insertPendingDelivery(t.db, healthyUrl));
    await t.db.updateTable('webhookDeliveries').set({ nextRunAt: sql`now() - interval '1 minute'` }).where('id', 'in', slowIds).execute();

    const outcomes: StepOutcome[] = [];
    const engine = new TaskEngine(runner(), log, { leaseMs: 30_000, pollMs: 20, concurrency: 4, onStep: (o) => outcomes.push(o) });
    engine.start();
    try {
      await until(async () => (await deliveries(healthyIds)).every((d) => d.status === 'delivered'), 10_000, 'the healthy host\'s deliveries');
      expect(healthyRequests).toBe(3);
      // The slow host holds exactly its cap, and nothing more was sent to it.
      expect(held.length).toBe(HOST_CAP);
      expect(slowRequests).toBe(HOST_CAP);
      // The deliveries put back: still pending, no attempt recorded, their retries untouched.
      const slowRows = await deliveries(slowIds);
      expect(slowRows.map((d) => [d.status, d.retries])).toEqual(slowIds.map(() => ['pending', 0]));
      expect(await attemptsOf(slowIds)).toBe(0);
      expect(outcomes.filter((o) => o === 'next').length).toBeGreaterThanOrEqual(slowIds.length - HOST_CAP);

      releaseSlow();
      // The host's cap still holds (those claimed together beyond it are put back again): time passes
      // for the deliveries put back, which are due at once instead of a few seconds later.
      await until(
        async () => {
          await t.db.updateTable('webhookDeliveries').set({ nextRunAt: sql`now()` }).where('id', 'in', slowIds).where('status', '=', 'pending').where('leaseOwner', 'is', null).execute();
          return (await deliveries(slowIds)).every((d) => d.status === 'delivered');
        },
        15_000,
        'the slow host\'s deliveries',
      );
    } finally {
      await engine.stop();
    }
    // One attempt each, the first: being put back was no attempt and counted no retry.
    expect((await deliveries(slowIds)).map((d) => d.retries)).toEqual(slowIds.map(() => 0));
    expect(await attemptsOf(slowIds)).toBe(slowIds.length);
    expect(slowRequests).toBe(slowIds.length);
    expect(mostHeld).toBe(HOST_CAP);
  });
});

describe('webhook deliveries per account', () => {
  it("one account's receivers that never answer, under several hosts, hold no more than its cap: another account's delivery goes out meanwhile", async () => {
    const ACCOUNT_CAP = 2;
    // Two receivers of one account on two ports (as many names as a wildcard DNS gives): each under the host cap.
    const hanging: ServerResponse[] = [];
    const receivers: Server[] = [];
    const urls: string[] = [];
    let received = 0;
    for (let i = 0; i < 2; i++) {
      const [server, url] = await listen((req, res) => {
        received++;
        req.resume();
        req.on('end', () => hanging.push(res));
      });
      receivers.push(server);
      urls.push(url);
    }
    const account = await createCustomer(t.db);
    const ownIds: string[] = [];
    for (const url of urls) for (let i = 0; i < HOST_CAP; i++) ownIds.push(await insertPendingDelivery(t.db, url, account));
    await t.db.updateTable('webhookDeliveries').set({ nextRunAt: sql`now() - interval '1 minute'` }).where('id', 'in', ownIds).execute();
    const before = healthyRequests;
    const other = await insertPendingDelivery(t.db, healthyUrl);

    // Four slots in the engine: without the account's cap its four deliveries (two per host) would take them all.
    const engine = new TaskEngine(runner(ACCOUNT_CAP), log, { leaseMs: 30_000, pollMs: 20, concurrency: 4 });
    engine.start();
    try {
      await until(async () => (await deliveries([other]))[0]!.status === 'delivered', 10_000, "the other account's delivery");
      expect(healthyRequests).toBe(before + 1);
      expect([received, hanging.length]).toEqual([ACCOUNT_CAP, ACCOUNT_CAP]);
      // Those put back: pending, no attempt, retries untouched.
      expect((await deliveries(ownIds)).every((d) => d.status === 'pending' && d.retries === 0)).toBe(true);
      expect(await attemptsOf(ownIds)).toBe(0);
    } finally {
      for (const res of hanging) res.destroy();
      await engine.stop();
      for (const server of receivers) await new Promise<void>((r) => server.close(() => r()));
    }
  });
});
