/**
 * Starts the real app on a loopback port over a fresh database, with response validation on.
 * In the contract lane (MEDIAGATE_CONTRACT_LANE=1) `client()` goes through
 * `prism proxy generated/openapi.json <server> --errors`, which fails any request or response that
 * violates the contract; `direct()` always talks to the server itself (for requests that are
 * deliberately invalid, which Prism would refuse before they reach the server).
 * Prism forwards to a listener of the harness's own, so it can tell what came through Prism: with
 * MEDIAGATE_CONTRACT_RECORD=<dir>, each such request's test file, method, path and status is appended
 * to <dir>/<pid>.jsonl (scripts/contract-lane.ts checks them against the contract).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { appendFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http';
import { join, relative } from 'node:path';
import type { AddressInfo } from 'node:net';
import { accepts, freePort } from './ports.ts';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import createClient from 'openapi-fetch';
import { expect } from 'vitest';
import type { Kysely } from 'kysely';
import type { paths } from '../../generated/api.d.ts';
import type { DB } from '../../generated/db.d.ts';
import { createApp, httpServerOptions } from '../../server/app.ts';
import { loadConfig, type Config } from '../../server/config.ts';
import { createRuntime, type Runtime, type RuntimeOverrides } from '../../server/context.ts';
import { createHandlers } from '../../server/http/handlers.ts';
import { createLogger } from '../../server/logger.ts';
import { createMetrics } from '../../server/metrics.ts';
import { createWorkers } from '../../server/workers/index.ts';
import { listenToCluster } from '../../server/db/cluster-listener.ts';
import { createTestDatabase } from '../setup/test-database.ts';

export const ADMIN_TOKEN = 'test-admin-token-0123456789abcdef';
const root = fileURLToPath(new URL('../..', import.meta.url));
export const contractLane = process.env.MEDIAGATE_CONTRACT_LANE === '1';
const recordDir = contractLane ? process.env.MEDIAGATE_CONTRACT_RECORD : undefined;

export type ApiClient = ReturnType<typeof createClient<paths>>;

export interface TestServer {
  /** The runtime the app was built from (services, repositories, runners). */
  ctx: Runtime;
  secretKey: Buffer;
  db: Kysely<DB>;
  config: Config;
  /** Through Prism in the contract lane, else the server itself. */
  baseUrl: string;
  /** Always the server itself. */
  directUrl: string;
  /** Every log line the server wrote, as raw JSON text. */
  logs: string[];
  client(apiKey?: string): ApiClient;
  direct(apiKey?: string): ApiClient;
  admin(token?: string): ApiClient;
  close(): Promise<void>;
}

async function waitForPort(port: number, child: ChildProcess, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`prism exited with code ${child.exitCode}`);
    if (await accepts(port)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`prism did not listen on ${port} within ${timeoutMs} ms`);
}

/**
 * Prism in front of a router of the harness's own, which hands each request to the app of the test
 * server the proxy serves at the moment. Starting Prism takes about 2 s of CPU, so the proxy of a
 * closed server waits, idle, for the next server this worker process starts: each open server still
 * has a Prism of its own (as many run as servers are open at once), and a worker starts few.
 */
interface LaneProxy {
  url: string;
  /** The app of the server it serves now, and that server's test file; undefined while idle. */
  serving: { app: RequestListener; file: string } | undefined;
}
const idleProxies: LaneProxy[] = [];

/** Appends a request that came through Prism, with the status it was answered with, to this process's record. */
function record(file: string, req: IncomingMessage, res: ServerResponse): void {
  const out = join(recordDir!, `${process.pid}.jsonl`);
  res.once('close', () => {
    if (!res.headersSent) return;
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    appendFileSync(out, JSON.stringify({ file, method: req.method, path, status: res.statusCode }) + '\n');
  });
}

