/**
 * Webhooks survive crashes and run on many instances: real server processes on one database, a
 * loopback TLS receiver (trusted through NODE_EXTRA_CA_CERTS, private targets allowed). A process
 * SIGKILLed while a delivery is in flight leaves it to the next claim, which sends it with the same
 * webhook-id; two instances deliver each webhook once.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { until } from '../support/tasks.ts';
import { spawnServer, type ServerProcess } from '../support/server-process.ts';
import { TEST_CA, startHttpsReceiver } from '../support/tls.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

let t: TestDatabase;
let caFile: string;
const secret = randomBytes(32).toString('hex');
const running: ServerProcess[] = [];
/** Requests to /hold are kept open until released (a receiver still thinking when the sender dies). */
let holdNext = false;
let held: (() => void) | undefined;
let receiver: Awaited<ReturnType<typeof startHttpsReceiver>>;

beforeAll(async () => {
  t = await createTestDatabase();
  await seedCatalog(t.db);
  caFile = join(mkdtempSync(join(tmpdir(), 'mediagate-ca-')), 'ca.pem');
  writeFileSync(caFile, TEST_CA);
  receiver = await startHttpsReceiver((_req, res) => {
    if (holdNext) {
      holdNext = false;
      held?.();
      return; // never answered
    }
    res.writeHead(204);
    res.end();
  });
});
afterAll(async () => {
  await Promise.all(running.map((p) => p.kill('SIGKILL')));
  await receiver?.close();
  await t?.destroy();
});

async function start(): Promise<ServerProcess> {
  const p = await spawnServer({
    env: {
      DATABASE_URL: t.url,
      MEDIAGATE_SECRET_KEY: secret,
      MEDIAGATE_DATA_DIR: `/tmp/mediagate-webhooks-${process.pid}`,
      DEMO_DATA: '0',
      TASK_LEASE_MS: '1500',
      TASK_POLL_MS: '100',
      WORKER_CONCURRENCY: '4',
      ALLOW_PRIVATE_TARGETS: '1',
      NODE_EXTRA_CA_CERTS: caFile,
      WEBHOOK_RETRY_SCHEDULE_MS: '200,200,200',
      WEBHOOK_TIMEOUT_MS: '30000',
    },
  });
  running.push(p);
  return p;
}

async function createTasks(url: string, key: string, n: number, path: string): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const res = await fetch(`${url}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ client_request_id: randomUUID(), prompt: `clip ${i}`, model: 'local-video-lite', seconds: 2, aspectRatio: '16:9', resolution: '360p', callback_url: `${receiver.url}${path}` }),
    });
    expect(res.status).toBe(202);
    ids.push(((await res.json()) as { id: string }).id);
  }
  return ids;
}

describe('webhooks across processes', () => {
  it('a process killed while a delivery is in flight: the next one sends it with the same webhook-id, once recorded', async () => {
    const c = await createCustomer(t.db, { balance: 10, models: ['local-video-lite'] });
    const first = await start();
    const inFlight = new Promise<void>((resolve) => (held = resolve));
    holdNext = true;
    const [id] = await createTasks(first.url, c.key, 1, '/hold');
    await inFlight; // the task completed and its webhook is being sent; the receiver has not answered
    await first.kill('SIGKILL');

    await start();
    await until(async () => (await t.db.selectFrom('webhookDeliveries').select('status').where('taskId', '=', id!).executeTakeFirst())?.status === 'delivered', 30_000, 'the delivery');
    const got = receiver.requests.filter((r) => r.path === '/hold');
    expect(got).toHaveLength(2);
    expect(got[1]!.headers['webhook-id']).toBe(got[0]!.headers['webhook-id']);
    expect(got[1]!.body.equals(got[0]!.body)).toBe(true);
    // The killed attempt was never recorded; the one that got 204 was.
    const delivery = await t.db.selectFrom('webhookDeliveries').select('id').where('taskId', '=', id!).executeTakeFirstOrThrow();
    const attempts = await t.db.selectFrom('webhookAttempts').select('statusCode').where('deliveryId', '=', delivery.id).execute();
    expect(attempts).toEqual([{ statusCode: 204 }]);
  }, 90_000);

  it('two instances deliver each webhook once', async () => {
    const c = await createCustomer(t.db, { balance: 100, models: ['local-video-lite'] });
    const [a, b] = [running.at(-1)!, await start()];
    const ids = [...(await createTasks(a.url, c.key, 10, '/pair')), ...(await createTasks(b.url, c.key, 10, '/pair'))];
    await until(() => receiver.requests.filter((r) => r.path === '/pair').length >= ids.length, 60_000, 'twenty deliveries');
    await new Promise((r) => setTimeout(r, 1000)); // time for a duplicate to show up
    const got = receiver.requests.filter((r) => r.path === '/pair');
    const webhookIds = got.map((r) => String(r.headers['webhook-id']));
    expect(got).toHaveLength(ids.length);
    expect(new Set(webhookIds).size).toBe(ids.length);
    const taskIds = got.map((r) => (JSON.parse(r.body.toString()) as { id: string }).id).sort();
    expect(taskIds).toEqual([...ids].sort());
  }, 120_000);
});
