/**
 * A worker-only process (`--role worker`) serves /metrics, /healthz and /readyz on METRICS_PORT, so
 * the task-step, webhook and upstream metrics of a split deployment can be scraped; nothing else of
 * the contract is served there. Without METRICS_PORT it listens on nothing, as before.
 */
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { repoRoot, spawnServer, type ServerProcess, SERVER_ENTRY } from '../support/server-process.ts';

const METRICS_TOKEN = 'ops-worker-metrics-token-0123';
let t: TestDatabase;
const processes: ServerProcess[] = [];

beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(async () => {
  await Promise.all(processes.map((p) => p.kill('SIGKILL')));
  await t?.destroy();
});

const worker = async (env: Record<string, string>) => {
  const p = await spawnServer({
    command: [process.execPath, SERVER_ENTRY, '--role=worker'],
    workerOnly: true,
    env: { DATABASE_URL: t.url, MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'), DEMO_DATA: '0', METRICS_TOKEN, PUBLIC_BASE_URL: 'https://media.example.com', MEDIAGATE_DATA_DIR: join(repoRoot, '.test-data', `ops-worker-${randomBytes(4).toString('hex')}`), ...env },
  });
  processes.push(p);
  return p;
};

describe('a worker-only process', () => {
  it('serves /metrics, /healthz and /readyz on METRICS_PORT, and nothing else', async () => {
    const p = await worker({ METRICS_PORT: '0' });
    const url = /Mediagate worker running \(metrics, health and readiness on (http:\/\/\S+)\)/.exec(p.stdout())?.[1];
    expect(url).toBeDefined();

    const health = await fetch(`${url}/healthz`);
    expect([health.status, await health.json()]).toEqual([200, { status: 'ok' }]);
    const ready = await fetch(`${url}/readyz`);
    expect([ready.status, await ready.json()]).toEqual([200, { status: 'ready' }]);
    const refused = await fetch(`${url}/metrics`);
    expect([refused.status, ((await refused.json()) as { error: { code: string } }).error.code]).toEqual([401, 'invalid_metrics_token']);
    const metrics = await fetch(`${url}/metrics`, { headers: { Authorization: `Bearer ${METRICS_TOKEN}` } });
    expect(metrics.status).toBe(200);
    const text = await metrics.text();
    for (const name of ['mediagate_task_steps_total', 'mediagate_webhook_attempts_total', 'mediagate_upstream_requests_total', 'mediagate_db_queries_total']) {
      expect(text).toContain(`# TYPE ${name} counter`);
    }
    expect(text).toMatch(/^mediagate_db_queries_total [1-9]\d*$/m); // the engines' claims
    expect(text).toMatch(/mediagate_http_requests_total\{operation="getReadiness",method="GET",status="200"\} 1/);

    for (const path of ['/v1/models', '/admin/v1/accounts', '/docs']) {
      const res = await fetch(`${url}${path}`);
      expect([path, res.status, ((await res.json()) as { error: { code: string } }).error.code]).toEqual([path, 404, 'not_found']);
    }

    await p.kill('SIGTERM');
    expect(await p.exited).toEqual({ code: 0, signal: null });
  }, 90_000);

  it('listens on nothing without METRICS_PORT', async () => {
    const p = await worker({});
    expect(p.stdout()).toContain('Mediagate worker running (no HTTP)');
    await p.kill('SIGTERM');
    expect(await p.exited).toEqual({ code: 0, signal: null });
  }, 90_000);
});