async function startLaneProxy(): Promise<LaneProxy> {
  const proxy: LaneProxy = { url: '', serving: undefined };
  const router = createServer((req, res) => {
    const serving = proxy.serving;
    if (!serving) {
      res.writeHead(503, { 'Content-Type': 'text/plain' }).end('this contract-lane proxy serves no test server now');
      return;
    }
    if (recordDir) record(serving.file, req, res);
    serving.app(req, res);
  });
  await new Promise<void>((resolve) => router.listen(0, '127.0.0.1', resolve));
  // Neither the router nor Prism keeps the worker process alive.
  router.unref();
  router.on('connection', (socket) => socket.unref());
  const port = await freePort();
  const args = ['proxy', `${root}generated/openapi.json`, `http://127.0.0.1:${(router.address() as AddressInfo).port}`, '--errors', '--host', '127.0.0.1', '--port', String(port)];
  // Prism goes when this process goes, however it ends: a shell runs it and kills it once its stdin,
  // a pipe from this process, reaches its end.
  const child = spawn('/bin/sh', ['-c', 'exec 3<&0; "$0" "$@" </dev/null 3<&- & p=$!; (read _ <&3; kill $p 2>/dev/null) & wait $p', `${root}node_modules/.bin/prism`, ...args], {
    stdio: ['pipe', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
  try {
    await waitForPort(port, child);
  } catch (err) {
    child.stdin?.end();
    throw new Error(`${(err as Error).message}\n${stderr}`);
  }
  child.unref();
  for (const pipe of [child.stdin, child.stderr]) (pipe as unknown as { unref?: () => void } | null)?.unref?.();
  proxy.url = `http://127.0.0.1:${port}`;
  return proxy;
}

/** A Prism proxy for this app until `release` (an idle one of this process, else a new one). */
async function acquireLaneProxy(app: RequestListener): Promise<{ url: string; release(): void }> {
  const proxy = idleProxies.pop() ?? (await startLaneProxy());
  // The file this worker runs now (the server belongs to it).
  proxy.serving = { app, file: relative(root, expect.getState().testPath ?? 'unknown') };
  return {
    url: proxy.url,
    release: () => {
      proxy.serving = undefined;
      idleProxies.push(proxy);
    },
  };
}

/** In the contract lane, any contract violation Prism reports fails the test that caused it. */
async function laneFetch(input: Request): Promise<Response> {
  const res = await fetch(input);
  const violations = res.headers.get('sl-violations');
  if (contractLane && violations) throw new Error(`contract violation on ${input.method} ${input.url}: ${violations}`);
  return res;
}

export interface StartOptions {
  env?: Record<string, string>;
  /** Run the task engines in this process. */
  workers?: boolean;
  /** Replace the media store or provider adapters (failure injection: see test/fakes/). */
  overrides?: RuntimeOverrides;
  /** Hear the cluster channel as main.ts does (and keep what only it keeps right: terminal video tasks). */
  clusterListener?: boolean;
}

export async function startTestServer(options: StartOptions = {}): Promise<TestServer> {
  const database = await createTestDatabase();
  const config = loadConfig(
    {
      DATABASE_URL: database.url,
      HOST: '127.0.0.1',
      PORT: '0',
      ADMIN_TOKEN,
      MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'),
      LOG_LEVEL: 'info',
      DEMO_DATA: '0',
      MEDIAGATE_DATA_DIR: `${root}.test-data/${randomBytes(6).toString('hex')}`,
      TASK_POLL_MS: '50',
      ...options.env,
    },
    [],
  );
  const logs: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      logs.push(...chunk.toString().split('\n').filter(Boolean));
      cb();
    },
  });
  const log = createLogger(config.logLevel, sink);
  // Listen first: signed file URLs carry the real address.
  const server: Server = createServer(httpServerOptions(config));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const directUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const secretKey = Buffer.from(config.secretKey!, 'hex');
  const ctx = createRuntime(
    { config, db: database.db, log, metrics: createMetrics({ defaultMetrics: false }), secretKey, publicBaseUrl: config.publicBaseUrl ?? directUrl, clusterListener: options.clusterListener ?? false },
    options.overrides,
  );
  const listener = options.clusterListener ? listenToCluster(database.url, { task: (kind) => ctx.notifier.notify(kind), configChanged: () => ctx.services.invalidateCaches() }, log) : undefined;
  const workers = options.workers ? createWorkers(ctx) : undefined;
  workers?.start();
  const app = createApp(ctx, createHandlers(ctx), { validateResponses: true });
  server.on('request', app);
  const prism = contractLane ? await acquireLaneProxy(app) : undefined;
  const baseUrl = prism?.url ?? directUrl;

  const make = (url: string, authorization?: string) =>
    createClient<paths>({ baseUrl: url, headers: authorization ? { Authorization: authorization } : {}, fetch: url === baseUrl ? laneFetch : undefined });

  return {
    ctx,
    secretKey,
    db: database.db,
    config,
    baseUrl,
    directUrl,
    logs,
    client: (apiKey) => make(baseUrl, apiKey === undefined ? undefined : `Bearer ${apiKey}`),
    direct: (apiKey) => make(directUrl, apiKey === undefined ? undefined : `Bearer ${apiKey}`),
    admin: (token = ADMIN_TOKEN) => make(baseUrl, `Bearer ${token}`),
    close: async () => {
      await workers?.stop();
      prism?.release();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await ctx.services.requestRates.close();
      // As main.ts stops: the store it made (a store handed in is its test's).
      if (!options.overrides?.mediaStore) await ctx.mediaStore.close?.();
      await ctx.pool.health.stop();
      await listener?.stop();
      await database.destroy();
    },
  };
}
