/**
 * The built-in `local` video provider: renders a real H.264 MP4 of the prompt on this machine
 * (procedural, not AI). The "job" is the render itself, done inside poll(): a resumed attempt
 * simply renders again, which is safe because the output is only published by the task engine.
 */
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { VideoJobRequest, VideoPollResult, VideoProvider } from '../video-provider.ts';
import { renderVideo, videoSize } from './video/render-video.ts';

function abortableDelay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(signal.reason);
    }, { once: true });
  });
}

export class LocalVideoProvider implements VideoProvider {
  readonly kind = 'local';
  readonly pollIntervalMs = 0;

  constructor(
    private readonly workDir: string,
    /** Simulated upstream latency before rendering. */
    private readonly delayMs = 0,
  ) {}

  async submit(job: VideoJobRequest): Promise<string> {
    return `local_${job.taskId}`;
  }

  async poll(jobId: string, job: VideoJobRequest, signal: AbortSignal): Promise<VideoPollResult> {
    if (this.delayMs > 0) await abortableDelay(this.delayMs, signal);
    await mkdir(this.workDir, { recursive: true });
    const outputPath = join(this.workDir, `${jobId}-${process.pid}-${Date.now()}.mp4`);
    const { width, height } = videoSize(job.resolution, job.aspectRatio);
    try {
      await renderVideo({
        prompt: job.prompt,
        durationSeconds: job.durationSeconds,
        width,
        height,
        audio: job.generateAudio,
        firstFrame: job.firstFrame ?? job.referenceImages[0],
        lastFrame: job.lastFrame,
        outputPath,
        signal,
      });
    } catch (err) {
      await rm(outputPath, { force: true });
      throw err;
    }
    return { status: 'succeeded', output: { path: outputPath, contentType: 'video/mp4' } };
  }
}
