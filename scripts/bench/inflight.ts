/**
 * Thousands of upstream video jobs in flight on one server process (the task engine's scale
 * figure). A fake OpenAI-compatible `/v1/videos` upstream (test/fakes/openai-video-upstream.ts) runs in
 * this process and completes each job `delayMs` after its submit; the server runs as a child
 * process with one `openai` member pointing at it. The bench creates `tasks` video tasks through
 * the API and reports:
 *   - creation rate (202s per second),
 *   - peak jobs in flight (submitted upstream, not yet finished here),
 *   - detection delay: upstream done → task `completed`, p50 / p99 / max,
 *   - claim lag: the oldest due step no worker has claimed yet, sampled every 250 ms,
 *   - SQL statements per poll step (server metrics, in a window where only polls run),
 *   - the server's peak RSS and CPU time,
 * each next to a baseline from the same run: a direct status call to the fake upstream.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { createDatabase } from '../../server/db/database.ts';
import { startOpenAIVideosFake } from '../../test/fakes/openai-video-upstream.ts';
import { seedCatalog, createAccount, createGroup, createApiKey } from '../../test/support/factories.ts';
import { spawnServer } from '../../test/support/server-process.ts';
import { SORA_2, addUpstreamMember } from '../../test/support/upstreams.ts';
import { serverCommand } from './server-command.ts';
import { percentile } from './stats.ts';

export interface InflightOptions {
  tasks: number;
  delayMs: number;
  pollMs: number;
  connections: number;
  /** Write a V8 CPU profile of the server process here (when it exits). */
  cpuProfDir?: string;
  /** Run the tsc build (`node dist/server/main.js`) instead of tsx. */
  built?: boolean;
}

export interface InflightResult {
  tasks: number;
  createPerSecond: number;
  peakInFlight: number;
  detection: { p50: number; p99: number; max: number };
  /** The oldest due, unclaimed step, sampled every 250 ms (ms). */
  claimLag: { p50: number; p99: number; max: number };
  sqlPerPollStep: number | undefined;
  peakRssMiB: number;
  idleRssMiB: number;
  cpuSeconds: number;
  wallSeconds: number;
  failed: number;
  baselineDirectPollMs: number;
}

const CLK_TCK = 100;

function procStats(pid: number): { rss: number; hwm: number; cpu: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  // Fields 14 and 15 (utime, stime) are at 11 and 12 after the command name.
  const cpu = (Number(stat[11]) + Number(stat[12])) / CLK_TCK;
  return { rss: kb('VmRSS'), hwm: kb('VmHWM'), cpu };
}

