/**
 * What Mediagate adds to a synchronous image generation, against calling the upstream directly,
 * side by side in one run. The fake OpenAI Images upstream (test/fakes/openai-images.ts) runs in a
 * worker thread of the bench; the server runs as a child process with one `openai` member pointing
 * at it; the load generator (keep-alive node:http agents, one per side and window) runs on the
 * bench's main thread, so neither the server nor the fake shares an event loop with it.
 *
 *   latency     POST /v1/images/generations, n=1 1024x1024 PNG (upstream `gpt-image-1`), at
 *               concurrency 1 and `connections`: p50/p90/p99 through Mediagate vs direct, the
 *               difference ("added"), req/s both ways and their ratio;
 *   streaming   `stream: true, partial_images: P` at concurrency 1: time to the first complete
 *               partial-image frame, and to the end of the stream, both ways;
 *   floor       the same n=1 request (and the streaming one) at concurrency 1 through four
 *               framework-free reference relays (relay-server.ts, each its own process, like the
 *               server): a bare node:http relay; a "hold-only" one that commits one INSERT before
 *               the call (as Mediagate's hold of a synchronous image commits) and relays the answer,
 *               the least any gateway adds that holds credit in PostgreSQL before calling the
 *               upstream; a "durable" one that does only the writes a billing gateway cannot
 *               skip (that INSERT, the image written to disk, one committed UPDATE after it): what
 *               any Node gateway adds on this machine, next to what Mediagate adds; and a "ledger"
 *               one, the durable relay with Mediagate's own hold and settlement statements (its
 *               repositories, its group commit) in place of the one-row ones: what Mediagate's data
 *               model costs without the rest of Mediagate. The durable and the ledger relays also
 *               run in the latency windows (both levels) and the quick run's streaming windows;
 *   memory      `rssConnections` concurrent n=4 3840x2160 PNG generations (upstream `gpt-image-2`,
 *               which renders that size itself, so Mediagate passes the bytes through without
 *               re-encoding) from a second fake whose images weigh what photos do (its `noise`
 *               texture: about 17 MiB a PNG, 23 MiB in base64): the server's idle RSS and peak RSS
 *               (VmHWM, reset before the run) against the bytes of the images in flight.
 *
 * Each pair of windows runs in ABBA order (direct, Mediagate, Mediagate, direct; each half
 * `durationMs / 2`) so drift on a shared machine hits both sides alike. Every request of a pair has
 * the same prompt, so the fake renders each image once (its render cache) and answers the rest
 * from memory: its sharp encoding stays out of the measured loop. A smoke check first verifies
 * that both sides return the same bytes (Mediagate passes PNGs of the requested size through).
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { spawn } from 'node:child_process';
import { Worker } from 'node:worker_threads';
import { sql, type Kysely } from 'kysely';
import sharp from 'sharp';
import type { DB } from '../../generated/db.d.ts';
import type { CatalogModelDefinition } from '../../server/catalog/capabilities.ts';
import { createDatabase } from '../../server/db/database.ts';
import { BASE62_ALPHABET } from '../../server/lib/ids.ts';
import { MICRO } from '../../server/lib/money.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../../test/support/factories.ts';
import { serverCommand } from './server-command.ts';
import { repoRoot, spawnServer } from '../../test/support/server-process.ts';
import type { LedgerIds, RelayMode } from './relay-server.ts';
import { addUpstreamMember } from '../../test/support/upstreams.ts';
import { describeProbe, probeStore } from './store-probe.ts';
import { summarize, table, type Summary } from './stats.ts';

export interface ProxyOptions {
  /** Measured seconds per side and concurrency level (two halves each, ABBA). */
  durationMs: number;
  /** Unmeasured load per side before the first measured window. */
  warmupMs: number;
  /** The high concurrency level (the low one is 1); also the concurrency of the memory run. */
  connections: number;
  /** `partial_images` of the streaming pair (1..3). */
  partials: number;
  /** Memory run: concurrent connections, and requests each sends one after the other. */
  rssConnections: number;
  rssRounds: number;
  /** API keys (one account each) the connections take turns on; 1: every request on one key. */
  keys: number;
  /** Run the tsc build (`node dist/server/main.js`) instead of tsx. */
  built?: boolean;
  /** Extra environment of the server process (experiments: DB_POOL_MAX, UV_THREADPOOL_SIZE, …). */
  serverEnv?: Record<string, string>;
  /** Write a V8 CPU profile of the server into this directory (on its exit). */
  cpuProfDir?: string;
  /**
   * Where the server and the reference relays keep their files (the media store among them), each
   * in a folder of its own, removed afterwards; default the OS's temporary directory. Each run's
   * header says what creating a file costs there (store-probe.ts).
   */
  dataDir?: string;
  /** Only the Portkey comparison and the first partial (no floors, resize or memory run): for iterating. */
  quick?: boolean;
  /** The ledger relay calls the upstream while its hold commits (relay-server.ts: `ledger-early`). */
  ledgerEarly?: boolean;
  /**
   * Instead of measuring: this many cycles of the pattern after which the server died of SIGSEGV
   * (docs/BENCHMARKS.md, "A crash found by the bench"): 1 s at concurrency 1, `crashSoakIdleMs`
   * idle, 2 s at --connections on --keys keys, each on new connections.
   */
  crashSoak?: number;
  crashSoakIdleMs?: number;
}

export interface ProxyResult {
  failed: boolean;
  /** Rows for the bench's summary table. */
  rows: { scenario: string; summary: Summary }[];
}

const MiB = 1024 * 1024;
const PROMPT = 'a lighthouse on a cliff at dusk';
const STREAM_PROMPT = 'a red fox in fresh snow';
const caps = { resolutions: ['1K', '4K'], aspectRatios: ['1:1', '16:9'], outputFormats: ['png' as const], supportsQuality: false, supportsTransparentBackground: false, maxN: 4 };
const prices = [
  { resolution: '1K', quality: '', mode: 'per_item' as const, unitPrice: Math.round(0.04 * MICRO) },
  { resolution: '4K', quality: '', mode: 'per_item' as const, unitPrice: Math.round(0.16 * MICRO) },
];
/** Sold as `bench-image`, served upstream as `gpt-image-1` (1K: asks 1024x1024, passes it through). */
const BENCH_IMAGE: CatalogModelDefinition = { id: 'bench-image', kind: 'image', displayName: 'Bench image (OpenAI upstream gpt-image-1)', capabilities: caps, prices };
/** Sold as `bench-image-4k`, served upstream as `gpt-image-2` (asks 3840x2160 itself: no resize, no re-encode) by the second, `noise` fake. */
const BENCH_IMAGE_4K: CatalogModelDefinition = { id: 'bench-image-4k', kind: 'image', displayName: 'Bench image 4K (OpenAI upstream gpt-image-2)', capabilities: caps, prices };

// ---------------------------------------------------------------------------------------------
// The fake upstream in a worker thread

// tsx registers its loader on the main thread only (Node 20): the worker registers it itself.
const TSX_API = import.meta.resolve('tsx/esm/api');
const FAKE_MODULE = new URL('../../test/fakes/openai-images.ts', import.meta.url).href;
/**
 * The fake's own listener answers `Keep-Alive: timeout=1`; Node 20's clients (the node:http agent
 * and fetch alike) keep an idle socket for that hint minus 1 s, i.e. not at all, so every request
 * would open a new connection on both sides (measured: one connection per request). The bench sets
 * 30 s, so both sides reuse their connections (the report counts the connections the fake accepts).
 */
const FAKE_KEEPALIVE_MS = 30_000;
const FAKE_BOOT = `
const { parentPort, workerData } = require('node:worker_threads');
import(${JSON.stringify(TSX_API)})
  .then((tsx) => { tsx.register(); return import(${JSON.stringify(FAKE_MODULE)}); })
  .then(async (m) => {
    const fake = await m.startOpenAIImagesFake(workerData.options);
    fake.server.keepAliveTimeout = workerData.keepAliveMs;
    let connections = 0;
    fake.server.on('connection', () => connections++);
    parentPort.on('message', (msg) => {
      if (msg === 'stats') parentPort.postMessage({ type: 'stats', connections, counts: { ...fake.counts }, maxInFlight: fake.maxInFlight });
    });
    parentPort.postMessage({ type: 'ready', url: fake.url });
  })
  .catch((err) => parentPort.postMessage({ type: 'error', message: String((err && err.stack) || err) }));
`;

