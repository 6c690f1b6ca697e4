/**
 * A webhook delivery makes exactly the schedule's attempts (the first, then one per delay) on real
 * PostgreSQL, however its attempts are handed back: a failed attempt counts itself toward the
 * schedule in the statement that records it, so an engine reschedule that never lands (the worker
 * died, the statement failed) cannot make the next attempt reuse a delay and add one past the
 * schedule; one that lands does not count the attempt twice; the task engine itself runs it to the end.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTransactor } from '../../server/db/transaction.ts';
import { createLogger } from '../../server/logger.ts';
import { createMetrics } from '../../server/metrics.ts';
import { fenceOf } from '../../server/repositories/leased-tasks.ts';
import { WebhookRepository, type WebhookDeliveryRow } from '../../server/repositories/webhook.repository.ts';
import { WebhookRunner } from '../../server/services/webhooks/webhook-runner.ts';
import { WebhookSecrets } from '../../server/services/webhooks/webhook-secrets.ts';
import { TaskEngine } from '../../server/workers/task-engine.ts';
import { until } from '../support/tasks.ts';
import { insertPendingDelivery } from '../support/webhook-delivery.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

const log = createLogger('silent');
/** Delays far apart (a minute, an hour, a day): a recorded retry names the delay it used. */
const SCHEDULE = [60_000, 3_600_000, 86_400_000];

let t: TestDatabase;
let repo: WebhookRepository;
let receiver: Server;
/** Requests the receiver got, per delivery id (it answers 503 to every one). */
const received = new Map<string, number>();
let hookUrl: string;

beforeAll(async () => {
  t = await createTestDatabase();
  repo = new WebhookRepository(t.db);
  receiver = createServer((req, res) => {
    const id = String(req.headers['webhook-id']);
    received.set(id, (received.get(id) ?? 0) + 1);
    req.resume();
    req.on('end', () => res.writeHead(503).end());
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  hookUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;
});
afterAll(async () => {
  await new Promise<void>((r) => (receiver ? receiver.close(() => r()) : r()));
  await t?.destroy();
});

function runnerWith(scheduleMs: number[]) {
  return new WebhookRunner({
    repo,
    tx: createTransactor(t.db, log),
    secrets: new WebhookSecrets(repo, randomBytes(32), 86_400),
    metrics: createMetrics({ defaultMetrics: false }),
    scheduleMs,
    timeoutMs: 5_000,
    allowPrivate: true,
  });
}

/** A finished video task with a pending delivery to the receiver. */
const pendingDelivery = () => insertPendingDelivery(t.db, hookUrl);

/** The next retry and the lease of a worker that died are both over: the row is due again. */
async function timePasses(id: string): Promise<void> {
  await t.db
    .updateTable('webhookDeliveries')
    .set({ nextRunAt: sql`now() - interval '1 second'`, leaseExpiresAt: sql`case when lease_expires_at is null then null else now() - interval '1 second' end` })
    .where('id', '=', id)
    .execute();
}

async function claim(id: string): Promise<WebhookDeliveryRow | undefined> {
  return (await repo.leases.claimDue('w_test', 100, 30_000)).find((d) => d.id === id);
}

/** Which delay of SCHEDULE each retried attempt waited for (its next retry after it was made, jitter included). */
async function delaysUsed(id: string): Promise<(number | null)[]> {
  return (await repo.attemptsOf(id)).map((a) => {
    if (!a.nextRetryAt) return null;
    const waited = a.nextRetryAt.getTime() - a.attemptedAt.getTime();
    return SCHEDULE.findIndex((d) => waited >= d - 10_000 && waited <= d * 1.1 + 10_000);
  });
}

describe('webhook delivery retries', () => {
  it('counts each failed attempt once when the engine\'s reschedule never lands, and gives up after the schedule', async () => {
    const runner = runnerWith(SCHEDULE);
    const id = await pendingDelivery();
    for (let k = 0; k <= SCHEDULE.length; k++) {
      const row = await claim(id);
      expect(row, `attempt ${k + 1} is due`).toBeDefined();
      // The schedule's position: the attempts made so far, whatever became of their reschedules.
      expect(row!.retries, `attempt ${k + 1}`).toBe(k);
      const result = await runner.step(row!, new AbortController().signal, log);
      expect(result.done, `attempt ${k + 1}`).toBe(k === SCHEDULE.length);
      // No reschedule: the worker died before it, or its statement failed.
      await timePasses(id);
    }
    const delivery = (await repo.find(id))!;
    expect([delivery.status, delivery.retries]).toEqual(['failed', SCHEDULE.length]);
    expect(await delaysUsed(id)).toEqual([0, 1, 2, null]);
    expect(received.get(id)).toBe(SCHEDULE.length + 1);
    expect(await claim(id)).toBeUndefined();
  });

  it('counts each failed attempt once when the engine\'s reschedule lands', async () => {
    const runner = runnerWith(SCHEDULE);
    const id = await pendingDelivery();
    for (let k = 0; k <= SCHEDULE.length; k++) {
      const row = await claim(id);
      expect(row?.retries, `attempt ${k + 1}`).toBe(k);
      const result = await runner.step(row!, new AbortController().signal, log);
      if (result.done) break;
      // What the engine's hand-back does with the step's result.
      expect(await repo.leases.reschedule(fenceOf(row!), result.nextInMs, { failed: result.failed, error: result.error })).toBe(true);
      const rescheduled = (await repo.find(id))!;
      expect([rescheduled.retries, rescheduled.leaseOwner], `after attempt ${k + 1}`).toEqual([k + 1, null]);
      await timePasses(id);
    }
    expect((await repo.find(id))!.status).toBe('failed');
    expect(await delaysUsed(id)).toEqual([0, 1, 2, null]);
    expect(received.get(id)).toBe(SCHEDULE.length + 1);
  });

  it('makes exactly the schedule\'s attempts under the task engine', async () => {
    const schedule = [20, 20, 20];
    const id = await pendingDelivery();
    const engine = new TaskEngine(runnerWith(schedule), log, { leaseMs: 5_000, pollMs: 20, concurrency: 1 });
    engine.start();
    try {
      const delivery = await until(async () => {
        const d = await repo.find(id);
        return d?.status !== 'pending' && d;
      });
      expect([delivery.status, delivery.retries]).toEqual(['failed', schedule.length]);
    } finally {
      await engine.stop();
    }
    expect((await repo.attemptsOf(id)).map((a) => a.statusCode)).toEqual([503, 503, 503, 503]);
    expect(received.get(id)).toBe(schedule.length + 1);
  });
});
