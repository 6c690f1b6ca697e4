/**
 * What the task engine needs from an upstream video provider (design §8). A job is submitted once;
 * its id is stored before polling, so an attempt that resumes after a crash polls the same job.
 */
export interface VideoJobRequest {
  taskId: string;
  model: string;
  prompt: string;
  negativePrompt: string | null;
  durationSeconds: number;
  aspectRatio: string;
  resolution: string;
  generateAudio: boolean;
  firstFrame?: Buffer;
  lastFrame?: Buffer;
  referenceImages: Buffer[];
  /** https URLs, for providers that accept reference media. */
  referenceVideos: string[];
  referenceAudios: string[];
}

export type VideoPollResult =
  | { status: 'running' }
  | { status: 'succeeded'; output: { path: string; contentType: string } }
  | { status: 'failed'; message: string };

export interface VideoProvider {
  readonly kind: string;
  /** Delay before the next poll of a running job. */
  readonly pollIntervalMs: number;
  submit(job: VideoJobRequest, signal: AbortSignal): Promise<string>;
  poll(jobId: string, job: VideoJobRequest, signal: AbortSignal): Promise<VideoPollResult>;
}
