/**
 * The process the render-soak bench measures (scripts/bench/render-soak.ts forks it): local
 * videos rendered the way the server renders them, through LocalVideoProvider.download (its
 * render concurrency, its scratch files, the MP4 streamed out and removed), with a mix of the
 * local catalog's shapes. Messages to the parent:
 *   { type: 'ready' }                once the renderer is loaded (one clip rendered), then idle
 *   { type: 'progress', ...Counts }  every second while it renders
 *   { type: 'done', ...Counts }      when the time is over and the last render has ended
 * It starts rendering when the parent sends { type: 'start', rate, seconds }.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import sharp from 'sharp';
import { LOCAL_RENDER_CONCURRENCY, LocalVideoProvider } from '../../server/providers/local/local-video.provider.ts';
import type { MediaInput, UpstreamAccount, VideoJob } from '../../server/providers/types.ts';

export interface SoakCounts {
  /** Jobs the rate asked for. */
  attempted: number;
  /** Jobs not started because LOCAL_RENDER_CONCURRENCY renders were running and as many waiting. */
  skipped: number;
  rendered: number;
  failed: number;
  firstError?: string;
  /** V8's heap (used + free), to tell JavaScript memory from native memory in the RSS. */
  heapTotal?: number;
}

export type SoakStart = { type: 'start'; rate: number; seconds: number };

const ACCOUNT: UpstreamAccount = { memberId: 'soak', provider: 'local', baseUrl: null, credentials: {}, modelMap: {} };
/** Jobs waiting for a render slot at most; past that, a tick of the rate is skipped (and counted). */
const MAX_WAITING = LOCAL_RENDER_CONCURRENCY;

function image(bytes: Buffer, contentType: string): MediaInput {
  return { contentType, bytes: bytes.length, width: null, height: null, open: () => Readable.from([bytes]), url: async () => 'https://soak.invalid/input' };
}

/** The shapes of local-video-lite, local-video-1 and local-video-audio, most of them short. */
function shapes(first: MediaInput, last: MediaInput): Omit<VideoJob, 'taskId' | 'prompt'>[] {
  const job = (resolution: string, aspectRatio: string, durationSeconds: number, generateAudio: boolean, frames: Partial<VideoJob> = {}) => ({
    model: 'local', negativePrompt: null, durationSeconds, aspectRatio, resolution, generateAudio, referenceImages: [], referenceVideos: [], referenceAudios: [], ...frames,
  });
  return [
    job('360p', '16:9', 2, false),
    job('360p', '1:1', 4, false),
    job('360p', '16:9', 2, true),
    job('480p', '9:16', 4, false, { firstFrame: first }),
    job('360p', '16:9', 4, false),
    job('480p', '16:9', 4, true),
    job('360p', '9:16', 2, false, { firstFrame: first, lastFrame: last }),
    job('720p', '16:9', 2, false),
    job('360p', '1:1', 2, true),
    job('720p', '9:16', 4, true, { firstFrame: first }),
  ];
}

/** Renders one job as the engine's finalize step would, reading the MP4 to its end. */
async function renderOne(provider: LocalVideoProvider, job: VideoJob, counts: SoakCounts): Promise<void> {
  try {
    const { stream } = await provider.download(ACCOUNT, `local_${job.taskId}_${Date.now()}`, {}, job, new AbortController().signal);
    // As the media store reads it; the scratch file goes when the stream closes.
    for await (const _chunk of stream);
    counts.rendered++;
  } catch (err) {
    counts.failed++;
    counts.firstError ??= (err as Error).message;
  }
}

function jobOf(mix: Omit<VideoJob, 'taskId' | 'prompt'>[], n: number): VideoJob {
  return { ...mix[n % mix.length]!, taskId: `soak_${n}`, prompt: `soak clip ${n}: a lighthouse in a storm, seen from the sea` };
}

/** Starts a job every 1/rate s for `seconds` (skipping ticks while the provider is saturated), then waits for the last. */
async function soak(rate: number, seconds: number, provider: LocalVideoProvider, mix: Omit<VideoJob, 'taskId' | 'prompt'>[]): Promise<SoakCounts> {
  const counts: SoakCounts = { attempted: 0, skipped: 0, rendered: 0, failed: 0 };
  const running = new Set<Promise<void>>();
  const progress = setInterval(() => process.send!({ type: 'progress', ...counts, heapTotal: process.memoryUsage().heapTotal }), 1000);
  const end = performance.now() + seconds * 1000;
  let next = performance.now();
  for (let n = 1; performance.now() < end; n++) {
    counts.attempted++;
    if (running.size >= LOCAL_RENDER_CONCURRENCY + MAX_WAITING) {
      counts.skipped++;
    } else {
      const p = renderOne(provider, jobOf(mix, n), counts).finally(() => running.delete(p));
      running.add(p);
    }
    // Paced on the clock: ticks that came late (frames are painted on this thread) catch up.
    next += 1000 / rate;
    await new Promise((r) => setTimeout(r, Math.max(0, next - performance.now())));
  }
  await Promise.all(running);
  clearInterval(progress);
  return counts;
}

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'mg-render-soak-'));
  const provider = new LocalVideoProvider(dir);
  try {
    const first = image(await sharp({ create: { width: 640, height: 480, channels: 3, background: { r: 200, g: 60, b: 40 } } }).png().toBuffer(), 'image/png');
    const last = image(await sharp({ create: { width: 480, height: 640, channels: 3, background: { r: 30, g: 60, b: 200 } } }).jpeg().toBuffer(), 'image/jpeg');
    const mix = shapes(first, last);
    // Loads the renderer (node-av, sharp's text layers) before the idle baseline is taken.
    const warm: SoakCounts = { attempted: 1, skipped: 0, rendered: 0, failed: 0 };
    await renderOne(provider, jobOf(mix, 0), warm);
    if (warm.failed > 0) throw new Error(`the first render failed: ${warm.firstError}`);
    process.send!({ type: 'ready' });
    const start = await new Promise<SoakStart>((resolve) => process.once('message', (m) => resolve(m as SoakStart)));
    process.send!({ type: 'done', ...(await soak(start.rate, start.seconds, provider, mix)) });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

main().then(
  () => process.disconnect(),
  (err: unknown) => {
    console.error(err instanceof Error ? (err.stack ?? err.message) : err);
    process.exitCode = 1;
    process.disconnect();
  },
);
