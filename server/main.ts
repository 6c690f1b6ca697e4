/**
 * Composition root: config -> database (external or embedded) -> migrations -> the S3 bucket's check -> HTTP listener ->
 * runtime (services, runners) -> app -> demo data -> workers and the cluster listener. `npm start`
 * runs this; `--role api|worker` splits the roles.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Kysely } from 'kysely';
import type { DB } from '../generated/db.d.ts';
import { createApp, httpServerOptions } from './app.ts';
import { ConfigError, loadConfig, type Config } from './config.ts';
import { createRuntime, type Runtime, type RuntimeOverrides } from './context.ts';
import { S3MediaStore } from './storage/s3-media-store.ts';
import { createDatabase } from './db/database.ts';
import { EmbeddedPostgresError, startEmbeddedPostgres } from './db/embedded.ts';
import { migrateToLatest } from './db/migrate.ts';
import { seedDemoData } from './db/seed-demo.ts';
import { errorTypeFor } from './errors.ts';
import { createHandlers } from './http/handlers.ts';
import { markCutByStop } from './http/request-guards.ts';
import { applyV8Workarounds, nodeRuntimeWarning } from './lib/node-runtime.ts';
import { loadSecretKey } from './lib/secret-box.ts';
import { createLogger, type Logger } from './logger.ts';
import { createMetrics } from './metrics.ts';
import { createWorkers } from './workers/index.ts';
import { listenToCluster } from './db/cluster-listener.ts';

export interface RunningServer {
  runtime: Runtime;
  url: string | undefined;
  /** The worker's METRICS_PORT server (`--role worker` with METRICS_PORT), if any. */
  metricsUrl: string | undefined;
  stop(): Promise<void>;
}

/**
 * What start-up and stop are doing, shared with main(): a signal during start-up aborts it (what
 * was started is stopped), and a stop past its deadline names the step it was waiting for and
 * stops the embedded PostgreSQL itself, which runs in a process group of its own and would outlive
 * the server.
 */
export interface Lifecycle {
  /** Aborted by the first SIGTERM/SIGINT. */
  signal: AbortSignal;
  /** The step start-up or stop is in. */
  step: string;
  /** Set once the embedded PostgreSQL runs. */
  stopEmbedded: (() => Promise<void>) | undefined;
}

/** startServer's rejection when a signal aborted start-up (what it had started is stopped). */
export class StartAborted extends Error {}

/**
 * A start-up failure with a known cause (the database of DATABASE_URL, the port, the secret key
 * file): one line that says what failed and which setting to change, as EmbeddedPostgresError does.
 */
class StartError extends Error {
  constructor(what: string, hint: string) {
    super(`${what}. ${hint}`);
    this.name = 'StartError';
  }
}

