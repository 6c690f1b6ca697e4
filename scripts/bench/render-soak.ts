/**
 * Render soak (issue 26, item 9): does the local video renderer give back what each clip used?
 * A worker process (render-soak-worker.ts) renders local videos through LocalVideoProvider at
 * `rate` jobs per second (what its render concurrency cannot take is skipped and counted) for
 * `warmup` + `duration` seconds, while this process samples the worker's RSS and open file
 * descriptors every second. Reported: the worker's idle RSS (renderer loaded, nothing running:
 * the baseline), the RSS at the start and at the end of the measured part (medians of a tenth of
 * it each, so one sample taken in the middle of a 720p clip does not decide), the drift between
 * the two in % (target within ±10%), the slope over the measured part, and the descriptors.
 */
import { fork } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import type { SoakCounts, SoakStart } from './render-soak-worker.ts';

export interface RenderSoakOptions {
  /** Jobs per second asked for. */
  rate: number;
  warmupMs: number;
  durationMs: number;
}

export interface RenderSoakResult {
  counts: SoakCounts;
  idleRssMiB: number;
  /** Median RSS of the first and of the last tenth of the measured part. */
  startRssMiB: number;
  endRssMiB: number;
  driftPercent: number;
  maxRssMiB: number;
  /** Least-squares slope of RSS over the measured part, MiB per minute. */
  slopeMiBPerMinute: number;
  startFds: number;
  endFds: number;
  measuredSeconds: number;
}

const MiB = 1024 * 1024;

function rssOf(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? NaN) * 1024;
}

function fdsOf(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length ? sorted[Math.floor(sorted.length / 2)]! : NaN;
}

function slope(points: { t: number; v: number }[]): number {
  const n = points.length;
  if (n < 2) return 0;
  const mt = points.reduce((s, p) => s + p.t, 0) / n;
  const mv = points.reduce((s, p) => s + p.v, 0) / n;
  let num = 0, den = 0;
  for (const p of points) {
    num += (p.t - mt) * (p.v - mv);
    den += (p.t - mt) ** 2;
  }
  return den > 0 ? num / den : 0;
}

