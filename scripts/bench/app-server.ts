/**
 * The real app in this process, built like test/support/http-harness.ts but configured like
 * production: no response validation, info-level access logs (written to a sink that discards
 * them, so the figures include producing the log lines but not a terminal), default metrics, and no
 * task workers (WORKER_CONCURRENCY=0: a created task stays queued, only the API path is measured).
 */
import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { createApp } from '../../server/app.ts';
import { loadConfig } from '../../server/config.ts';
import { createRuntime } from '../../server/context.ts';
import { createDatabase } from '../../server/db/database.ts';
import { listenToCluster } from '../../server/db/cluster-listener.ts';
import { createHandlers } from '../../server/http/handlers.ts';
import { createLogger } from '../../server/logger.ts';
import { createMetrics } from '../../server/metrics.ts';
import { countRequest } from './query-counter.ts';

export interface AppServer {
  port: number;
  db: Kysely<DB>;
  dbPoolMax: number;
  close(): Promise<void>;
}

export async function startAppServer(databaseUrl: string): Promise<AppServer> {
  const dataDir = join(tmpdir(), `mediagate-bench-${randomBytes(6).toString('hex')}`);
  const config = loadConfig(
    {
      DATABASE_URL: databaseUrl,
      HOST: '127.0.0.1',
      PORT: '0',
      MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'),
      MEDIAGATE_DATA_DIR: dataDir,
      LOG_LEVEL: 'info',
      DEMO_DATA: '0',
      VALIDATE_RESPONSES: '0',
      WORKER_CONCURRENCY: '0',
    },
    [],
  );
  const sink = new Writable({ write: (_chunk, _enc, cb) => cb() });
  const db = createDatabase(databaseUrl, { max: config.dbPoolMax, applicationName: 'mediagate-bench-api' });
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, config.host, resolve));
  const { port } = server.address() as AddressInfo;
  const runtime = createRuntime({
    config,
    db,
    log: createLogger(config.logLevel, sink),
    metrics: createMetrics(),
    secretKey: Buffer.from(config.secretKey!, 'hex'),
    publicBaseUrl: `http://127.0.0.1:${port}`,
    clusterListener: true,
  });
  // As main.ts: the cluster channel keeps the caches right (and lets terminal tasks be kept).
  const listener = listenToCluster(databaseUrl, { task: () => undefined, configChanged: () => runtime.services.invalidateCaches() }, runtime.log);
  const app = createApp(runtime, createHandlers(runtime));
  server.on('request', (req, res) => {
    countRequest();
    void app(req, res);
  });
  return {
    port,
    db,
    dbPoolMax: config.dbPoolMax,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await listener.stop();
      await db.destroy();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
