/**
 * The cap of webhook deliveries in flight per target host (WEBHOOK_HOST_CONCURRENCY), under the task
 * engine on real PostgreSQL: one receiver that holds its answers takes no more than its cap of the
 * engine's slots, so another host's deliveries go out meanwhile; the deliveries put back record no
 * attempt and keep their retries; once the receiver answers, every delivery is delivered.
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

function runner() {
  return new WebhookRunner({
    repo,
    tx: createTransactor(t.db, log),
    secrets: new WebhookSecrets(repo, randomBytes(32), 86_400),
    metrics: createMetrics({ defaultMetrics: false }),
    scheduleMs: [60_000],
    timeoutMs: 20_000,
    hostConcurrency: HOST_CAP,
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
