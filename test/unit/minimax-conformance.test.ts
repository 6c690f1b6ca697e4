/**
 * The `minimax` video adapter (Hailuo) through the conformance kit against the fake MiniMax
 * platform (test/fakes/minimax.ts), on both API generations: v1 (MiniMax-Hailuo-02) and v2
 * (MiniMax-H3). MiniMax documents no idempotency key and no cancel.
 */
import { afterAll, beforeAll } from 'vitest';
import { MiniMaxVideoProvider } from '../../server/providers/minimax/minimax-video.provider.ts';
import type { UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { startMiniMaxFake, type MiniMaxFake, type MiniMaxRoute } from '../fakes/minimax.ts';
import { describeVideoConformance, type ConformanceRoute, type VideoConformanceTarget } from '../support/video-adapter-conformance.ts';

let fake: MiniMaxFake;
beforeAll(async () => {
  fake = await startMiniMaxFake({ apiKeys: ['mm-conformance'], queueMs: 40, jobDurationMs: 150 });
});
afterAll(async () => fake?.close());

const account = (key: string): UpstreamAccount => ({ memberId: 'mem_conformance', provider: 'minimax', baseUrl: fake.url, credentials: { api_key: key }, modelMap: {} });
/** A v1 download is the file lookup then the object storage; the storage is what fails here. */
const ROUTES: Record<ConformanceRoute, MiniMaxRoute> = { submit: 'submit', poll: 'poll', download: 'cdn' };
const taskOf = (jobId: string) => fake.tasks.get(jobId.slice(jobId.indexOf('/') + 1));

function target(model: string, durationSeconds: number, resolution: string): VideoConformanceTarget {
  return {
    provider: new MiniMaxVideoProvider(100),
    account: () => account('mm-conformance'),
    badAccount: () => account('mm-not-a-key-of-this-fake'),
    job: (o = {}): VideoJob => ({
      taskId: o.taskId ?? `vid_conformance_${Math.random().toString(36).slice(2)}`,
      model: o.model ?? model,
      prompt: o.prompt ?? 'a paper boat on a river',
      negativePrompt: null,
      durationSeconds,
      aspectRatio: '16:9',
      resolution,
      generateAudio: false,
      referenceImages: [],
      referenceVideos: [],
      referenceAudios: [],
      ...(o.firstFrame && { firstFrame: o.firstFrame }),
    }),
    policyPrompt: 'a storm [minimax:sensitive-output]',
    failPrompt: 'a storm [minimax:fail]',
    // MiniMax answers 2013 "invalid params, unknown model '…'": the member's model map.
    unknownModel: model === 'MiniMax-H3' ? 'MiniMax-H9' : 'MiniMax-Hailuo-09',
    unknownModelKind: 'misconfigured',
    rateLimitNext: (route, seconds) => fake.rateLimitNext(ROUTES[route], seconds),
    serverErrorNext: (route) => fake.serverErrorNext(ROUTES[route]),
    expireOutput: (jobId) => fake.expire(taskOf(jobId)!.id),
    receivedFirstFrame: (jobId) => {
      const frame = taskOf(jobId)?.images.find((i) => i.role === 'first_frame');
      return frame && { mimeType: frame.mimeType, width: frame.width, height: frame.height };
    },
    framesKeepTheirSize: true,
    jobCount: () => fake.tasks.size,
  };
}

describeVideoConformance('minimax v1 (Hailuo 02)', { idempotent: false, cancels: false }, () => target('MiniMax-Hailuo-02', 6, '768p'));
describeVideoConformance('minimax v2 (MiniMax-H3)', { idempotent: false, cancels: false }, () => target('MiniMax-H3', 5, '2k'));
