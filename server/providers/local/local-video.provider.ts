/**
 * The built-in `local` video provider: renders a real H.264 MP4 of the prompt on this machine
 * (procedural, not AI). It behaves like an upstream: `submit` returns a job id, `poll` reports the
 * job running until its simulated latency (LOCAL_RENDER_DELAY_MS) has passed, and `download`
 * renders the clip and streams it. The render is CPU work, so renders have a small concurrency of
 * their own, whatever the number of jobs in flight; its JavaScript runs on this event loop in short
 * slices, so that other requests are answered while a clip renders.
 */
import { createReadStream } from 'node:fs';
import { buffer } from 'node:stream/consumers';
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { Semaphore } from '../../lib/semaphore.ts';
import type { MediaInput, UpstreamAccount, VideoContent, VideoJob, VideoProvider, VideoStatus } from '../types.ts';
import { TimeSlicer } from './video/time-slicer.ts';
import { videoSize } from './video/video-size.ts';

/**
 * The renderer (and FFmpeg, through node-av: about 40 MiB of resident libraries) is loaded on the
 * first render, so processes that never render a local video do not carry it.
 */
const loadRenderer = () => import('./video/render-video.ts');

/** Renders at once per process: each one keeps a core busy. */
export const LOCAL_RENDER_CONCURRENCY = 2;

export class LocalVideoProvider implements VideoProvider {
  /** No latency: the job is "done" at once, so the first poll is due right after the submit. */
  readonly pollIntervalMs: number;
  private readonly renders = new Semaphore(LOCAL_RENDER_CONCURRENCY);
  /** Shared by the renders, so that two at once still take one slice's budget per turn of the event loop, not two. */
  private readonly slicer = new TimeSlicer();

  constructor(
    private readonly workDir: string,
    /** Simulated upstream latency from submit to done. */
    private readonly delayMs = 0,
  ) {
    this.pollIntervalMs = Math.min(delayMs, 1000);
  }

  async submit(_account: UpstreamAccount, job: VideoJob): Promise<string> {
    // The submit time travels in the id, so any instance can tell when the job is "done".
    return `local_${job.taskId}_${Date.now()}`;
  }

  async poll(_account: UpstreamAccount, jobId: string): Promise<VideoStatus> {
    const submittedAt = Number(jobId.split('_').at(-1));
    const remaining = Number.isFinite(submittedAt) ? submittedAt + this.delayMs - Date.now() : 0;
    if (remaining > 0) return { state: 'running', retryAfterMs: remaining, progress: Math.round(100 * (1 - remaining / Math.max(1, this.delayMs))) };
    return { state: 'succeeded', output: {} };
  }

  async download(_account: UpstreamAccount, jobId: string, _output: unknown, job: VideoJob, signal: AbortSignal): Promise<VideoContent> {
    await mkdir(this.workDir, { recursive: true });
    const path = join(this.workDir, `${jobId}-${process.pid}-${Date.now()}.mp4`);
    const { width, height } = videoSize(job.resolution, job.aspectRatio);
    const release = await this.renders.acquire(signal);
    try {
      const { renderVideo } = await loadRenderer();
      await renderVideo({
        prompt: job.prompt,
        durationSeconds: job.durationSeconds,
        width,
        height,
        audio: job.generateAudio,
        firstFrame: await bytesOf(job.firstFrame ?? job.referenceImages[0]),
        lastFrame: await bytesOf(job.lastFrame),
        outputPath: path,
        signal,
        slicer: this.slicer,
      });
    } catch (err) {
      await rm(path, { force: true });
      throw err;
    } finally {
      release();
    }
    const stream = createReadStream(path);
    // The scratch file goes with the stream, however it ends.
    stream.once('close', () => void rm(path, { force: true }));
    return { stream, contentType: 'video/mp4' };
  }
}

/** The frame the renderer paints (it decodes the image whole; one input at a time, only while rendering). */
async function bytesOf(input: MediaInput | undefined): Promise<Buffer | undefined> {
  return input && buffer(input.open());
}
