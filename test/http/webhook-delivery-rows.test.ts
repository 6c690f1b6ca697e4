/**
 * What the operator's views of a webhook delivery say when it goes wrong before anything is sent,
 * and after a redelivery. The server runs its workers with a retry schedule of a minute and an hour,
 * so a delivery that waits for a retry stays visibly pending while a test looks at it.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encryptSecret } from '../../server/lib/secret-box.ts';
import { seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';
import { insertPendingDelivery } from '../support/webhook-delivery.ts';

let server: TestServer;
let receiver: Server;
/** The receiver's answer per path (204 for any other), and the requests it got per path. */
const answers = new Map<string, number>();
const received = new Map<string, number>();

beforeAll(async () => {
  receiver = createServer((req, res) => {
    const path = req.url ?? '/';
    received.set(path, (received.get(path) ?? 0) + 1);
    req.resume();
    req.on('end', () => res.writeHead(answers.get(path) ?? 204).end());
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  server = await startTestServer({ workers: true, env: { ALLOW_PRIVATE_TARGETS: '1', WEBHOOK_RETRY_SCHEDULE_MS: '60000,3600000', WEBHOOK_TIMEOUT_MS: '2000' } });
  await seedCatalog(server.db);
});
afterAll(async () => {
  await server?.close();
  await new Promise<void>((r) => (receiver ? receiver.close(() => r()) : r()));
});

const hookUrl = (path: string) => `http://127.0.0.1:${(receiver.address() as AddressInfo).port}${path}`;

/** A pending delivery to `path` of a finished task: its task id and account. */
async function pendingDelivery(path: string): Promise<{ taskId: string; accountId: string }> {
  const id = await insertPendingDelivery(server.db, hookUrl(path));
  return server.db.selectFrom('webhookDeliveries').select(['taskId', 'accountId']).where('id', '=', id).executeTakeFirstOrThrow();
}

async function deliveryOf(taskId: string) {
  const { data, response } = await server.admin().GET('/admin/v1/tasks/{task_id}/webhook', { params: { path: { task_id: taskId } } });
  expect(response.status).toBe(200);
  return data!.delivery!;
}

/** The delivery once a worker has finished a step of it: it is no longer leased and was tried (or ended). */
async function afterFirstStep(taskId: string) {
  await until(async () => {
    const row = await server.db.selectFrom('webhookDeliveries').select(['status', 'retries', 'leaseOwner']).where('taskId', '=', taskId).executeTakeFirstOrThrow();
    return row.leaseOwner === null && (row.status !== 'pending' || row.retries > 0);
  }, 10_000, 'the first step of the delivery');
  return deliveryOf(taskId);
}

async function redeliver(taskId: string) {
  const { data, response } = await server.admin().POST('/admin/v1/tasks/{task_id}/webhook/redeliver', { params: { path: { task_id: taskId } } });
  expect(response.status).toBe(200);
  return data!.delivery!;
}

describe('webhook deliveries that cannot be sent', () => {
  it("gives a delivery up at once, its reason shown, when the account's secret does not decrypt", async () => {
    const { taskId, accountId } = await pendingDelivery('/undecryptable');
    // Sealed with another MEDIAGATE_SECRET_KEY than the server's (the key was changed, say).
    await server.db.insertInto('webhookSecrets').values({ accountId, secretCiphertext: encryptSecret(randomBytes(32), `whsec_${randomBytes(32).toString('base64')}`) }).execute();

    const delivery = await afterFirstStep(taskId);
    expect(delivery).toMatchObject({
      status: 'failed',
      next_attempt_at: null,
      attempts: [],
      last_error: 'the delivery could not be run: encrypted secret failed authentication (wrong MEDIAGATE_SECRET_KEY or tampered data)',
    });
    expect(received.get('/undecryptable')).toBeUndefined();

    // Once the secret can be read again (here: a new one), a redelivery sends it, its last error gone.
    await server.db.deleteFrom('webhookSecrets').where('accountId', '=', accountId).execute();
    expect(await redeliver(taskId)).toMatchObject({ status: 'pending', last_error: null, delivered_at: null });
    const sent = await until(async () => {
      const d = await deliveryOf(taskId);
      return d.status === 'delivered' && d;
    }, 10_000, 'the redelivery');
    expect(sent).toMatchObject({ last_error: null, delivered_at: expect.any(String), attempts: [expect.objectContaining({ status_code: 204 })] });
  });

  it('sends again once the operator rotates the unreadable secret: the old one, which cannot sign, is left out', async () => {
    const { taskId, accountId } = await pendingDelivery('/rotated');
    await server.db.insertInto('webhookSecrets').values({ accountId, secretCiphertext: encryptSecret(randomBytes(32), `whsec_${randomBytes(32).toString('base64')}`) }).execute();
    expect(await afterFirstStep(taskId)).toMatchObject({ status: 'failed', attempts: [] });
    // The recovery an operator reaches for: a new secret (the old one stays "previous" for its overlap).
    const rotated = await server.ctx.services.webhookSecrets.rotate(accountId);
    expect(rotated.previousExpiresAt).not.toBeNull();
    await redeliver(taskId);
    const sent = await until(async () => {
      const d = await deliveryOf(taskId);
      return d.status !== 'pending' && d;
    }, 10_000, 'the redelivery');
    expect(sent).toMatchObject({ status: 'delivered', last_error: null });
    expect(received.get('/rotated')).toBe(1);
  });

  it('records why a delivery whose secret could not be read from the database waits for its retry', async () => {
    const { taskId } = await pendingDelivery('/no-table');
    // A statement that fails for a while (the table is briefly away): not the secret's fault, so retried.
    await server.db.schema.alterTable('webhook_secrets').renameTo('webhook_secrets_away').execute();
    let delivery;
    try {
      delivery = await afterFirstStep(taskId);
    } finally {
      await server.db.schema.alterTable('webhook_secrets_away').renameTo('webhook_secrets').execute();
    }
    expect(delivery).toMatchObject({ status: 'pending', attempts: [], last_error: 'the delivery could not be run: relation "webhook_secrets" does not exist' });
    // The next try is the schedule's first retry (a minute, plus up to 10 % jitter), counted as one.
    const waitMs = Date.parse(delivery.next_attempt_at!) - Date.now();
    expect(waitMs).toBeGreaterThan(50_000);
    expect(waitMs).toBeLessThanOrEqual(66_000);
    const row = await server.db.selectFrom('webhookDeliveries').select(['retries']).where('taskId', '=', taskId).executeTakeFirstOrThrow();
    expect(row.retries).toBe(1);
    expect(received.get('/no-table')).toBeUndefined();
  });
});

describe('redelivery', () => {
  it('clears delivered_at and the last error, so a redelivery the receiver then refuses is not shown as delivered', async () => {
    const { taskId, accountId } = await pendingDelivery('/refuses-later');
    const first = await afterFirstStep(taskId);
    expect(first).toMatchObject({ status: 'delivered', delivered_at: expect.any(String) });

    answers.set('/refuses-later', 410);
    const again = await redeliver(taskId);
    expect(again).toMatchObject({ status: 'pending', delivered_at: null, last_error: null });

    const refused = await until(async () => {
      const d = await deliveryOf(taskId);
      return d.status !== 'pending' && d;
    }, 10_000, 'the redelivery');
    expect(refused).toMatchObject({ status: 'gone', delivered_at: null, last_error: 'the receiver answered HTTP 410' });
    // The attempts keep the history: the first run's 2xx, then the 410.
    expect(refused.attempts.map((a) => a.status_code)).toEqual([204, 410]);

    const list = async (status: ('delivered' | 'gone' | 'failed')[]) =>
      (await server.admin().GET('/admin/v1/webhook-deliveries', { params: { query: { account_id: accountId, status } } })).data!.data.map((d) => d.task_id);
    expect(await list(['delivered'])).toEqual([]);
    expect(await list(['failed', 'gone'])).toEqual([taskId]);
  });

  it('keeps the last error of a pending delivery it only sends sooner', async () => {
    answers.set('/keeps-failing', 503);
    const { taskId } = await pendingDelivery('/keeps-failing');
    const waiting = await afterFirstStep(taskId);
    expect(waiting).toMatchObject({ status: 'pending', last_error: 'the receiver answered HTTP 503' });

    expect(await redeliver(taskId)).toMatchObject({ status: 'pending', last_error: 'the receiver answered HTTP 503', delivered_at: null });
    const row = await server.db.selectFrom('webhookDeliveries').select(['retries']).where('taskId', '=', taskId).executeTakeFirstOrThrow();
    expect(row.retries).toBe(1);
  });
});
