/**
 * Renders local clips in a fresh process and reports what they leave behind, one JSON line per
 * phase on stdout. Run by test/unit/local-video-resources.test.ts as
 * `node --expose-gc --import tsx test/support/render-leak-probe.ts` with glibc's malloc set to one
 * arena that serves everything under 32 MiB and never gives memory back: RSS is then the heap's
 * high-water mark, flat once the renders' allocations have been seen and pushed up by whatever a
 * render leaks. (By default, thread arenas and trimming move RSS by several MiB either way within
 * seconds: as much as a leak adds in that time.) V8's committed heap is left out of the figure: it
 * grows and shrinks by several MiB as the collector sizes it, and a native leak is not in it.
 *   memory        60 renders to warm up, then 160 more: the native RSS after every 10, open descriptors
 *   abort         clips aborted while their file is being written: descriptors and partial files left
 *   failed-write  a clip whose file outgrows RLIMIT_FSIZE (set on this process with prlimit) while
 *                 it is written: how the render ended, descriptors and partial files left
 */
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { renderVideo } from '../../server/providers/local/video/render-video.ts';

const WARMUP = 60;
const SAMPLES = 16;
const EVERY = 10;

const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('run with --expose-gc');

const dir = await mkdtemp(join(tmpdir(), 'mg-leak-probe-'));

const openFds = () => readdirSync('/proc/self/fd').length;
const partials = () => readdirSync(dir).filter((f) => f.endsWith('.partial')).length;
const report = (phase: string, facts: Record<string, unknown>) => process.stdout.write(`${JSON.stringify({ phase, ...facts })}\n`);

/** Collects garbage and lets the native finalizers (which run on the event loop) run. */
async function settledRss(): Promise<number> {
  for (let i = 0; i < 3; i++) {
    gc!();
    await new Promise((r) => setImmediate(r));
  }
  const { rss, heapTotal } = process.memoryUsage();
  return rss - heapTotal;
}

/** The smallest clip that still runs every step: text layers, x264, AAC on every other one. */
async function tinyClip(n: number): Promise<void> {
  const outputPath = join(dir, `tiny-${n}.mp4`);
  await renderVideo({ prompt: `leak probe clip ${n}`, durationSeconds: 1, width: 64, height: 64, audio: n % 2 === 1, outputPath });
  await rm(outputPath);
}

function setFileSizeLimit(limit: string): void {
  // Soft limit only, so it can be lifted again. Node ignores SIGXFSZ: a write past it fails with EFBIG.
  const r = spawnSync('prlimit', ['--pid', String(process.pid), `--fsize=${limit}:`], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`prlimit failed: ${r.error?.message ?? r.stderr}`);
}

try {
  // One at a time: two at once (as LocalVideoProvider renders) make the allocator's RSS steps
  // as large as what a leak adds.
  let n = 0;
  while (n < WARMUP) await tinyClip(n++);
  const rss = [await settledRss()];
  const fdsBefore = openFds();
  for (let s = 0; s < SAMPLES; s++) {
    for (let i = 0; i < EVERY; i++) await tinyClip(n++);
    rss.push(await settledRss());
  }
  report('memory', { every: EVERY, rss, fdsBefore, fdsAfter: openFds() });

  const abortFds = openFds();
  let aborted = 0;
  for (let k = 0; k < 4; k++) {
    const controller = new AbortController();
    // Aborted once its file exists: the encoders and the muxer are open.
    const watch = setInterval(() => partials() > 0 && controller.abort(new Error('probe abort')), 5);
    const clip = { prompt: 'aborted', durationSeconds: 20, width: 320, height: 240, audio: true, outputPath: join(dir, `aborted-${k}.mp4`), signal: controller.signal };
    await renderVideo(clip).catch((err: unknown) => {
      if ((err as Error).message === 'probe abort') aborted++;
    });
    clearInterval(watch);
  }
  await settledRss();
  report('abort', { aborted, fdsBefore: abortFds, fdsAfter: openFds(), partials: partials() });

  const writeFds = openFds();
  const failures: string[] = [];
  setFileSizeLimit(String(64 * 1024));
  try {
    // About 340 KB: more than the 256 KiB the muxer buffers, so a packet's write fails (with
    // less, only the trailer's writes would, and node-av ignores their errors).
    const clip = { prompt: 'too large', durationSeconds: 6, width: 1280, height: 720, audio: true, outputPath: join(dir, 'large.mp4') };
    await renderVideo(clip).then(
      () => failures.push('rendered'),
      (err: unknown) => failures.push((err as Error).message),
    );
  } finally {
    setFileSizeLimit('unlimited');
  }
  await settledRss();
  report('failed-write', { failures, fdsBefore: writeFds, fdsAfter: openFds(), partials: partials() });
} finally {
  await rm(dir, { recursive: true, force: true });
}
