/**
 * The webhook outbox's writes of an attempt on real PostgreSQL: an error text longer than the admin
 * views allow is cut where it is recorded, and an attempt to be retried leaves its row due at the
 * next retry even when the worker dies before the engine reschedules it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fenceOf } from '../../server/repositories/leased-tasks.ts';
import { MAX_ERROR_LENGTH, WebhookRepository, type AttemptRecord } from '../../server/repositories/webhook.repository.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { insertPendingDelivery } from '../support/webhook-delivery.ts';

let t: TestDatabase;
let repo: WebhookRepository;

beforeAll(async () => {
  t = await createTestDatabase();
  repo = new WebhookRepository(t.db);
});
afterAll(async () => t?.destroy());

/** A finished video task with a pending delivery, claimed by a worker for `leaseMs`. */
async function claimedDelivery(leaseMs = 30_000) {
  const id = await insertPendingDelivery(t.db, 'https://hooks.example.com/x');
  const claimed = (await repo.leases.claimDue('w_test', 100, leaseMs)).find((d) => d.id === id);
  expect(claimed).toBeDefined();
  return claimed!;
}

const failedAttempt = (o: Partial<AttemptRecord> = {}): AttemptRecord => ({ statusCode: null, errorClass: 'tls_error', error: 'TLS failed', latencyMs: 12, nextRetryAt: new Date(Date.now() + 3600_000), ...o });

describe('webhook deliveries', () => {
  it('cuts an attempt\'s error, and a given-up delivery\'s reason, to the admin views\' 1000 characters', async () => {
    const delivery = await claimedDelivery();
    const long = `TLS failed: ${'DNS:site.cdn.example.com, '.repeat(100)}`;
    expect(await t.db.transaction().execute((trx) => repo.recordAttempt(fenceOf(delivery), failedAttempt({ error: long }), undefined, trx))).toBe(true);
    const [attempt] = await repo.attemptsOf(delivery.id);
    expect(attempt!.error).toHaveLength(MAX_ERROR_LENGTH);
    expect(attempt!.error).toBe(`${long.slice(0, MAX_ERROR_LENGTH - 1)}…`);
    expect((await repo.find(delivery.id))!.lastError).toBe(attempt!.error);

    const other = await claimedDelivery();
    expect(await repo.markFailed(fenceOf(other), `the delivery could not be run: ${'x'.repeat(5000)}`)).toBe(true);
    const failed = (await repo.find(other.id))!;
    expect([failed.status, failed.lastError!.length]).toEqual(['failed', MAX_ERROR_LENGTH]);
  });

  it('leaves an attempt to be retried due at its next retry, not at the lease\'s end, should the worker die before rescheduling', async () => {
    const delivery = await claimedDelivery(100);
    const nextRetryAt = new Date(Date.now() + 3600_000);
    await t.db.transaction().execute((trx) => repo.recordAttempt(fenceOf(delivery), failedAttempt({ nextRetryAt }), undefined, trx));
    // No reschedule follows (the worker died): the lease runs out, and the row is not due before its retry.
    await new Promise((r) => setTimeout(r, 200));
    expect((await repo.leases.claimDue('w_other', 100, 30_000)).map((d) => d.id)).not.toContain(delivery.id);
    expect((await repo.find(delivery.id))!.nextRunAt).toEqual(nextRetryAt);
  });
});
