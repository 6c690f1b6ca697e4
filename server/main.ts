/**
 * Composition root: config -> database (external or embedded) -> migrations -> demo data -> HTTP
 * listener -> runtime (services, runners) -> app, workers and the cluster listener. `npm start` runs this;
 * `--role api|worker` splits the roles.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createApp } from './app.ts';
import { ConfigError, loadConfig, type Config } from './config.ts';
import { createRuntime, type Runtime } from './context.ts';
import { createDatabase } from './db/database.ts';
import { EmbeddedPostgresError, startEmbeddedPostgres } from './db/embedded.ts';
import { migrateToLatest } from './db/migrate.ts';
import { seedDemoData } from './db/seed-demo.ts';
import { createHandlers } from './http/handlers.ts';
import { applyV8Workarounds, nodeRuntimeWarning } from './lib/node-runtime.ts';
import { loadSecretKey } from './lib/secret-box.ts';
import { createLogger, type Logger } from './logger.ts';
import { createMetrics } from './metrics.ts';
import { createWorkers } from './workers/index.ts';
import { listenToCluster } from './db/cluster-listener.ts';

export interface RunningServer {
  runtime: Runtime;
  url: string | undefined;
  stop(): Promise<void>;
}

async function listen(server: Server, config: Config): Promise<string> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(config.port, config.host, () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  return `http://${config.host === '0.0.0.0' || config.host === '::' ? 'localhost' : config.host}:${port}`;
}

export async function startServer(config: Config, log: Logger): Promise<RunningServer> {
  const runtimeWarning = nodeRuntimeWarning();
  if (runtimeWarning) log.warn({ node: process.versions.node }, runtimeWarning);
  let stopEmbedded: (() => Promise<void>) | undefined;
  let databaseUrl = config.databaseUrl;
  if (!databaseUrl) {
    const embedded = await startEmbeddedPostgres({ dataDir: config.dataDir, log, rootDir: config.embeddedPgRootDir });
    databaseUrl = embedded.url;
    stopEmbedded = embedded.stop;
  }

  const metrics = createMetrics();
  let dbClosed = false;
  const db = createDatabase(databaseUrl, {
    max: config.dbPoolMax,
    applicationName: `mediagate-${config.role}`,
    onQuery: () => metrics.dbQueries.inc(),
    preparedStatements: config.dbPreparedStatements,
    // The statement that used the connection fails and is answered or retried; this is the one line
    // that says why. Not after the pool was closed: pg-pool forgets a client before its server has
    // seen it go, so a PostgreSQL stopped right after may still say goodbye to it (57P01).
    onConnectionError: (err) => {
      if (!dbClosed) log.warn({ err: err.message, code: (err as { code?: string }).code }, 'database connection lost');
    },
  });
  let server: Server | undefined;
  try {
    await migrateToLatest(db, log);
    const secretKey = loadSecretKey({ envValue: config.secretKey, dataDir: config.databaseUrl ? undefined : config.dataDir });

    if (config.demoData && config.databaseUrl) {
      log.warn('DEMO_DATA is on with an external database: an empty database gets a demo account with 1000 credits and a live API key');
    }
    if (config.demoData) {
      const demo = await seedDemoData(db, log);
      if (demo) {
        // Printed once, to the console only: the key is never stored or logged anywhere else.
        process.stdout.write(
          `\nDemo data created: account 'demo' with 1000 credits, group 'default', local models.\n` +
            `Demo API key (shown only this once; store it now):\n\n    ${demo.apiKey}\n\n`,
        );
      }
    }

    // Listen before building the runtime, so signed file URLs know the real address; requests are
    // handled once the app is attached (in the same tick).
    let url: string | undefined;
    if (config.role !== 'worker') {
      server = createServer();
      // A non-loopback HOST without PUBLIC_BASE_URL never gets here (loadConfig refuses it).
      url = await listen(server, config);
    }
    const runtime = createRuntime({ config, db, log, metrics, secretKey, publicBaseUrl: config.publicBaseUrl ?? url ?? `http://localhost:${config.port}`, clusterListener: true });
    server?.on('request', createApp(runtime, createHandlers(runtime)));

    const workers = config.role !== 'api' ? createWorkers(runtime) : undefined;
    workers?.start();
    const listener = listenToCluster(
      databaseUrl,
      { task: (kind) => runtime.notifier.notify(kind), configChanged: () => runtime.services.invalidateCaches() },
      log.child({ component: 'cluster-listener' }),
    );

    const stop = async () => {
      if (server) {
        const closed = new Promise<void>((resolve) => server!.close(() => resolve()));
        server.closeIdleConnections();
        // In-flight requests get the grace period, then their connections are cut.
        const timer = setTimeout(() => server!.closeAllConnections(), config.shutdownGraceMs);
        await closed;
        clearTimeout(timer);
      }
      // Running steps stop here and resume on any instance once their lease expires.
      await workers?.stop();
      await listener.stop();
      await runtime.services.requestRates.close();
      await db.destroy();
      dbClosed = true;
      if (stopEmbedded) await stopEmbedded();
    };
    return { runtime, url, stop };
  } catch (err) {
    server?.close();
    await db.destroy().catch(() => undefined);
    if (stopEmbedded) await stopEmbedded().catch(() => undefined);
    throw err;
  }
}

async function main(): Promise<void> {
  // Before anything is compiled by V8's optimizing compiler (lib/node-runtime.ts).
  applyV8Workarounds();
  let config: Config;
  try {
    config = loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`configuration error: ${err.message}\n`);
      process.exit(1);
    }
    throw err;
  }
  const log = createLogger(config.logLevel);
  let running: RunningServer;
  try {
    running = await startServer(config, log);
  } catch (err) {
    // A failure with a known cause is one line that says what to do; anything else keeps its stack.
    if (err instanceof EmbeddedPostgresError) log.fatal(err.message);
    else log.fatal({ err }, 'failed to start');
    process.exit(1);
  }
  if (running.url) {
    log.info({ url: running.url, role: config.role }, 'listening');
    process.stdout.write(`Mediagate listening on ${running.url}\n`);
  } else {
    log.info({ role: config.role }, 'worker running');
    process.stdout.write('Mediagate worker running (no HTTP)\n');
  }

  let stopping = false;
  const shutdown = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'shutting down');
    running
      .stop()
      .then(() => {
        log.info('stopped');
        process.exit(0);
      })
      .catch((err: unknown) => {
        log.error({ err }, 'error during shutdown');
        process.exit(1);
      });
  };
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('server/main.ts') || process.argv[1]?.endsWith('server/main.js')) {
  await main();
}
