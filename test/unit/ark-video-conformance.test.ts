/**
 * The `ark` video adapter (Seedance) through the conformance kit against the fake ModelArk
 * (test/fakes/ark.ts). Ark has no idempotency key; the adapter cancels (queued tasks only).
 */
import { afterAll, beforeAll } from 'vitest';
import { ArkVideoProvider } from '../../server/providers/ark/ark-video.provider.ts';
import type { UpstreamAccount } from '../../server/providers/types.ts';
import { startArkFake, type ArkFake, type ArkRoute } from '../fakes/ark.ts';
import { describeVideoConformance, type ConformanceRoute } from '../support/video-adapter-conformance.ts';
import { videoJob } from '../support/video-job.ts';

let fake: ArkFake;
beforeAll(async () => {
  fake = await startArkFake({ accounts: { 'ark-conformance': {} }, queuedMs: 50, runningMs: 100 });
});
afterAll(async () => fake?.close());

const account = (key: string): UpstreamAccount => ({ memberId: 'mem_conformance', provider: 'ark', baseUrl: `${fake.url}/api/v3`, credentials: { api_key: key }, modelMap: {} });
/** The download is the result URL on the object storage origin. */
const ROUTES: Record<ConformanceRoute, ArkRoute> = { submit: 'submit', poll: 'poll', download: 'storage' };

describeVideoConformance('ark (Seedance)', { idempotent: false, cancels: true }, () => ({
  provider: new ArkVideoProvider(100),
  account: () => account('ark-conformance'),
  badAccount: () => account('ark-not-a-key-of-this-fake'),
  job: (o = {}) =>
    videoJob({
      taskId: o.taskId ?? `vid_conformance_${Math.random().toString(36).slice(2)}`,
      model: o.model ?? 'seedance-1-0-pro-250528',
      // A job the kit calls very long stays in Ark's queue (where it can still be cancelled).
      prompt: o.prompt?.includes('very long') ? `${o.prompt} [ark:stay-queued]` : (o.prompt ?? 'a paper boat on a river'),
      ...(o.firstFrame && { firstFrame: o.firstFrame }),
    }),
  policyPrompt: 'a storm [ark:unsafe-video]',
  failPrompt: 'a storm [ark:fail]',
  unknownModel: 'seedance-9-0-pro-990101',
  unknownModelKind: 'misconfigured',
  rateLimitNext: (route, seconds) => fake.rateLimitNext(ROUTES[route], seconds),
  serverErrorNext: (route) => fake.serverErrorNext(ROUTES[route]),
  expireOutput: (jobId) => fake.expire(jobId),
  receivedFirstFrame: (jobId) => {
    const frame = fake.tasks.get(jobId)?.images.find((i) => i.role === 'first_frame');
    return frame && { mimeType: frame.mimeType!, width: frame.width!, height: frame.height! };
  },
  framesKeepTheirSize: true,
  jobCount: () => fake.tasks.size,
  wasCancelled: (jobId) => fake.statusOf(jobId) === 'cancelled',
}));