interface FakeWorker {
  url: string;
  worker: Worker;
  stats(): Promise<{ connections: number; counts: Record<string, number>; maxInFlight: number }>;
  close(): Promise<void>;
}

async function startFakeWorker(options: Record<string, unknown>): Promise<FakeWorker> {
  const worker = new Worker(FAKE_BOOT, { eval: true, workerData: { options, keepAliveMs: FAKE_KEEPALIVE_MS } });
  const url = await new Promise<string>((resolve, reject) => {
    const onMessage = (msg: { type: string; url?: string; message?: string }) => {
      if (msg.type === 'ready') resolve(msg.url!);
      else if (msg.type === 'error') reject(new Error(`fake upstream worker: ${msg.message}`));
    };
    worker.on('message', onMessage);
    worker.once('error', reject);
  });
  return {
    url,
    worker,
    stats: () =>
      new Promise((resolve) => {
        const onMessage = (msg: { type: string; connections: number; counts: Record<string, number>; maxInFlight: number }) => {
          if (msg.type !== 'stats') return;
          worker.off('message', onMessage);
          resolve(msg);
        };
        worker.on('message', onMessage);
        worker.postMessage('stats');
      }),
    close: async () => void (await worker.terminate()),
  };
}

// ---------------------------------------------------------------------------------------------
// The load generator

interface Target {
  url: URL;
  /** One set per API key: connection i sends with `headers[i % headers.length]`. */
  headers: Record<string, string>[];
  body: string;
  stream: boolean;
}

