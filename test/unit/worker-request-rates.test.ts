/**
 * A `--role worker` process counts no requests (it serves no API), so it builds no Redis client for
 * the request-rate limiter: it used to keep a connection it never used, and after any Redis blip
 * its log said "Redis is unreachable" for good (nothing it sent could say Redis was back). The API
 * roles build it. Against a loopback server that only counts the connections it is offered; the
 * runtime is built on a database pool that is never used (nothing here queries).
 */
import { createServer, type Server, type Socket } from 'node:net';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig, type Role } from '../../server/config.ts';
import { createRuntime, type Runtime } from '../../server/context.ts';
import { createDatabase } from '../../server/db/database.ts';
import { createLogger } from '../../server/logger.ts';
import { createMetrics } from '../../server/metrics.ts';
import { until } from '../support/tasks.ts';

describe('the request-rate limiter of each role', () => {
  let redis: Server;
  let connections = 0;
  const sockets = new Set<Socket>();
  let redisUrl = '';
  const runtimes: Runtime[] = [];
  // Never connected: pg.Pool connects on a first query only.
  const db = createDatabase('postgres://mediagate@127.0.0.1:1/unused');

  beforeAll(async () => {
    redis = createServer((socket) => {
      connections++;
      sockets.add(socket);
      socket.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => redis.listen(0, '127.0.0.1', () => resolve()));
    redisUrl = `redis://127.0.0.1:${(redis.address() as { port: number }).port}`;
  });
  afterAll(async () => {
    for (const r of runtimes) await r.services.requestRates.close();
    await db.destroy();
    for (const socket of sockets) socket.destroy();
    await new Promise<void>((resolve) => redis.close(() => resolve()));
  });

  const runtimeOf = (role: Role): Runtime => {
    const config = loadConfig(
      { REDIS_URL: redisUrl, PUBLIC_BASE_URL: 'https://media.example.com', MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'), MEDIAGATE_DATA_DIR: `/tmp/mediagate-worker-rates-${process.pid}` },
      ['--role', role],
    );
    const log = createLogger('silent', new Writable({ write: (_chunk, _enc, cb) => cb() }));
    const runtime = createRuntime({ config, db, log, metrics: createMetrics({ defaultMetrics: false }), secretKey: randomBytes(32), publicBaseUrl: config.publicBaseUrl! });
    runtimes.push(runtime);
    return runtime;
  };

  it('a worker counts in memory and never connects to REDIS_URL', async () => {
    const worker = runtimeOf('worker');
    expect(worker.services.requestRates.mode).toBe('memory');
    // ioredis connects at once when built: give it the time an API role's connection takes (below).
    await sleep(300);
    expect(connections).toBe(0);
  });

  it('an API instance counts in Redis and connects to it', async () => {
    const before = connections;
    const api = runtimeOf('api');
    expect(api.services.requestRates.mode).toBe('redis');
    await until(() => connections === before + 1, 5_000, "the API role's connection");
  });
});