export async function runRenderSoak(opts: RenderSoakOptions, log: (line: string) => void): Promise<RenderSoakResult> {
  const child = fork(new URL('./render-soak-worker.ts', import.meta.url), [], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const pid = child.pid!;
  let counts: SoakCounts = { attempted: 0, skipped: 0, rendered: 0, failed: 0 };
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const message = (type: string) =>
    new Promise<Record<string, unknown>>((resolve, reject) => {
      const onMessage = (m: { type: string }) => {
        if (m.type === 'progress') counts = m as unknown as SoakCounts;
        if (m.type !== type) return;
        child.off('message', onMessage);
        resolve(m);
      };
      child.on('message', onMessage);
      void exited.then((code) => reject(new Error(`the soak worker exited (code ${code}) before '${type}'`)));
    });
  try {
    await message('ready');
    // Baseline: the same process, renderer loaded, idle.
    const idle: number[] = [];
    for (let i = 0; i < 5; i++) {
      idle.push(rssOf(pid));
      await new Promise((r) => setTimeout(r, 200));
    }
    const idleRss = median(idle);
    const idleFds = fdsOf(pid);
    // glibc's malloc settings change the RSS a long run settles at (its arenas keep freed memory).
    const malloc = Object.entries(process.env).filter(([k]) => k.startsWith('MALLOC_')).map(([k, v]) => `${k}=${v}`);
    log(`  worker idle (renderer loaded): RSS ${(idleRss / MiB).toFixed(0)} MiB, ${idleFds} open descriptors; malloc: ${malloc.join(' ') || 'glibc defaults'}`);

    const totalMs = opts.warmupMs + opts.durationMs;
    const done = message('done');
    child.send({ type: 'start', rate: opts.rate, seconds: totalMs / 1000 } satisfies SoakStart);
    const started = performance.now();
    const samples: { t: number; rss: number; fds: number }[] = [];
    let ended = false;
    void done.then(() => (ended = true), () => (ended = true));
    const printEvery = Math.max(10_000, Math.round(totalMs / 20 / 1000) * 1000);
    let lastPrint = 0;
    while (!ended && performance.now() - started < totalMs) {
      await new Promise((r) => setTimeout(r, 1000));
      const t = performance.now() - started;
      if (t > totalMs) break;
      const s = { t, rss: rssOf(pid), fds: fdsOf(pid) };
      samples.push(s);
      if (t - lastPrint >= printEvery) {
        lastPrint = t;
        const heap = counts.heapTotal === undefined ? '' : ` (V8 heap ${(counts.heapTotal / MiB).toFixed(0)} MiB)`;
        log(`  ${(t / 1000).toFixed(0).padStart(4)} s${t < opts.warmupMs ? ' (warm-up)' : ''}: RSS ${(s.rss / MiB).toFixed(0)} MiB${heap}, ${s.fds} fds; ${counts.rendered} rendered, ${counts.skipped} skipped, ${counts.failed} failed`);
      }
    }
    counts = (await done) as unknown as SoakCounts;

    const measured = samples.filter((s) => s.t >= opts.warmupMs);
    if (measured.length < 2) throw new Error('the soak measured fewer than 2 samples: raise --duration');
    // A tenth of the measured part at each end: one sample swings by ±20% with the clips in flight.
    const window = Math.max(10_000, opts.durationMs / 10);
    const between = (from: number, to: number) => samples.filter((s) => s.t >= from && s.t < to).map((s) => s.rss);
    const startRss = median(between(opts.warmupMs, opts.warmupMs + window));
    const endRss = median(between(totalMs - window, totalMs + 1000));
    return {
      counts,
      idleRssMiB: idleRss / MiB,
      startRssMiB: startRss / MiB,
      endRssMiB: endRss / MiB,
      driftPercent: (100 * (endRss - startRss)) / startRss,
      maxRssMiB: Math.max(...measured.map((s) => s.rss)) / MiB,
      slopeMiBPerMinute: (slope(measured.map((s) => ({ t: s.t, v: s.rss }))) * 60_000) / MiB,
      startFds: measured[0]!.fds,
      endFds: measured.at(-1)!.fds,
      measuredSeconds: (measured.at(-1)!.t - measured[0]!.t) / 1000,
    };
  } finally {
    if (child.exitCode === null) child.kill();
    await exited;
  }
}

/** Prints the result; false when a render failed or the drift is outside ±10%. */
export function reportRenderSoak(r: RenderSoakResult, opts: RenderSoakOptions, log: (line: string) => void): boolean {
  const c = r.counts;
  const seconds = (opts.warmupMs + opts.durationMs) / 1000;
  log(`  ${c.attempted} renders asked for (${opts.rate}/s for ${seconds} s), ${c.rendered} rendered (${(c.rendered / seconds).toFixed(1)}/s), ${c.skipped} skipped while the render slots were busy, ${c.failed} failed${c.firstError ? ` (first: ${c.firstError})` : ''}`);
  log(
    `  worker RSS: idle ${r.idleRssMiB.toFixed(0)} MiB (baseline); after the ${opts.warmupMs / 1000} s warm-up ${r.startRssMiB.toFixed(0)} MiB, at the end ${r.endRssMiB.toFixed(0)} MiB (medians of a tenth each): ` +
      `drift ${r.driftPercent >= 0 ? '+' : ''}${r.driftPercent.toFixed(1)}% (target within ±10%); max ${r.maxRssMiB.toFixed(0)} MiB; slope ${r.slopeMiBPerMinute.toFixed(2)} MiB/min over ${r.measuredSeconds.toFixed(0)} s`,
  );
  log(`  open descriptors: ${r.startFds} after the warm-up, ${r.endFds} at the end`);
  return c.failed === 0 && Math.abs(r.driftPercent) <= 10;
}