function target(base: string, keys: string[], body: Record<string, unknown>, extraHeaders: Record<string, string> = {}): Target {
  const text = JSON.stringify(body);
  return {
    url: new URL('/v1/images/generations', base),
    headers: keys.map((key) => ({ Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', 'Content-Length': String(Buffer.byteLength(text)), ...extraHeaders })),
    body: text,
    stream: body.stream === true,
  };
}

interface Sample {
  ms: number;
  /** Streams: until the first partial-image frame was complete. */
  firstPartialMs?: number;
  status: number;
  bytes: number;
  error?: string;
}

const PARTIAL_EVENT = '.partial_image\n';

/** One request; resolves when the whole answer has arrived (never rejects: failures are samples). */
function send(agent: Agent, t: Target, connection: number, keepBody = false): Promise<Sample & { body?: Buffer }> {
  const t0 = performance.now();
  const headers = t.headers[connection % t.headers.length]!;
  return new Promise((resolve) => {
    const req = request({ host: t.url.hostname, port: t.url.port, path: t.url.pathname, method: 'POST', headers, agent }, (res) => {
      const status = res.statusCode ?? 0;
      const chunks: Buffer[] = [];
      let bytes = 0;
      let firstPartialMs: number | undefined;
      // Streams: the text since the first partial frame's event line began (frames end with a blank line).
      let pending = '';
      let scanFrom = 0;
      res.on('data', (chunk: Buffer) => {
        bytes += chunk.length;
        if (keepBody || status !== 200) chunks.push(chunk);
        if (t.stream && status === 200 && firstPartialMs === undefined) {
          pending += chunk.toString('latin1');
          const at = pending.indexOf(PARTIAL_EVENT);
          if (at >= 0) {
            const end = pending.indexOf('\n\n', Math.max(at, scanFrom));
            if (end >= 0) {
              firstPartialMs = performance.now() - t0;
              pending = '';
            } else scanFrom = Math.max(at, pending.length - 1);
          } else {
            // Keep only a tail long enough to hold a split event name.
            pending = pending.slice(-PARTIAL_EVENT.length);
          }
        }
      });
      res.on('end', () => {
        const body = Buffer.concat(chunks);
        const ms = performance.now() - t0;
        if (status !== 200) resolve({ ms, status, bytes, error: `HTTP ${status}: ${body.toString('utf8').slice(0, 300)}` });
        else if (t.stream && firstPartialMs === undefined) resolve({ ms, status, bytes, error: 'stream without a partial image', body });
        else resolve({ ms, status, bytes, ...(firstPartialMs !== undefined && { firstPartialMs }), ...(keepBody && { body }) });
      });
      res.on('error', (err) => resolve({ ms: performance.now() - t0, status, bytes, error: err.message }));
    });
    req.on('error', (err) => resolve({ ms: performance.now() - t0, status: 0, bytes: 0, error: err.message }));
    req.end(t.body);
  });
}

interface Window {
  samples: Sample[];
  seconds: number;
}

/**
 * `concurrency` connections, each with one request in flight, for `durationMs`. Each connection
 * first sends one unmeasured request (connection setup); then `onStart` runs (no request in
 * flight) and the clock starts.
 */
async function runWindow(t: Target, concurrency: number, durationMs: number, onStart: () => Promise<void> = async () => undefined): Promise<Window> {
  const agent = new Agent({ keepAlive: true, maxSockets: concurrency });
  try {
    await Promise.all(Array.from({ length: concurrency }, (_, i) => send(agent, t, i)));
    await onStart();
    const samples: Sample[] = [];
    const started = performance.now();
    const end = started + durationMs;
    await Promise.all(
      Array.from({ length: concurrency }, async (_, c) => {
        while (performance.now() < end) samples.push(await send(agent, t, c));
      }),
    );
    return { samples, seconds: (performance.now() - started) / 1000 };
  } finally {
    agent.destroy();
  }
}

/** `concurrency` connections sending `rounds` requests each (a fixed amount of work). */
async function runRounds(t: Target, concurrency: number, rounds: number): Promise<Window> {
  const agent = new Agent({ keepAlive: true, maxSockets: concurrency });
  try {
    const samples: Sample[] = [];
    const started = performance.now();
    await Promise.all(
      Array.from({ length: concurrency }, async (_, c) => {
        for (let i = 0; i < rounds; i++) samples.push(await send(agent, t, c));
      }),
    );
    return { samples, seconds: (performance.now() - started) / 1000 };
  } finally {
    agent.destroy();
  }
}

// ---------------------------------------------------------------------------------------------
// Server-side figures

const CLK_TCK = 100;

/** CPU seconds (user + system) from a `stat` file: fields 14 and 15, at 11 and 12 after the command name. */
export function cpuOf(statFile: string): number {
  const stat = readFileSync(statFile, 'utf8').split(') ')[1]!.split(' ');
  return (Number(stat[11]) + Number(stat[12])) / CLK_TCK;
}

/** Memory of a process, its CPU time (all threads) and its main thread's (the event loop). */
function procStatus(pid: number): { rss: number; hwm: number; cpu: number; mainCpu: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
  return { rss: kb('VmRSS'), hwm: kb('VmHWM'), cpu: cpuOf(`/proc/${pid}/stat`), mainCpu: cpuOf(`/proc/${pid}/task/${pid}/stat`) };
}

/**
 * CPU seconds of the PostgreSQL backends serving the server's pool, by pid (PostgreSQL on this
 * machine only: their /proc entries; an empty map otherwise).
 */
/** Whose PostgreSQL backends: the server's pool, the one-row relays' (hold, durable), or the ledger relay's. */
type Backends = 'server' | 'relay' | 'ledger';

async function pgBackendCpu(db: Kysely<DB>, of: Backends = 'server'): Promise<Map<number, number>> {
  const whose = of === 'server' ? sql`application_name like 'mediagate-%' and application_name not like 'mediagate-bench%'` : sql`application_name = ${`mediagate-bench-${of}`}`;
  const { rows } = await sql<{ pid: number }>`select pid from pg_stat_activity where datname = current_database() and ${whose}`.execute(db);
  const out = new Map<number, number>();
  for (const { pid } of rows) {
    try {
      out.set(pid, cpuOf(`/proc/${pid}/stat`));
    } catch {
      // Not on this machine, or gone.
    }
  }
  return out;
}

function cpuDelta(before: Map<number, number>, after: Map<number, number>): number {
  let sum = 0;
  for (const [pid, cpu] of after) sum += cpu - (before.get(pid) ?? 0);
  return sum;
}

/** Busy and total jiffies of the whole machine (all cores), from /proc/stat. */
function machineCpu(): { busy: number; total: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const total = fields.reduce((s, v) => s + v, 0);
  // idle + iowait
  return { busy: total - fields[3]! - (fields[4] ?? 0), total };
}

/** Resets the process's VmHWM to its current RSS. */
function resetPeak(pid: number): void {
  writeFileSync(`/proc/${pid}/clear_refs`, '5');
}

async function metricSum(url: string, token: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`, { headers: { Authorization: `Bearer ${token}` } })).text();
  let sum = 0;
  for (const line of text.split('\n')) if (line.startsWith(name) && !line.startsWith('#')) sum += Number(line.split(' ').at(-1));
  return sum;
}

/** What one side did during its windows, besides latencies. */
interface SideCost {
  /** Server CPU seconds, all threads and the main thread's (Mediagate, Portkey and the durable relay's sides). */
  serverCpu: number;
  serverMainCpu: number;
  /** CPU seconds of the PostgreSQL backends of the server's pool (Mediagate and the durable relay's sides). */
  pgCpu: number;
  /** Share of all cores busy (server, PostgreSQL, fake, load generator, kernel). */
  machineBusy: number;
  /** SQL statements the server sent (Mediagate side only). */
  sql: number;
  /** Event-loop utilization of the fake's thread and of the load generator's, over the side's windows. */
  fakeElu: number;
  loadElu: number;
  /** TCP connections the fake accepted. */
  upstreamConnections: number;
}

interface Side {
  window: Window;
  cost: SideCost;
}

interface Pair {
  direct: Side;
  gateway: Side;
}

// ---------------------------------------------------------------------------------------------

export async function runProxy(databaseUrl: string, opts: ProxyOptions, log: (line: string) => void): Promise<ProxyResult> {
  const fake = await startFakeWorker({ record: false, holdMs: 0, streamEventDelayMs: 0 });
  const heavy = await startFakeWorker({ record: false, texture: 'noise' });
  const secret = randomBytes(32);
  const metricsToken = randomBytes(16).toString('hex');
  const dataDir = join(opts.dataDir ?? tmpdir(), `mediagate-bench-proxy-${process.pid}`);
  const db = createDatabase(databaseUrl, { max: 2, applicationName: 'mediagate-bench-proxy' });
  const rows: ProxyResult['rows'] = [];
  let failed = false;
  try {
    await seedCatalog(db, [BENCH_IMAGE, BENCH_IMAGE_4K]);
    const group = await createGroup(db);
    await addUpstreamMember(db, secret, {
      groupId: group.id,
      provider: 'openai',
      baseUrl: `${fake.url}/v1`,
      credentials: { api_key: 'sk-test' },
      models: [BENCH_IMAGE.id],
      modelMap: { [BENCH_IMAGE.id]: 'gpt-image-1' },
    });
    await addUpstreamMember(db, secret, {
      groupId: group.id,
      provider: 'openai',
      baseUrl: `${heavy.url}/v1`,
      credentials: { api_key: 'sk-test' },
      models: [BENCH_IMAGE_4K.id],
      modelMap: { [BENCH_IMAGE_4K.id]: 'gpt-image-2' },
    });
    // One account per key: with one key, every request updates the same key and account rows.
    const keys: string[] = [];
    for (let i = 0; i < Math.max(1, opts.keys); i++) {
      const account = await createAccount(db, { balance: 1_000_000_000 });
      keys.push((await createApiKey(db, { accountId: account.id, groupId: group.id })).key);
    }

    // A store in use: the filesystem store keeps outputs in 62 x 62 bucket directories
    // (storageKeyOf), each made on its first write; a fresh one would spend the first few thousand
    // requests creating them, which is not what a running server does.
    for (const a of BASE62_ALPHABET) for (const b of BASE62_ALPHABET) mkdirSync(join(dataDir, 'media', 'image_output', `${a}${b}`), { recursive: true });
    log(`  ${describeProbe(join(dataDir, 'media'), probeStore(join(dataDir, 'probe')))}`);
    const server = await spawnServer({
      env: {
        DATABASE_URL: databaseUrl,
        MEDIAGATE_SECRET_KEY: secret.toString('hex'),
        MEDIAGATE_DATA_DIR: dataDir,
        DEMO_DATA: '0',
        VALIDATE_RESPONSES: '0',
        METRICS_TOKEN: metricsToken,
        // The server's default, as `npm start` runs it: one line a request, read by this process
        // as a log collector would read it (BENCH_SERVER_ENV='{"LOG_LEVEL":"warn"}' for none).
        LOG_LEVEL: 'info',
        ...opts.serverEnv,
      },
      command: serverCommand(opts),
    });
    const pid = server.child.pid!;
    const portkey = await startPortkey(fake.url);
    const relays = [
      { label: 'bare node:http relay', ...(await startRelay(opts, `${fake.url}/v1`, 'relay')) },
      { label: 'hold-only relay', ...(await startRelay(opts, `${fake.url}/v1`, 'hold', databaseUrl)) },
      { label: 'durable relay', ...(await startRelay(opts, `${fake.url}/v1`, 'durable', databaseUrl)) },
      // Mediagate's own two statements (through its repositories) around the same call, on an account of its own.
      { label: 'ledger relay', ...(await startRelay(opts, `${fake.url}/v1`, opts.ledgerEarly ? 'ledger-early' : 'ledger', databaseUrl, await ledgerAccount(db, group.id))) },
    ];
    try {
      await new Promise((r) => setTimeout(r, 500));
      const startRss = procStatus(pid).rss;

      const direct = {
        image: target(fake.url, ['sk-test'], { model: 'gpt-image-1', prompt: PROMPT, size: '1024x1024', n: 1, output_format: 'png' }),
        stream: target(fake.url, ['sk-test'], { model: 'gpt-image-1', prompt: STREAM_PROMPT, size: '1024x1024', n: 1, output_format: 'png', stream: true, partial_images: opts.partials }),
        big: target(heavy.url, ['sk-test'], { model: 'gpt-image-2', prompt: PROMPT, size: '3840x2160', n: 4, output_format: 'png' }),
      };
      // Portkey's gateway, as its README has it for an OpenAI-compatible upstream of one's own.
      const portkeyHeaders = { 'x-portkey-provider': 'openai', 'x-portkey-custom-host': `${fake.url}/v1` };
      const viaPortkey = {
        image: target(portkey.url, ['sk-test'], { model: 'gpt-image-1', prompt: PROMPT, size: '1024x1024', n: 1, output_format: 'png' }, portkeyHeaders),
      };
      const gatewayKeys = target(server.url, keys, { model: BENCH_IMAGE.id, prompt: PROMPT, size: '1024x1024', n: 1, output_format: 'png' });
      const gateway = {
        image: target(server.url, keys.slice(0, 1), { model: BENCH_IMAGE.id, prompt: PROMPT, size: '1024x1024', n: 1, output_format: 'png' }),
        stream: target(server.url, keys, { model: BENCH_IMAGE.id, prompt: STREAM_PROMPT, size: '1024x1024', n: 1, output_format: 'png', stream: true, partial_images: opts.partials }),
        big: target(server.url, keys, { model: BENCH_IMAGE_4K.id, prompt: PROMPT, aspectRatio: '16:9', resolution: '4K', n: 4, output_format: 'png' }),
      };

      // Smoke: both sides answer, with the same image bytes (Mediagate passes them through).
      // A refused smoke request: the server's log lines (stdout) say why; a dead server is reported below.
      const smoke = await smokeCheck(direct, gateway).catch((err: Error) => {
        throw new Error(`${err.message}\nserver log (stdout):\n${server.stdout().slice(-6000)}`);
      });
      // Portkey answers too, with the same image.
      const firstImage = async (t: Target) => {
        const agent = new Agent({ keepAlive: false });
        const r = await send(agent, t, 0, true);
        agent.destroy();
        if (r.error) throw new Error(`smoke request to ${t.url.origin} failed: ${r.error}`);
        return (JSON.parse(r.body!.toString('utf8')) as { data: { b64_json: string }[] }).data[0]?.b64_json;
      };
      const portkeyIdentical = (await firstImage(viaPortkey.image)) === (await firstImage(direct.image));
      if (!portkeyIdentical) failed = true;
      log(`  fake OpenAI Images upstream in a worker thread (keep-alive ${FAKE_KEEPALIVE_MS / 1000} s); ${opts.keys} API key(s), one account each; server pid ${pid} (${opts.cpuProfDir ? `CPU profile into ${opts.cpuProfDir}` : 'no profiler'}${opts.serverEnv ? `, env ${JSON.stringify(opts.serverEnv)}` : ''})`);
      log(
        `  images: 1024x1024 PNG ${(smoke.smallBytes / 1024).toFixed(1)} KiB (flat colours: the latency runs measure Mediagate, not base64); ` +
          `3840x2160 PNG ${fmtMiB(smoke.bigBytes)} MiB each (noise texture: what photos weigh); bytes through Mediagate identical to direct: ${smoke.identical ? 'yes' : 'NO'}, through Portkey: ${portkeyIdentical ? 'yes' : 'NO'}`,
      );
      log(`  Portkey gateway ${PORTKEY_VERSION} (pid ${portkey.pid}) at ${portkey.url}, headers x-portkey-provider: openai, x-portkey-custom-host: ${fake.url}/v1`);
      if (!smoke.identical) failed = true;

      if (opts.crashSoak) {
        const started = performance.now();
        for (let cycle = 1; cycle <= opts.crashSoak; cycle++) {
          const calm = await runWindow(gateway.image, 1, 1000);
          await new Promise((r) => setTimeout(r, opts.crashSoakIdleMs ?? 5000));
          const burst = await runWindow(gatewayKeys, opts.connections, 2000);
          const dead = server.child.exitCode !== null || server.child.signalCode !== null;
          const bad = [...calm.samples, ...burst.samples].filter((x) => x.error).length;
          log(`  crash soak cycle ${cycle}/${opts.crashSoak}: ${calm.samples.length} + ${burst.samples.length} requests, ${bad} failed${dead ? ', the server is dead' : ''}`);
          if (dead) throw new Error(`the server died in crash soak cycle ${cycle}, ${((performance.now() - started) / 1000).toFixed(0)} s in`);
          if (bad > 0) failed = true;
        }
        log(`  crash soak: the server lived through ${opts.crashSoak} cycles (${((performance.now() - started) / 1000).toFixed(0)} s)`);
        return { failed, rows };
      }

      /** `relay`: a reference relay whose process and PostgreSQL backends are measured (the durable relay, the ledger relay). */
      const measure = async (side: 'direct' | 'gateway' | 'reference' | 'portkey', t: Target, concurrency: number, durationMs: number, relay?: { pid: number; backends: Backends }): Promise<Side> => {
        let fakeElu0 = fake.worker.performance.eventLoopUtilization();
        let loadElu0 = performance.eventLoopUtilization();
        let before: { cpu: number; mainCpu: number; sql: number; pg: Map<number, number> } | undefined;
        let conns0 = 0;
        let machine0 = machineCpu();
        let pk0 = { cpu: 0, mainCpu: 0 };
        let relay0: { cpu: number; mainCpu: number; pg: Map<number, number> } | undefined;
        const window = await runWindow(t, concurrency, durationMs, async () => {
          if (side === 'portkey') pk0 = procStatus(portkey.pid);
          if (side === 'reference' && relay) relay0 = { ...procStatus(relay.pid), pg: await pgBackendCpu(db, relay.backends) };
          if (side === 'gateway') before = { ...procStatus(pid), sql: await metricSum(server.url, metricsToken, 'mediagate_db_queries_total'), pg: await pgBackendCpu(db) };
          conns0 = (await fake.stats()).connections;
          fakeElu0 = fake.worker.performance.eventLoopUtilization();
          loadElu0 = performance.eventLoopUtilization();
          machine0 = machineCpu();
        });
        const machine1 = machineCpu();
        const fakeElu = fake.worker.performance.eventLoopUtilization(fakeElu0).utilization;
        const loadElu = performance.eventLoopUtilization(loadElu0).utilization;
        const conns1 = (await fake.stats()).connections;
        const cost: SideCost = { serverCpu: 0, serverMainCpu: 0, pgCpu: 0, machineBusy: (machine1.busy - machine0.busy) / Math.max(1, machine1.total - machine0.total), sql: 0, fakeElu, loadElu, upstreamConnections: conns1 - conns0 };
        if (side === 'portkey') {
          const after = procStatus(portkey.pid);
          cost.serverCpu = after.cpu - pk0.cpu;
          cost.serverMainCpu = after.mainCpu - pk0.mainCpu;
        }
        if (relay0 && relay) {
          const after = procStatus(relay.pid);
          cost.serverCpu = after.cpu - relay0.cpu;
          cost.serverMainCpu = after.mainCpu - relay0.mainCpu;
          cost.pgCpu = cpuDelta(relay0.pg, await pgBackendCpu(db, relay.backends));
        }
        if (before) {
          const after = procStatus(pid);
          cost.serverCpu = after.cpu - before.cpu;
          cost.serverMainCpu = after.mainCpu - before.mainCpu;
          cost.pgCpu = cpuDelta(before.pg, await pgBackendCpu(db));
          cost.sql = (await metricSum(server.url, metricsToken, 'mediagate_db_queries_total')) - before.sql;
        }
        return { window, cost };
      };
      /** ABBA: direct, Mediagate (or a reference relay), the same again, direct; each half `durationMs / 2`. */
      const pair = async (d: Target, g: Target, concurrency: number, side: 'gateway' | 'reference' = 'gateway'): Promise<Pair> => {
        const half = opts.durationMs / 2;
        const a1 = await measure('direct', d, concurrency, half);
        const b1 = await measure(side, g, concurrency, half);
        const b2 = await measure(side, g, concurrency, half);
        const a2 = await measure('direct', d, concurrency, half);
        return { direct: merge(a1, a2), gateway: merge(b1, b2) };
      };
      /**
       * Several sides in the same windows: direct, then each side, then the same in reverse order
       * (A B C C B A), each half `durationMs / 2`; the first side is the direct one.
       */
      const abba = async (sides: { kind: 'direct' | 'gateway' | 'reference' | 'portkey'; t: Target; relay?: { pid: number; backends: Backends } }[], concurrency: number): Promise<Side[]> => {
        const half = opts.durationMs / 2;
        const first: Side[] = [];
        for (const side of sides) first.push(await measure(side.kind, side.t, concurrency, half, side.relay));
        const second: Side[] = [];
        for (const side of [...sides].reverse()) second.unshift(await measure(side.kind, side.t, concurrency, half, side.relay));
        return first.map((a, i) => merge(a, second[i]!));
      };

      // Warm-up (JIT, connection pools, the fake's render cache).
      if (opts.warmupMs > 0) {
        for (const [d, g] of [[direct.image, gateway.image], [direct.stream, gateway.stream]] as const) {
          await runWindow(d, opts.connections, opts.warmupMs);
          await runWindow(g, opts.connections, opts.warmupMs);
        }
        await runWindow(viaPortkey.image, opts.connections, opts.warmupMs);
        await runWindow(gatewayKeys, opts.connections, opts.warmupMs);
      }

      // Background SQL of the idle server (the task engines' claim polls), to subtract.
      const idleSql0 = await metricSum(server.url, metricsToken, 'mediagate_db_queries_total');
      const idleStarted = performance.now();
      await new Promise((r) => setTimeout(r, 2000));
      const idleSqlPerSecond = ((await metricSum(server.url, metricsToken, 'mediagate_db_queries_total')) - idleSql0) / ((performance.now() - idleStarted) / 1000);

      const levels = [...new Set([1, opts.connections])];
      const latency: { concurrency: number; pair: Pair; portkey: Side; durable: Side; ledger: Side; manyKeys?: Side }[] = [];
      // The durable reference relay (the least a gateway that holds, stores and settles does) in the
      // same windows: the floor of both the latency and the throughput on this machine. The ledger
      // relay, beside it: the same with Mediagate's own statements, what its data model costs.
      const durableRelay = relays.find((r) => r.label === 'durable relay')!;
      const durableImage = { ...direct.image, url: new URL('/v1/images/generations', durableRelay.url) };
      const durableSide = { pid: durableRelay.pid, backends: 'relay' as const };
      const ledgerRelay = relays.find((r) => r.label === 'ledger relay')!;
      const ledgerImage = { ...direct.image, url: new URL('/v1/images/generations', ledgerRelay.url) };
      const ledgerSide = { pid: ledgerRelay.pid, backends: 'ledger' as const };
      for (const concurrency of levels) {
        const manyKeys = concurrency > 1 && keys.length > 1;
        const [d, pk, dr, lr, g, gk] = await abba(
          [
            { kind: 'direct', t: direct.image },
            { kind: 'portkey', t: viaPortkey.image },
            { kind: 'reference', t: durableImage, relay: durableSide },
            { kind: 'reference', t: ledgerImage, relay: ledgerSide },
            { kind: 'gateway', t: gateway.image },
            ...(manyKeys ? [{ kind: 'gateway' as const, t: gatewayKeys }] : []),
          ],
          concurrency,
        );
        const p = { direct: d!, gateway: g! };
        latency.push({ concurrency, pair: p, portkey: pk!, durable: dr!, ledger: lr!, ...(gk && { manyKeys: gk }) });
        log(`\n  n=1 1024x1024 PNG, concurrency ${concurrency}, direct / Portkey / durable relay / ledger relay / Mediagate${gk ? ` one key / Mediagate ${keys.length} keys` : ''} in the same windows (ABBA, ${opts.durationMs / 2000} s per half):`);
        log(indent(multiTable(d!, [['through Portkey', pk!], ['durable relay (floor)', dr!], [opts.ledgerEarly ? 'ledger relay, early call' : "ledger relay (Mediagate's SQL)", lr!], ['Mediagate, one key', g!], ...(gk ? [[`Mediagate, ${keys.length} keys`, gk] as [string, Side]] : [])]), 4));
        for (const line of costLines(p, idleSqlPerSecond)) log(`    ${line}`);
        const perRequest = (side: Side, v: number) => ((1000 * v) / Math.max(1, ok(side.window).length)).toFixed(2);
        log(`    Portkey per request: ${perRequest(pk!, pk!.cost.serverCpu)} ms CPU, ${perRequest(pk!, pk!.cost.serverMainCpu)} ms of it on the main thread`);
        log(`    durable relay per request: ${perRequest(dr!, dr!.cost.serverCpu)} ms CPU, ${perRequest(dr!, dr!.cost.serverMainCpu)} ms of it on the main thread, ${perRequest(dr!, dr!.cost.pgCpu)} ms CPU in PostgreSQL backends`);
        log(`    ledger relay per request: ${perRequest(lr!, lr!.cost.serverCpu)} ms CPU, ${perRequest(lr!, lr!.cost.serverMainCpu)} ms of it on the main thread, ${perRequest(lr!, lr!.cost.pgCpu)} ms CPU in PostgreSQL backends`);
        if (gk) for (const line of costLines({ direct: d!, gateway: gk }, idleSqlPerSecond)) log(`    ${keys.length} keys: ${line}`);
      }

      // The floor on this machine: framework-free relays (relay-server.ts), each against direct.
      const floor: { label: string; pair: Pair }[] = [];
      for (const relay of opts.quick ? [] : relays) {
        const p = await pair(direct.image, { ...direct.image, url: new URL('/v1/images/generations', relay.url) }, 1, 'reference');
        floor.push({ label: relay.label, pair: p });
        log(`\n  reference: ${relay.label}, n=1 1024x1024 PNG, concurrency 1 (ABBA, ${opts.durationMs / 2000} s per half):`);
        log(indent(pairTable(p, false, relay.label), 4));
      }

      // Resizing: the 1K tier at 1:1 is 1248x1248 in the catalog's table, which gpt-image-1 cannot
      // render: Mediagate asks for 1024x1024 and resizes and re-encodes the answer (fitImage). Its
      // cost is the resize request's p50 over the pass-through one's, in the same windows, against
      // sharp alone doing the same work (decode the 1024x1024 PNG, resize, encode PNG) in this
      // process; the server's event-loop delay (max, from its metrics) shows whether it blocks.
      if (opts.quick) {
        const [qD, qR, qL, qG] = await abba(
          [
            { kind: 'direct', t: direct.stream },
            { kind: 'reference', t: { ...direct.stream, url: new URL('/v1/images/generations', durableRelay.url) } },
            { kind: 'reference', t: { ...direct.stream, url: new URL('/v1/images/generations', ledgerRelay.url) } },
            { kind: 'gateway', t: gateway.stream },
          ],
          1,
        );
        const ledgerName = opts.ledgerEarly ? 'ledger relay, early call' : 'ledger relay';
        log(`\n  streaming, partial_images ${opts.partials}, concurrency 1, direct / durable relay / ledger relay / Mediagate (ABBA, ${opts.durationMs / 2000} s per half):`);
        log(indent(multiTable(qD!, [['durable relay', qR!], [ledgerName, qL!], ['through Mediagate', qG!]], true), 4));
        const q = { d: stat(qD!.window), r: stat(qR!.window), l: stat(qL!.window), g: stat(qG!.window) };
        const l1 = latency.find((l) => l.concurrency === 1)!;
        const lN = latency.find((l) => l.concurrency === opts.connections)!;
        const d1 = stat(l1.pair.direct.window);
        const g1 = stat(l1.pair.gateway.window);
        const p1 = stat(l1.portkey.window);
        log(`\n  quick: c=1 added p50 ${(g1.p50 - d1.p50).toFixed(2)} vs Portkey ${(p1.p50 - d1.p50).toFixed(2)} ms, p99 ${(g1.p99 - d1.p99).toFixed(2)} vs ${(p1.p99 - d1.p99).toFixed(2)} ms; ` +
          `c=${opts.connections} ${stat(lN.pair.gateway.window).perSecond.toFixed(0)} (one key) / ${lN.manyKeys ? stat(lN.manyKeys.window).perSecond.toFixed(0) : '-'} (many) vs Portkey ${stat(lN.portkey.window).perSecond.toFixed(0)} req/s; ` +
          `1st partial +${(q.g.firstP50 - q.d.firstP50).toFixed(2)} vs relay +${(q.r.firstP50 - q.d.firstP50).toFixed(2)} ms; ` +
          `durable relay c=1 +${(stat(l1.durable.window).p50 - d1.p50).toFixed(2)} / +${(stat(l1.durable.window).p99 - d1.p99).toFixed(2)} ms, c=${opts.connections} ${stat(lN.durable.window).perSecond.toFixed(0)} req/s; ` +
          `${ledgerName} c=1 +${(stat(l1.ledger.window).p50 - d1.p50).toFixed(2)} / +${(stat(l1.ledger.window).p99 - d1.p99).toFixed(2)} ms, c=${opts.connections} ${stat(lN.ledger.window).perSecond.toFixed(0)} req/s, 1st partial +${(q.l.firstP50 - q.d.firstP50).toFixed(2)} ms`);
        return { failed, rows };
      }
      const resizeTarget = target(server.url, keys.slice(0, 1), { model: BENCH_IMAGE.id, prompt: PROMPT, resolution: '1K', aspectRatio: '1:1', n: 1, output_format: 'png' });
      const lagOf = async () => metricSum(server.url, metricsToken, 'mediagate_nodejs_eventloop_lag_max_seconds');
      await lagOf(); // resets the histogram behind it
      const [rD, rG] = await abba([{ kind: 'direct', t: direct.image }, { kind: 'gateway', t: gateway.image }], 1);
      const passLag = await lagOf();
      const [, rR] = await abba([{ kind: 'direct', t: direct.image }, { kind: 'gateway', t: resizeTarget }], 1);
      const resizeLag = await lagOf();
      const png1024 = Buffer.from((await firstImage(direct.image))!, 'base64');
      const sharpMs: number[] = [];
      const sharpUntil = performance.now() + opts.durationMs;
      while (performance.now() < sharpUntil) {
        const t0 = performance.now();
        await sharp(png1024).resize(1248, 1248, { fit: 'cover', position: 'centre' }).png().toBuffer();
        sharpMs.push(performance.now() - t0);
      }
      const sharpP50 = pct(sortedOf(sharpMs), 50);
      const resizeAdded = stat(rR!.window).p50 - stat(rG!.window).p50;
      log(`\n  resizing: 1K tier at 1:1 (1248x1248 from the upstream's 1024x1024 PNG) vs size 1024x1024 passed through, concurrency 1 (ABBA, ${opts.durationMs / 2000} s per half):`);
      log(indent(multiTable(rD!, [['Mediagate, 1024x1024 (pass-through)', rG!], ['Mediagate, 1K tier (resized)', rR!]]), 4));
      log(`    the resize's cost in Mediagate (p50 resized - p50 pass-through): ${resizeAdded.toFixed(2)} ms; sharp alone, same work: p50 ${sharpP50.toFixed(2)} ms over ${sharpMs.length} runs: ${(resizeAdded / sharpP50).toFixed(2)}x (target <= 1.5x)`);
      log(`    server event-loop delay, max: ${(passLag * 1000).toFixed(1)} ms while passing through, ${(resizeLag * 1000).toFixed(1)} ms while resizing`);
      const resizeFigure = { mediagate: resizeAdded, sharp: sharpP50 };

      // Streaming: Portkey drops `stream` (it answers the whole JSON), so Mediagate's first partial
      // image is compared with the durable reference relay's, in the same windows.
      const [sD, sR, sG] = await abba([{ kind: 'direct', t: direct.stream }, { kind: 'reference', t: { ...direct.stream, url: new URL('/v1/images/generations', durableRelay.url) } }, { kind: 'gateway', t: gateway.stream }], 1);
      const streamPair = { direct: sD!, gateway: sG! };
      const streamFloor = { direct: sD!, gateway: sR! };
      log(`\n  streaming, partial_images ${opts.partials}, n=1 1024x1024 PNG, concurrency 1, direct / durable relay / Mediagate in the same windows (ABBA, ${opts.durationMs / 2000} s per half):`);
      log(indent(multiTable(sD!, [['durable relay', sR!], ['through Mediagate', sG!]], true), 4));
      for (const line of costLines(streamPair, idleSqlPerSecond)) log(`    ${line}`);

      // Memory: C concurrent n=4 3840x2160 PNG generations (photo-weight images).
      const bigWarm = new Agent({ keepAlive: true, maxSockets: 1 });
      for (let i = 0; i < 2; i++) await send(bigWarm, gateway.big, i);
      bigWarm.destroy();
      await new Promise((r) => setTimeout(r, 1000));
      const idle = procStatus(pid);
      resetPeak(pid);
      let sampledPeak = idle.rss;
      const sampler = setInterval(() => (sampledPeak = Math.max(sampledPeak, procStatus(pid).rss)), 20);
      const big = await runRounds(gateway.big, opts.rssConnections, opts.rssRounds);
      clearInterval(sampler);
      const peak = Math.max(procStatus(pid).hwm, sampledPeak);
      const bigDirect = await runRounds(direct.big, opts.rssConnections, opts.rssRounds);
      const inFlightBytes = opts.rssConnections * 4 * smoke.bigBytes;
      const growth = peak - idle.rss;

      // ---- report
      const l1 = latency.find((l) => l.concurrency === 1)!;
      const lN = latency.find((l) => l.concurrency === opts.connections)!;
      const c1 = l1.pair;
      const cN = lN.pair;
      const pk1 = stat(l1.portkey.window);
      const pkN = stat(lN.portkey.window);
      const kN = lN.manyKeys ? stat(lN.manyKeys.window) : undefined;
      const s1 = { d: stat(c1.direct.window), g: stat(c1.gateway.window) };
      const sN = { d: stat(cN.direct.window), g: stat(cN.gateway.window) };
      const sd = stat(streamPair.direct.window);
      const sg = stat(streamPair.gateway.window);
      const bd = stat(bigDirect);
      const bg = stat(big);
      log(`\n  memory: ${opts.rssConnections} connections x ${opts.rssRounds} requests of n=4 3840x2160 PNG (${fmtMiB(4 * smoke.bigBytes)} MiB of images per request):`);
      log(indent(table(['', 'req', 'req/s', 'p50 ms', 'p99 ms', 'errors'], [
        ['direct (fake)', bd.count, bd.perSecond.toFixed(1), bd.p50.toFixed(1), bd.p99.toFixed(1), bd.errors],
        ['through Mediagate', bg.count, bg.perSecond.toFixed(1), bg.p50.toFixed(1), bg.p99.toFixed(1), bg.errors],
      ]), 4));
      log(`    server RSS: ${fmtMiB(startRss)} MiB after start, ${fmtMiB(idle.rss)} MiB idle before the run, peak ${fmtMiB(peak)} MiB: growth ${fmtMiB(growth)} MiB`);
      log(`    images in flight: ${opts.rssConnections} x 4 x ${fmtMiB(smoke.bigBytes)} MiB = ${fmtMiB(inFlightBytes)} MiB; growth / in flight = ${(growth / inFlightBytes).toFixed(2)}x (target <= 2x)`);
      if (inFlightBytes < 64 * MiB) {
        log('    note: images this small weigh less than the V8 young generation (up to tens of MiB), so when the server collects decides most of the growth; the ratio moves between runs');
      }

      log('\n  == Mediagate vs Portkey (same windows; "added" = the percentile minus direct\'s)');
      const addedP50 = { g: s1.g.p50 - s1.d.p50, pk: pk1.p50 - s1.d.p50 };
      const addedP99 = { g: s1.g.p99 - s1.d.p99, pk: pk1.p99 - s1.d.p99 };
      const sFirst = { d: stat(sD!.window), r: stat(sR!.window), g: stat(sG!.window) };
      const vs: (string | number)[][] = [
        ['c=1 added p50', `+${addedP50.g.toFixed(2)} ms`, `+${addedP50.pk.toFixed(2)} ms`, `${(addedP50.g / addedP50.pk).toFixed(2)}x`, '<= Portkey', verdict(addedP50.g <= addedP50.pk)],
        ['c=1 added p99', `+${addedP99.g.toFixed(2)} ms`, `+${addedP99.pk.toFixed(2)} ms`, `${(addedP99.g / addedP99.pk).toFixed(2)}x`, '<= Portkey', verdict(addedP99.g <= addedP99.pk)],
        [`c=${opts.connections} req/s, one key`, sN.g.perSecond.toFixed(0), pkN.perSecond.toFixed(0), `${(sN.g.perSecond / pkN.perSecond).toFixed(2)}x`, '>= 0.8x', verdict(sN.g.perSecond >= 0.8 * pkN.perSecond)],
        ...(kN ? [[`c=${opts.connections} req/s, ${keys.length} keys`, kN.perSecond.toFixed(0), pkN.perSecond.toFixed(0), `${(kN.perSecond / pkN.perSecond).toFixed(2)}x`, '>= 1x', verdict(kN.perSecond >= pkN.perSecond)]] : []),
        [`c=${opts.connections} p50 / p99, one key`, `${sN.g.p50.toFixed(2)} / ${sN.g.p99.toFixed(2)} ms`, `${pkN.p50.toFixed(2)} / ${pkN.p99.toFixed(2)} ms`, '', '', ''],
        (() => {
          const f1 = stat(l1.durable.window);
          const fN = stat(lN.durable.window);
          return ['durable relay (floor), same windows', `c=1 +${(f1.p50 - s1.d.p50).toFixed(2)} / +${(f1.p99 - s1.d.p99).toFixed(2)} ms`, `c=${opts.connections} ${fN.perSecond.toFixed(0)} req/s`, `${(fN.perSecond / pkN.perSecond).toFixed(2)}x`, '', ''];
        })(),
        ['resize 1024->1248 PNG, added p50', `${resizeFigure.mediagate.toFixed(2)} ms`, `sharp alone ${resizeFigure.sharp.toFixed(2)} ms`, `${(resizeFigure.mediagate / resizeFigure.sharp).toFixed(2)}x`, '<= 1.5x sharp', verdict(resizeFigure.mediagate <= 1.5 * resizeFigure.sharp)],
        ['1st partial p50 vs durable relay', `+${(sFirst.g.firstP50 - sFirst.d.firstP50).toFixed(2)} ms`, `relay +${(sFirst.r.firstP50 - sFirst.d.firstP50).toFixed(2)} ms`, `+${(sFirst.g.firstP50 - sFirst.r.firstP50).toFixed(2)} ms`, '<= +0.5 ms', verdict(sFirst.g.firstP50 - sFirst.r.firstP50 <= 0.5)],
      ];
      log(indent(table(['figure', 'Mediagate', 'Portkey', 'ratio', 'target', ''], vs), 4));
      log(`    direct: c=1 p50 ${s1.d.p50.toFixed(2)} ms, p99 ${s1.d.p99.toFixed(2)} ms; c=${opts.connections} ${sN.d.perSecond.toFixed(0)} req/s`);

      log('\n  == figures (Mediagate vs direct, same run; "added" = difference of the percentiles)');
      const figures: (string | number)[][] = [
        ['c=1 latency p50', `${s1.g.p50.toFixed(2)} ms vs ${s1.d.p50.toFixed(2)} ms`, `+${(s1.g.p50 - s1.d.p50).toFixed(2)} ms`, '', ''],
        ['c=1 latency p99', `${s1.g.p99.toFixed(2)} ms vs ${s1.d.p99.toFixed(2)} ms`, `+${(s1.g.p99 - s1.d.p99).toFixed(2)} ms`, '', ''],
        ...floor.map((f) => {
          const r = { d: stat(f.pair.direct.window), g: stat(f.pair.gateway.window) };
          return [`c=1 p50 / p99, ${f.label}`, `${r.g.p50.toFixed(2)} / ${r.g.p99.toFixed(2)} ms vs ${r.d.p50.toFixed(2)} / ${r.d.p99.toFixed(2)} ms`, `+${(r.g.p50 - r.d.p50).toFixed(2)} / +${(r.g.p99 - r.d.p99).toFixed(2)} ms`, 'floor', ''];
        }),
        ['c=1 throughput', `${s1.g.perSecond.toFixed(0)} vs ${s1.d.perSecond.toFixed(0)} req/s`, `${(s1.g.perSecond / s1.d.perSecond).toFixed(2)}x`, '', ''],
        [`c=${opts.connections} latency p50`, `${sN.g.p50.toFixed(2)} ms vs ${sN.d.p50.toFixed(2)} ms`, `+${(sN.g.p50 - sN.d.p50).toFixed(2)} ms`, '', ''],
        [`c=${opts.connections} latency p99`, `${sN.g.p99.toFixed(2)} ms vs ${sN.d.p99.toFixed(2)} ms`, `+${(sN.g.p99 - sN.d.p99).toFixed(2)} ms`, '', ''],
        [`c=${opts.connections} throughput`, `${sN.g.perSecond.toFixed(0)} vs ${sN.d.perSecond.toFixed(0)} req/s`, `${(sN.g.perSecond / sN.d.perSecond).toFixed(2)}x`, '', ''],
        ['first partial p50', `${sg.firstP50.toFixed(2)} ms vs ${sd.firstP50.toFixed(2)} ms`, `+${(sg.firstP50 - sd.firstP50).toFixed(2)} ms`, '', ''],
        (() => {
          const r = { d: stat(streamFloor.direct.window), g: stat(streamFloor.gateway.window) };
          return ['first partial p50, durable relay', `${r.g.firstP50.toFixed(2)} ms vs ${r.d.firstP50.toFixed(2)} ms`, `+${(r.g.firstP50 - r.d.firstP50).toFixed(2)} ms`, 'floor', ''];
        })(),
        ['first partial p99', `${sg.firstP99.toFixed(2)} ms vs ${sd.firstP99.toFixed(2)} ms`, `+${(sg.firstP99 - sd.firstP99).toFixed(2)} ms`, '', ''],
        ['RSS growth, n=4 4K PNG', `${fmtMiB(growth)} MiB vs ${fmtMiB(inFlightBytes)} MiB in flight`, `${(growth / inFlightBytes).toFixed(2)}x`, '<= 2x', verdict(growth <= 2 * inFlightBytes)],
      ];
      log(indent(table(['figure', 'Mediagate vs direct', 'added', 'target', ''], figures), 4));
      log(`    server idle RSS ${fmtMiB(idle.rss)} MiB (${fmtMiB(startRss)} MiB after start), peak ${fmtMiB(peak)} MiB`);

      for (const [label, p] of [...latency.map((l) => [`c${l.concurrency}`, l.pair] as const), ['stream', streamPair] as const]) {
        rows.push({ scenario: `proxy ${label} direct`, summary: summarize(ok(p.direct.window).map((s) => s.ms), p.direct.window.seconds, errors(p.direct.window)) });
        rows.push({ scenario: `proxy ${label} Mediagate`, summary: summarize(ok(p.gateway.window).map((s) => s.ms), p.gateway.window.seconds, errors(p.gateway.window)) });
      }
      for (const w of [...latency.flatMap((l) => [l.pair.direct.window, l.pair.gateway.window, l.portkey.window, ...(l.manyKeys ? [l.manyKeys.window] : [])]), ...floor.flatMap((f) => [f.pair.direct.window, f.pair.gateway.window]), streamPair.direct.window, streamPair.gateway.window, streamFloor.direct.window, streamFloor.gateway.window, big, bigDirect]) {
        const first = w.samples.find((s) => s.error);
        if (first) {
          failed = true;
          log(`  ${errors(w)} failed requests, first: ${first.error}`);
        }
      }
    } catch (err) {
      // A server that died mid-run: its own last words, not only the bench's symptom.
      if (server.child.exitCode !== null || server.child.signalCode !== null) {
        throw new Error(`${(err as Error).message}\nthe server exited (code ${server.child.exitCode}, signal ${server.child.signalCode}); its stderr:\n${server.stderr().slice(-6000)}`, { cause: err });
      }
      throw err;
    } finally {
      await server.kill('SIGTERM');
      await portkey.stop();
      for (const relay of relays) await relay.stop();
    }
  } finally {
    await db.destroy();
    await fake.close();
    await heavy.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
  return { failed, rows };
}

// ---------------------------------------------------------------------------------------------

const PORTKEY_VERSION = (JSON.parse(readFileSync(join(repoRoot, 'node_modules/@portkey-ai/gateway/package.json'), 'utf8')) as { version: string }).version;

/** A free loopback port (Portkey's start-server.js takes a port, not 0). */
async function freePort(): Promise<number> {
  const { createServer } = await import('node:net');
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
}

/**
 * Portkey's open-source gateway (@portkey-ai/gateway, its Node build) as its own process, as its
 * README starts it (`npx @portkey-ai/gateway`), headless and with NODE_ENV=production (no console).
 * It listens on all interfaces (its start script takes no host); the bench only talks to it over
 * loopback. Ready once a request to it is answered.
 */
async function startPortkey(upstream: string): Promise<{ url: string; pid: number; stop(): Promise<void> }> {
  const port = await freePort();
  const entry = join(repoRoot, 'node_modules/@portkey-ai/gateway/build/start-server.js');
  const child = spawn(process.execPath, [entry, `--port=${port}`, '--headless'], {
    cwd: repoRoot,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', NODE_ENV: 'production' },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`Portkey's gateway exited with ${child.exitCode}: ${stderr}`);
    const up = await fetch(`${url}/v1/models`, { headers: { 'x-portkey-provider': 'openai', 'x-portkey-custom-host': `${upstream}/v1` } }).then(
      () => true,
      () => false,
    );
    if (up) break;
    if (Date.now() > deadline) throw new Error(`Portkey's gateway did not answer on ${url} within 30 s: ${stderr}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  return {
    url,
    pid: child.pid!,
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
  };
}

/** Sides measured in the same windows, each against the direct one. */
function multiTable(direct: Side, sides: [string, Side][], streaming = false): string {
  const d = stat(direct.window);
  const header = ['', 'req', 'req/s', 'p50 ms', 'p90 ms', 'p99 ms', 'max ms', 'added p50', 'added p99', ...(streaming ? ['1st partial p50', '1st partial p99', 'added 1st p50'] : []), 'KiB/answer', 'errors'];
  const signed = (v: number) => `${v >= 0 ? '+' : ''}${v.toFixed(2)}`;
  const row = (label: string, s: ReturnType<typeof stat>, base: boolean) => [
    label,
    s.count,
    s.perSecond.toFixed(0),
    s.p50.toFixed(2),
    s.p90.toFixed(2),
    s.p99.toFixed(2),
    s.max.toFixed(2),
    base ? '' : signed(s.p50 - d.p50),
    base ? '' : signed(s.p99 - d.p99),
    ...(streaming ? [s.firstP50.toFixed(2), s.firstP99.toFixed(2), base ? '' : signed(s.firstP50 - d.firstP50)] : []),
    (s.bytes / 1024).toFixed(1),
    s.errors,
  ];
  return table(header, [row('direct (fake)', d, true), ...sides.map(([label, side]) => row(label, stat(side.window), false))]);
}

/** The ledger relay's own account and key (one key, as Mediagate's one-key side), charged at the bench model's 1024x1024 price. */
async function ledgerAccount(db: Kysely<DB>, groupId: string): Promise<LedgerIds> {
  const account = await createAccount(db, { balance: 1_000_000_000 });
  const key = await createApiKey(db, { accountId: account.id, groupId });
  return { accountId: account.id, apiKeyId: key.id, groupId, model: BENCH_IMAGE.id, unitPrice: prices[0]!.unitPrice };
}

/** Starts a reference relay (relay-server.ts) as its own process, from the build with `--built`. */
async function startRelay(opts: ProxyOptions, upstream: string, mode: RelayMode, databaseUrl?: string, ledger?: LedgerIds): Promise<{ url: string; pid: number; stop(): Promise<void> }> {
  const entry = opts.built ? ['dist/scripts/bench/relay-server.js'] : ['--import', 'tsx', 'scripts/bench/relay-server.ts'];
  const child = spawn(process.execPath, [...entry, upstream, mode, ...(databaseUrl ? [databaseUrl] : [])], {
    cwd: repoRoot,
    stdio: ['ignore', 'pipe', 'inherit'],
    // The relay writes its copies under the OS's temporary directory: the same volume as the server's.
    env: { ...process.env, ...(opts.dataDir && { TMPDIR: opts.dataDir }), ...(ledger && { BENCH_LEDGER: JSON.stringify(ledger) }) },
  });
  const url = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => {
      out += chunk.toString('utf8');
      const line = out.split('\n')[0]!;
      if (out.includes('\n')) resolve(line.trim());
    });
    child.once('exit', (code) => reject(new Error(`relay-server (${mode}) exited with ${code}`)));
  });
  return {
    url,
    pid: child.pid!,
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
  };
}

async function smokeCheck(
  direct: { image: Target; big: Target; stream: Target },
  gateway: { image: Target; big: Target; stream: Target },
): Promise<{ smallBytes: number; bigBytes: number; identical: boolean }> {
  // No keep-alive: the 4K requests take seconds, and a server's idle connection may close (Node's
  // 5 s keepAliveTimeout) just as the next request goes out on it (a socket hang-up, not a failure).
  const agent = new Agent({ keepAlive: false });
  try {
    const images = async (t: Target) => {
      const r = await send(agent, t, 0, true);
      if (r.error) throw new Error(`smoke request to ${t.url.origin} failed: ${r.error}`);
      const body = JSON.parse(r.body!.toString('utf8')) as { data: { b64_json: string }[] };
      return body.data.map((d) => Buffer.from(d.b64_json, 'base64'));
    };
    const named = (name: string, t: Target) => images(t).catch((err: Error) => {
      throw new Error(`${name}: ${err.message}`);
    });
    const [ds, gs, db, gb] = [await named('direct', direct.image), await named('Mediagate', gateway.image), await named('direct 4K', direct.big), await named('Mediagate 4K', gateway.big)];
    const hash = (bufs: Buffer[]) => bufs.map((b) => createHash('sha256').update(b).digest('hex')).join(',');
    for (const t of [direct.stream, gateway.stream]) {
      const r = await send(agent, t, 0);
      if (r.error) throw new Error(`smoke stream to ${t.url.origin} failed: ${r.error}`);
    }
    return { smallBytes: ds[0]!.length, bigBytes: db.reduce((s, b) => s + b.length, 0) / db.length, identical: hash(ds) === hash(gs) && hash(db) === hash(gb) && gb.length === 4 };
  } finally {
    agent.destroy();
  }
}

function merge(a: Side, b: Side): Side {
  return {
    window: { samples: [...a.window.samples, ...b.window.samples], seconds: a.window.seconds + b.window.seconds },
    cost: {
      serverCpu: a.cost.serverCpu + b.cost.serverCpu,
      serverMainCpu: a.cost.serverMainCpu + b.cost.serverMainCpu,
      pgCpu: a.cost.pgCpu + b.cost.pgCpu,
      sql: a.cost.sql + b.cost.sql,
      // Weighted by time.
      fakeElu: (a.cost.fakeElu * a.window.seconds + b.cost.fakeElu * b.window.seconds) / (a.window.seconds + b.window.seconds),
      machineBusy: (a.cost.machineBusy * a.window.seconds + b.cost.machineBusy * b.window.seconds) / (a.window.seconds + b.window.seconds),
      loadElu: (a.cost.loadElu * a.window.seconds + b.cost.loadElu * b.window.seconds) / (a.window.seconds + b.window.seconds),
      upstreamConnections: a.cost.upstreamConnections + b.cost.upstreamConnections,
    },
  };
}

const ok = (w: Window) => w.samples.filter((s) => !s.error);
const errors = (w: Window) => w.samples.length - ok(w).length;

function sortedOf(values: number[]): Float64Array {
  return Float64Array.from(values).sort();
}

function pct(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

function stat(w: Window) {
  const good = ok(w);
  const ms = sortedOf(good.map((s) => s.ms));
  const first = sortedOf(good.flatMap((s) => (s.firstPartialMs === undefined ? [] : [s.firstPartialMs])));
  return {
    count: good.length,
    errors: w.samples.length - good.length,
    perSecond: good.length / w.seconds,
    p50: pct(ms, 50),
    p90: pct(ms, 90),
    p99: pct(ms, 99),
    max: ms.length ? ms[ms.length - 1]! : NaN,
    mean: ms.reduce((s, v) => s + v, 0) / Math.max(1, ms.length),
    firstP50: pct(first, 50),
    firstP99: pct(first, 99),
    bytes: good.reduce((s, v) => s + v.bytes, 0) / Math.max(1, good.length),
  };
}

function pairTable(p: Pair, streaming: boolean, label = 'through Mediagate'): string {
  const d = stat(p.direct.window);
  const g = stat(p.gateway.window);
  const header = ['', 'req', 'req/s', 'p50 ms', 'p90 ms', 'p99 ms', 'max ms', ...(streaming ? ['1st partial p50', '1st partial p99'] : []), 'KiB/answer', 'errors'];
  const row = (label: string, s: ReturnType<typeof stat>) => [
    label,
    s.count,
    s.perSecond.toFixed(0),
    s.p50.toFixed(2),
    s.p90.toFixed(2),
    s.p99.toFixed(2),
    s.max.toFixed(2),
    ...(streaming ? [s.firstP50.toFixed(2), s.firstP99.toFixed(2)] : []),
    (s.bytes / 1024).toFixed(1),
    s.errors,
  ];
  const signed = (v: number) => `${v >= 0 ? '+' : ''}${v.toFixed(2)}`;
  const added = ['added', '', `${(g.perSecond / d.perSecond).toFixed(2)}x`, signed(g.p50 - d.p50), signed(g.p90 - d.p90), signed(g.p99 - d.p99), signed(g.max - d.max), ...(streaming ? [signed(g.firstP50 - d.firstP50), signed(g.firstP99 - d.firstP99)] : []), '', ''];
  return table(header, [row('direct (fake)', d), row(label, g), added]);
}

/** Where the work of a pair went: the server's CPU and SQL per request, and who else was busy. */
function costLines(p: Pair, idleSqlPerSecond: number): string[] {
  const n = Math.max(1, ok(p.gateway.window).length);
  const dn = ok(p.direct.window).length;
  const g = p.gateway.cost;
  const d = p.direct.cost;
  const sql = (g.sql - idleSqlPerSecond * p.gateway.window.seconds) / n;
  const pc = (v: number) => `${(100 * v).toFixed(0)}%`;
  return [
    `server per request: ${((1000 * g.serverCpu) / n).toFixed(2)} ms CPU, ${((1000 * g.serverMainCpu) / n).toFixed(2)} ms of it on the main thread ` +
      `(busy ${pc(g.serverMainCpu / p.gateway.window.seconds)}), ${sql.toFixed(2)} SQL statements, ${((1000 * g.pgCpu) / n).toFixed(2)} ms CPU in PostgreSQL backends`,
    `busy, direct / Mediagate: all ${availableParallelism()} cores ${pc(d.machineBusy)} / ${pc(g.machineBusy)}, fake thread ${pc(d.fakeElu)} / ${pc(g.fakeElu)}, ` +
      `load generator ${pc(d.loadElu)} / ${pc(g.loadElu)}; upstream connections opened ${d.upstreamConnections} / ${g.upstreamConnections} for ${dn} / ${n} requests`,
  ];
}

const fmtMiB = (bytes: number) => (bytes / MiB).toFixed(1);
const verdict = (met: boolean) => (met ? 'met' : 'MISSED');

function indent(text: string, n: number): string {
  return text.replace(/^/gm, ' '.repeat(n));
}