/** Socket and TLS codes of a connection to DATABASE_URL that could not be made. */
const UNREACHABLE = new Set(['ECONNREFUSED', 'ECONNRESET', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH']);
const TLS_FAILURES = new Set(['SELF_SIGNED_CERT_IN_CHAIN', 'DEPTH_ZERO_SELF_SIGNED_CERT', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY', 'CERT_HAS_EXPIRED', 'ERR_TLS_CERT_ALTNAME_INVALID']);

/** What the first connection to DATABASE_URL failing says to change, or undefined for another failure. */
function databaseFailure(err: unknown): StartError | undefined {
  const e = (err ?? {}) as { code?: unknown; message?: unknown; errors?: unknown };
  // A host name with several addresses fails with an AggregateError (no message) of one error each.
  const reason = (typeof e.message === 'string' && e.message) || (Array.isArray(e.errors) ? e.errors.map((x: Error) => x.message).join('; ') : String(err));
  // Neither the URL nor its password is echoed: PostgreSQL's messages name the user and database only.
  switch (e.code) {
    case '28P01':
      return new StartError(`the database refused the password of DATABASE_URL (${reason})`, 'Fix the user name or the password in DATABASE_URL.');
    case '28000':
      return new StartError(`the database refused the user of DATABASE_URL (${reason})`, "Fix the user name in DATABASE_URL, or let that user connect from this machine (PostgreSQL's pg_hba.conf).");
    case '3D000':
      return new StartError(`the database named in DATABASE_URL does not exist (${reason})`, 'Create it (createdb <name>), or fix the database name at the end of DATABASE_URL.');
  }
  if ((typeof e.code === 'string' && TLS_FAILURES.has(e.code)) || /does not support SSL/i.test(reason)) {
    return new StartError(`the TLS connection to the database of DATABASE_URL failed (${reason})`, "Fix DATABASE_URL's sslmode, or the certificate authority it trusts (sslrootcert).");
  }
  if ((typeof e.code === 'string' && UNREACHABLE.has(e.code)) || /^(timeout exceeded when trying to connect|Connection terminated due to connection timeout)/.test(reason)) {
    return new StartError(`cannot connect to the database of DATABASE_URL (${reason})`, 'Check the host and port in DATABASE_URL, and that PostgreSQL runs and accepts connections from this machine.');
  }
  return undefined;
}

/** What listening on `variable` (PORT, or METRICS_PORT) failing says to change, or undefined. */
function listenFailure(err: unknown, variable: string, port: number, host: string): StartError | undefined {
  switch ((err as NodeJS.ErrnoException).code) {
    case 'EADDRINUSE':
      return new StartError(`${variable}=${port} is already in use on ${host}`, `Stop the program that uses it, or set ${variable} to a free port (0: any free port).`);
    case 'EACCES':
      return new StartError(`permission denied listening on ${variable}=${port} of ${host}`, `Ports below 1024 need privileges: set ${variable} to 1024 or above (with a reverse proxy on 80 and 443).`);
    case 'EADDRNOTAVAIL':
      return new StartError(`HOST=${host} is not an address of this machine`, 'Set HOST to one of its addresses (0.0.0.0: all of them), or leave it unset to listen on 127.0.0.1.');
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return new StartError(`HOST=${host} does not resolve to an address`, 'Set HOST to an address of this machine, or leave it unset to listen on 127.0.0.1.');
  }
  return undefined;
}

/** `<data dir>/secret.key` that could not be read or created (MEDIAGATE_SECRET_KEY unset, embedded database). */
function secretKeyFailure(err: unknown): StartError {
  const e = err as NodeJS.ErrnoException;
  if (e.code === 'EACCES' || e.code === 'EPERM') {
    return new StartError(`permission denied reading or creating the secret key ${e.path ?? ''}`.trim(), 'Run Mediagate as the owner of MEDIAGATE_DATA_DIR, or set MEDIAGATE_SECRET_KEY.');
  }
  if (e.code !== undefined) return new StartError(`cannot read or create the secret key (${e.message})`, 'Check MEDIAGATE_DATA_DIR (a folder, with free space), or set MEDIAGATE_SECRET_KEY.');
  return new StartError(
    `the secret key file is damaged: ${e.message}`,
    'Restore it from a backup, or set MEDIAGATE_SECRET_KEY to the key it held: upstream credentials stored in the database are encrypted with it (removing the file makes a new key, which suits only a database with none stored).',
  );
}

/** How much longer than SHUTDOWN_GRACE_MS a stop may take before the process exits without finishing it. */
const STOP_MARGIN_MS = 5_000;
/**
 * How long a stop waits, once the grace is over, for the synchronous image requests it cut to settle:
 * well within STOP_MARGIN_MS, so that the steps after it still run when one never ends.
 */
const SETTLE_MS = 3_000;
/**
 * A signal this soon after the first is the same one again: `npm start` relays the SIGINT of a
 * terminal's Ctrl-C to the server, which the terminal sent to the whole process group already.
 */
const REPEATED_SIGNAL_MS = 1_000;
/** How long such an exit waits for the embedded PostgreSQL to stop. */
const FORCED_EMBEDDED_STOP_MS = 10_000;
/** While the HTTP server drains, keep-alive connections are closed this often when idle. */
const IDLE_SWEEP_MS = 100;
/** What a worker's METRICS_PORT serves: the rest of the contract is the API role's. */
const WORKER_PATHS = new Set(['/metrics', '/healthz', '/readyz']);

async function listen(server: Server, port: number, host: string): Promise<string> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const address = server.address() as AddressInfo;
  return `http://${host === '0.0.0.0' || host === '::' ? 'localhost' : host}:${address.port}`;
}

interface DrainableServer {
  server: Server;
  /**
   * Stops taking connections and lets the requests in flight finish within `graceMs`, then cuts
   * what is left. No client keeps a keep-alive connection busy with new requests meanwhile: every
   * answer not yet begun says `Connection: close`, and a connection is closed once it is idle (one
   * whose answer began before the stop, as soon as that answer ends).
   */
  drain(graceMs: number): Promise<void>;
}

function drainableServer(config: Config): DrainableServer {
  const server = createServer(httpServerOptions(config));
  let draining = false;
  const answering = new Set<ServerResponse>();
  // The first 'request' listener, before the app's.
  server.on('request', (_req: IncomingMessage, res: ServerResponse) => {
    if (draining) return void res.setHeader('Connection', 'close');
    answering.add(res);
    res.once('close', () => answering.delete(res));
  });
  return {
    server,
    async drain(graceMs) {
      draining = true;
      for (const res of answering) if (!res.headersSent) res.setHeader('Connection', 'close');
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeIdleConnections();
      const sweep = setInterval(() => server.closeIdleConnections(), IDLE_SWEEP_MS);
      const cut = setTimeout(() => {
        // What is still answering now is cut by the stop: its tasks say the gateway stopped, not the client.
        for (const res of answering) markCutByStop(res);
        server.closeAllConnections();
      }, graceMs);
      await closed;
      clearInterval(sweep);
      clearTimeout(cut);
    },
  };
}

/** A lifecycle nothing aborts (tests and scripts that call startServer themselves). */
export function newLifecycle(signal: AbortSignal = new AbortController().signal): Lifecycle {
  return { signal, step: 'starting', stopEmbedded: undefined };
}

/** `overrides`: replaceable parts of the runtime (tests inject providers whose timing they control). */
export async function startServer(config: Config, log: Logger, lifecycle: Lifecycle = newLifecycle(), overrides: RuntimeOverrides = {}): Promise<RunningServer> {
  const runtimeWarning = nodeRuntimeWarning();
  if (runtimeWarning) log.warn({ node: process.versions.node }, runtimeWarning);
  // Each step of start-up begins here: after a signal, none does.
  const step = (name: string) => {
    if (lifecycle.signal.aborted) throw new StartAborted('start-up stopped by a signal');
    lifecycle.step = name;
  };
  const metrics = createMetrics();
  let db: Kysely<DB> | undefined;
  let dbClosed = false;
  let http: DrainableServer | undefined;
  let built: Runtime | undefined;
  try {
    let databaseUrl = config.databaseUrl;
    if (!databaseUrl) {
      step('starting the embedded PostgreSQL');
      let embedded: Awaited<ReturnType<typeof startEmbeddedPostgres>>;
      try {
        embedded = await startEmbeddedPostgres({ dataDir: config.dataDir, log, rootDir: config.embeddedPgRootDir });
      } catch (err) {
        // A terminal's Ctrl-C reaches initdb too (the server's process group), which then fails:
        // the stop, not a disk to blame. A first start stopped in initdb builds the cluster again.
        if (lifecycle.signal.aborted) throw new StartAborted('start-up stopped by a signal', { cause: err });
        throw err;
      }
      databaseUrl = embedded.url;
      lifecycle.stopEmbedded = embedded.stop;
    }

    step('migrating the database');
    db = createDatabase(databaseUrl, {
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
    try {
      await migrateToLatest(db, log, { signal: lifecycle.signal });
    } catch (err) {
      if (lifecycle.signal.aborted) throw new StartAborted('start-up stopped by a signal');
      // The first use of the database: a wrong DATABASE_URL shows here. A failure of the embedded
      // database's connection is unexpected and keeps its stack.
      throw (config.databaseUrl !== undefined && databaseFailure(err)) || err;
    }
    let secretKey: Buffer;
    try {
      secretKey = loadSecretKey({ envValue: config.secretKey, dataDir: config.databaseUrl ? undefined : config.dataDir });
    } catch (err) {
      // MEDIAGATE_SECRET_KEY was checked by loadConfig: what fails here is the file in the data directory.
      throw config.secretKey === undefined ? secretKeyFailure(err) : err;
    }

    // A bucket that is not there, or that these credentials may not use, fails every media write:
    // said now, in one line, instead of as 503s to the first clients. One that cannot be reached
    // may come back: the start goes on, with a warning.
    if (config.s3 && !overrides.mediaStore) {
      step('checking the S3 bucket');
      const probe = new S3MediaStore(config.s3);
      const check = await probe.checkBucket(10_000, lifecycle.signal).finally(() => probe.close());
      if (lifecycle.signal.aborted) throw new StartAborted('start-up stopped by a signal');
      if (check.outcome === 'refused') {
        throw new StartError(check.reason, 'Fix S3_BUCKET, S3_REGION or S3_ENDPOINT, or the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile or a role): Mediagate needs s3:ListBucket, GetObject, PutObject and DeleteObject on the bucket.');
      }
      if (check.outcome === 'unknown') log.warn({ reason: check.reason, bucket: config.s3.bucket }, 'the S3 bucket could not be checked at start; media writes fail with storage_unavailable until the store answers');
    }

    // Listen before building the runtime, so signed file URLs know the real address; requests are
    // handled once the app is attached (in the same tick).
    step('listening');
    let url: string | undefined;
    let metricsUrl: string | undefined;
    // A worker listens only with METRICS_PORT, for the operations endpoints.
    const port = config.role !== 'worker' ? config.port : config.metricsPort;
    if (port !== undefined) {
      http = drainableServer(config);
      // A non-loopback HOST without PUBLIC_BASE_URL never gets here (loadConfig refuses it).
      let address: string;
      try {
        address = await listen(http.server, port, config.host);
      } catch (err) {
        throw listenFailure(err, config.role !== 'worker' ? 'PORT' : 'METRICS_PORT', port, config.host) ?? err;
      }
      if (config.role !== 'worker') url = address;
      else metricsUrl = address;
    }
    const runtime = createRuntime({ config, db, log, metrics, secretKey, publicBaseUrl: config.publicBaseUrl ?? url ?? `http://localhost:${config.port}`, clusterListener: true }, overrides);
    built = runtime;
    if (http) {
      const app = createApp(runtime, createHandlers(runtime));
      // A worker answers the operations endpoints only, through the same app (tokens, errors, metrics).
      const notFound = JSON.stringify({ error: { message: 'Not found.', type: errorTypeFor(404), code: 'not_found', param: null } });
      http.server.on('request', (req: IncomingMessage, res: ServerResponse) => {
        if (config.role !== 'worker' || WORKER_PATHS.has((req.url ?? '').split('?', 1)[0]!)) app(req, res);
        else res.writeHead(404, { 'Content-Type': 'application/json' }).end(notFound);
      });
    }

    // Only once the port is ours: the demo key is printed once and never again (the database is no
    // longer empty), so a start that failed to listen after printing it would lose it for good.
    // Requests answered meanwhile cannot use the demo data: its key is not out yet.
    if (config.demoData && config.databaseUrl) {
      log.warn('DEMO_DATA is on with an external database: an empty database gets a demo account with 1000 credits and a live API key');
    }
    if (config.demoData) {
      step('creating demo data');
      const demo = await seedDemoData(db, log);
      if (demo) {
        // Printed once, to the console only: the key is never stored or logged anywhere else.
        process.stdout.write(
          `\nDemo data created: account 'demo' with 1000 credits, group 'default', local models.\n` +
            `Demo API key (shown only this once; store it now):\n\n    ${demo.apiKey}\n\n`,
        );
      }
    }

    const workers = config.role !== 'api' ? createWorkers(runtime) : undefined;
    workers?.start();
    const listener = listenToCluster(
      databaseUrl,
      { task: (kind) => runtime.notifier.notify(kind), configChanged: () => runtime.services.invalidateCaches() },
      log.child({ component: 'cluster-listener' }),
    );

    const pool = db;
    const stop = async () => {
      lifecycle.step = 'draining HTTP requests';
      runtime.services.readiness.drain();
      await http?.drain(config.shutdownGraceMs);
      // The requests the drain cut know their clients are gone: each synchronous image settles what
      // it delivered and releases the rest, which takes the database (else its credits stay held
      // until an operator settles the task).
      // Running steps stop meanwhile (they need nothing of the HTTP requests) and resume on any
      // instance once their lease expires: a video submit in flight keeps the whole margin to save its job id.
      lifecycle.step = 'settling the image requests the drain cut, and stopping the task workers';
      const settling = runtime.services.images.settleRunning(SETTLE_MS).then((unsettled) => {
        if (unsettled > 0) log.error({ unsettled }, `image requests did not settle within ${SETTLE_MS} ms of the drain: their tasks keep their credits held until another process ends them (a stream's, for an operator to settle)`);
        // What a stop still waiting names from here: the workers (a submit in flight saving its job id).
        if (lifecycle.step.startsWith('settling')) lifecycle.step = 'stopping the task workers';
      });
      // Both end before the pool closes, whichever fails: a worker's failure does not cut a settlement.
      const [, stopped] = await Promise.allSettled([settling, workers?.stop()]);
      if (stopped.status === 'rejected') throw stopped.reason;
      // The members' counted successes are written while the database is open: a batch whose timer
      // fired after the pool closed was lost, with a warning and its stack in the stop's log.
      lifecycle.step = "writing the upstream members' counted successes";
      await runtime.pool.health.stop();
      lifecycle.step = 'stopping the cluster listener';
      await listener.stop();
      lifecycle.step = 'closing the request-rate store';
      await runtime.services.requestRates.close();
      // Nothing writes media any more: the store's spare files (or S3 connections) go. A store
      // handed in (tests) is its owner's to close.
      lifecycle.step = 'closing the media store';
      if (!overrides.mediaStore) await runtime.mediaStore.close?.();
      lifecycle.step = 'closing the database pool';
      await pool.destroy();
      dbClosed = true;
      if (lifecycle.stopEmbedded) {
        lifecycle.step = 'stopping the embedded PostgreSQL';
        await lifecycle.stopEmbedded();
      }
    };
    return { runtime, url, metricsUrl, stop };
  } catch (err) {
    http?.server.close();
    await built?.services.requestRates.close().catch(() => undefined);
    if (!overrides.mediaStore) await built?.mediaStore.close?.()?.catch(() => undefined);
    await db?.destroy().catch(() => undefined);
    await lifecycle.stopEmbedded?.().catch(() => undefined);
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

  // The handlers come first: a signal during start-up (the embedded PostgreSQL starting, migrations)
  // stops what was started instead of killing the process and leaving its PostgreSQL behind.
  const abort = new AbortController();
  const lifecycle = newLifecycle(abort.signal);
  let running: RunningServer | undefined;
  let stopSignalledAt: number | undefined;
  let forced = false;
  const stopDeadlineMs = config.shutdownGraceMs + STOP_MARGIN_MS;
  // The last resort (a database that never answers, a second signal): exit without a clean stop,
  // after stopping the embedded PostgreSQL if it can be.
  const forceExit = (reason: string) => {
    if (forced) return;
    forced = true;
    log.error({ waitingFor: lifecycle.step }, `${reason}: exiting without a clean stop (still ${lifecycle.step})`);
    const timeout = new Promise((resolve) => setTimeout(resolve, FORCED_EMBEDDED_STOP_MS));
    void Promise.race([lifecycle.stopEmbedded?.().catch(() => undefined), timeout]).then(() => process.exit(1));
  };
  const stopRunning = (server: RunningServer) => {
    server.stop().then(
      () => {
        if (forced) return;
        log.info('stopped');
        process.exit(0);
      },
      (err: unknown) => {
        if (forced) return;
        log.error({ err }, 'error during shutdown');
        process.exit(1);
      },
    );
  };
  const shutdown = (signal: NodeJS.Signals) => {
    if (stopSignalledAt !== undefined) {
      if (Date.now() - stopSignalledAt >= REPEATED_SIGNAL_MS) forceExit(`second ${signal}`);
      return;
    }
    stopSignalledAt = Date.now();
    log.info({ signal }, 'shutting down');
    setTimeout(() => forceExit(`the stop did not end within ${stopDeadlineMs} ms (SHUTDOWN_GRACE_MS + ${STOP_MARGIN_MS / 1000} s)`), stopDeadlineMs);
    abort.abort();
    if (running) stopRunning(running);
  };
  process.on('SIGTERM', shutdown);
  process.on('SIGINT', shutdown);

  try {
    running = await startServer(config, log, lifecycle);
  } catch (err) {
    if (err instanceof StartAborted) {
      if (!forced) {
        log.info('stopped during start-up');
        process.exit(0);
      }
      return;
    }
    // A failure with a known cause is one line that says what to do; anything else keeps its stack.
    if (err instanceof EmbeddedPostgresError || err instanceof StartError) log.fatal(err.message);
    else log.fatal({ err }, 'failed to start');
    process.exit(1);
  }
  // A signal after start-up's last step: the server is up, so it stops as a running one does.
  if (stopSignalledAt !== undefined) return stopRunning(running);
  if (running.url) {
    log.info({ url: running.url, role: config.role }, 'listening');
    process.stdout.write(`Mediagate listening on ${running.url}\n`);
  } else if (running.metricsUrl) {
    log.info({ metricsUrl: running.metricsUrl, role: config.role }, 'worker running');
    process.stdout.write(`Mediagate worker running (metrics, health and readiness on ${running.metricsUrl})\n`);
  } else {
    log.info({ role: config.role }, 'worker running');
    process.stdout.write('Mediagate worker running (no HTTP)\n');
  }
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('server/main.ts') || process.argv[1]?.endsWith('server/main.js')) {
  await main();
}
