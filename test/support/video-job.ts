import type { VideoJob } from '../../server/providers/types.ts';

/** A video job as the runner hands it to an adapter (5 s, 16:9, 720p, silent, no inputs), with `overrides`. */
export function videoJob(overrides: Partial<VideoJob> = {}): VideoJob {
  return {
    taskId: 'vid_1',
    model: 'x',
    prompt: 'a fox',
    negativePrompt: null,
    durationSeconds: 5,
    aspectRatio: '16:9',
    resolution: '720p',
    generateAudio: false,
    referenceImages: [],
    referenceVideos: [],
    referenceAudios: [],
    ...overrides,
  };
}