async function metric(url: string, token: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`, { headers: { Authorization: `Bearer ${token}` } })).text();
  let sum = 0;
  for (const line of text.split('\n')) if (line.startsWith(name) && !line.startsWith('#')) sum += Number(line.split(' ').at(-1));
  return sum;
}

export async function runInflight(databaseUrl: string, opts: InflightOptions, log: (line: string) => void): Promise<InflightResult> {
  const MiB = 1024 * 1024;
  const fake = await startOpenAIVideosFake({ jobDurationMs: opts.delayMs, record: false, contentBytes: 4096 });
  // Keep connections alive as a real API does (the fake's 1 s suits tests; with undici's 2 s
  // threshold it would make every poll a new TCP connection).
  fake.server.keepAliveTimeout = 30_000;
  const secret = randomBytes(32);
  const db = createDatabase(databaseUrl, { max: 4, applicationName: 'mediagate-bench-inflight' });
  const metricsToken = randomBytes(16).toString('hex');
  try {
    await seedCatalog(db, [SORA_2]);
    const account = await createAccount(db, { balance: 1_000_000 });
    const group = await createGroup(db);
    await addUpstreamMember(db, secret, { groupId: group.id, provider: 'openai', baseUrl: `${fake.url}/v1`, credentials: { api_key: 'sk-test' }, models: [SORA_2.id] });
    const key = await createApiKey(db, { accountId: account.id, groupId: group.id });

    const server = await spawnServer({
      env: {
        DATABASE_URL: databaseUrl,
        MEDIAGATE_SECRET_KEY: secret.toString('hex'),
        MEDIAGATE_DATA_DIR: join(tmpdir(), `mediagate-bench-inflight-${process.pid}`),
        DEMO_DATA: '0',
        VALIDATE_RESPONSES: '0',
        METRICS_TOKEN: metricsToken,
        VIDEO_POLL_INTERVAL_MS: String(opts.pollMs),
        TASK_MAX_LIFETIME_SECONDS: String(Math.ceil((opts.delayMs * 4) / 1000) + 3600),
        DB_POOL_MAX: '10',
        ...(process.env.BENCH_SERVER_ENV ? (JSON.parse(process.env.BENCH_SERVER_ENV) as Record<string, string>) : {}),
      },
      command: serverCommand(opts),
    });
    const pid = server.child.pid!;
    const idle = procStats(pid);
    try {
      // Baseline: a direct status call to the fake upstream, no gateway in between.
      const probe = await fetch(`${fake.url}/v1/videos`, { method: 'POST', headers: { Authorization: 'Bearer sk-test', 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: 'probe', seconds: '4' }) });
      const probeId = ((await probe.json()) as { id: string }).id;
      const baselineStart = performance.now();
      for (let i = 0; i < 200; i++) await (await fetch(`${fake.url}/v1/videos/${probeId}`, { headers: { Authorization: 'Bearer sk-test' } })).arrayBuffer();
      const baselineDirectPollMs = (performance.now() - baselineStart) / 200;

      const started = performance.now();
      let next = 0;
      let failed = 0;
      const body = (i: number) => JSON.stringify({ client_request_id: `inflight-${i}`, prompt: `clip ${i}`, model: SORA_2.id, seconds: 4, aspectRatio: '16:9', resolution: '720p' });
      const creator = async () => {
        while (next < opts.tasks) {
          const i = next++;
          const res = await fetch(`${server.url}/v1/videos/generations`, { method: 'POST', headers: { Authorization: `Bearer ${key.key}`, 'Content-Type': 'application/json' }, body: body(i) });
          await res.arrayBuffer();
          if (res.status !== 202) failed++;
        }
      };
      let peakInFlight = 0;
      const claimLags: number[] = [];
      const timeline: string[] = [];
      let lastCpu = { cpu: idle.cpu, at: performance.now() };
      let peakRss = idle.rss;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          const row = await db
            .selectFrom('videoTasks')
            .select((eb) => eb.fn.countAll<number>().as('n'))
            .where('status', '=', 'in_progress')
            .where('upstreamJobId', 'is not', null)
            .executeTakeFirstOrThrow();
          peakInFlight = Math.max(peakInFlight, Number(row.n));
          peakRss = Math.max(peakRss, procStats(pid).rss);
          // How far behind the engine is: the oldest step that is due and not claimed yet.
          const due = await sql<{ lag: number | null }>`
            select extract(epoch from now() - min(next_run_at)) * 1000 as lag from video_tasks
            where status in ('queued', 'in_progress') and next_run_at <= now() and (lease_expires_at is null or lease_expires_at < now())`.execute(db);
          claimLags.push(Number(due.rows[0]?.lag ?? 0));
          if (process.env.BENCH_TIMELINE) {
            const now = performance.now();
            const cpu = procStats(pid).cpu;
            const waits = await sql<{ locked: number }>`
              select count(*) filter (where wait_event_type = 'Lock')::int as locked
              from pg_stat_activity where datname = current_database() and application_name like 'mediagate-%' and application_name <> 'mediagate-bench-inflight'`.execute(db);
            timeline.push(`${((now - started) / 1000).toFixed(1)}:${(Number(due.rows[0]?.lag ?? 0) / 1000).toFixed(1)}:${Math.round(((cpu - lastCpu.cpu) / ((now - lastCpu.at) / 1000)) * 100)}%:L${waits.rows[0]?.locked}`);
            lastCpu = { cpu, at: now };
          }
          await new Promise((r) => setTimeout(r, 250));
        }
      })();
      await Promise.all(Array.from({ length: opts.connections }, creator));
      const createSeconds = (performance.now() - started) / 1000;
      log(`  created ${opts.tasks - failed} tasks in ${createSeconds.toFixed(1)} s (${failed} failed)`);

      // A window with polls only: after every submit, before the first job is done upstream.
      let sqlPerPollStep: number | undefined;
      const firstDoneAt = Date.now() - createSeconds * 1000 + opts.delayMs;
      await new Promise((r) => setTimeout(r, Math.min(2000, Math.max(0, firstDoneAt - Date.now() - 4000))));
      if (firstDoneAt - Date.now() > opts.pollMs * 1.5) {
        const q0 = await metric(server.url, metricsToken, 'mediagate_db_queries_total');
        const s0 = await metric(server.url, metricsToken, 'mediagate_task_steps_total');
        await new Promise((r) => setTimeout(r, Math.min(opts.pollMs * 1.5, firstDoneAt - Date.now() - 500)));
        const q1 = await metric(server.url, metricsToken, 'mediagate_db_queries_total');
        const s1 = await metric(server.url, metricsToken, 'mediagate_task_steps_total');
        // The two /metrics scrapes run no SQL; the sampler's count runs on the bench's own pool.
        sqlPerPollStep = s1 > s0 ? (q1 - q0) / (s1 - s0) : undefined;
        log(`  poll window: ${s1 - s0} steps, ${q1 - q0} SQL statements`);
      }

      // Wait for every task to finish.
      for (;;) {
        const left = await db
          .selectFrom('videoTasks')
          .select((eb) => eb.fn.countAll<number>().as('n'))
          .where('status', 'in', ['queued', 'in_progress'])
          .executeTakeFirstOrThrow();
        if (Number(left.n) === 0) break;
        await new Promise((r) => setTimeout(r, 500));
      }
      sampling = false;
      await sampler;
      const wallSeconds = (performance.now() - started) / 1000;
      const end = procStats(pid);

      const rows = await db.selectFrom('videoTasks').select(['status', 'upstreamJobId', 'completedAt']).execute();
      const delays: number[] = [];
      let notCompleted = 0;
      for (const r of rows) {
        const job = r.upstreamJobId ? fake.jobs.get(r.upstreamJobId) : undefined;
        if (r.status !== 'completed' || !job || !r.completedAt) {
          notCompleted++;
          continue;
        }
        delays.push(r.completedAt.getTime() - (job.createdAt + opts.delayMs));
      }
      delays.sort((a, b) => a - b);
      claimLags.sort((a, b) => a - b);
      if (process.env.BENCH_TIMELINE) log(`  timeline (s since start:claim lag s:server CPU:backends waiting on a lock): ${timeline.join(' ')}`);
      return {
        tasks: opts.tasks,
        createPerSecond: (opts.tasks - failed) / createSeconds,
        peakInFlight,
        detection: { p50: percentile(delays, 50), p99: percentile(delays, 99), max: delays.at(-1) ?? NaN },
        claimLag: { p50: percentile(claimLags, 50), p99: percentile(claimLags, 99), max: claimLags.at(-1) ?? NaN },
        sqlPerPollStep,
        peakRssMiB: Math.max(peakRss, end.hwm) / MiB,
        idleRssMiB: idle.rss / MiB,
        cpuSeconds: end.cpu - idle.cpu,
        wallSeconds,
        failed: failed + notCompleted,
        baselineDirectPollMs,
      };
    } finally {
      await server.kill('SIGTERM');
    }
  } finally {
    await db.destroy();
    await fake.close();
  }
}
