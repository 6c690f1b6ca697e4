/**
 * The `fal` and `replicate` video adapters through the conformance kit against the fake fal queue
 * (test/fakes/fal.ts) and the fake Replicate API (test/fakes/replicate.ts). Each job carries a
 * catalog model's mapping, as the runner passes it: text alone goes to a text-to-video model, a
 * first frame to an image-to-video one (the frame as a data URL here, so that the kit can read what
 * arrived without a file server). Neither upstream documents an idempotency key; both cancel.
 */
import { afterAll, beforeAll } from 'vitest';
import { headerSize } from '../../server/providers/image-output.ts';
import { FalVideoProvider } from '../../server/providers/fal/fal-video.provider.ts';
import { ReplicateVideoProvider } from '../../server/providers/replicate/replicate-video.provider.ts';
import type { UpstreamMapping } from '../../server/providers/kit/mapping.ts';
import type { MediaInput, UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { startFalFake, type FalFake, type FalRoute } from '../fakes/fal.ts';
import { startReplicateFake, type ReplicateFake, type ReplicateRoute } from '../fakes/replicate.ts';
import { describeVideoConformance, type ConformanceRoute } from '../support/video-adapter-conformance.ts';
import { videoJob } from '../support/video-job.ts';

let fal: FalFake;
let replicate: ReplicateFake;
beforeAll(async () => {
  const durationFor = (prompt: string) => (prompt.includes('very long') ? ('never' as const) : undefined);
  fal = await startFalFake({ apiKeys: ['fal-conformance:secret'], queueMs: 40, jobDurationMs: 150, durationFor });
  replicate = await startReplicateFake({ tokens: ['r8_conformance'], queueMs: 40, jobDurationMs: 150, durationFor });
});
afterAll(async () => {
  await fal?.close();
  await replicate?.close();
});

/** What arrived as a data URL: its type and the size its header declares. */
function dataUrlImage(value: unknown): { mimeType: string; width: number; height: number } | undefined {
  if (typeof value !== 'string' || !value.startsWith('data:')) return undefined;
  const size = headerSize(Buffer.from(value.slice(value.indexOf(',') + 1), 'base64'));
  return size && { mimeType: `image/${size.format}`, width: size.width, height: size.height };
}

function baseJob(o: { prompt?: string; taskId?: string }, mapping: UpstreamMapping, model: string, durationSeconds: number): VideoJob {
  return videoJob({ taskId: o.taskId ?? `vid_conformance_${Math.random().toString(36).slice(2)}`, model, mapping, prompt: o.prompt ?? 'a paper boat on a river', durationSeconds });
}

const FAL_T2V: UpstreamMapping = { endpoint: 'fal-ai/wan-25-preview/text-to-video', input: '{"prompt": prompt, "duration": $string(duration), "aspect_ratio": aspect_ratio, "resolution": resolution}', output: 'video.url' };
const FAL_I2V: UpstreamMapping = { endpoint: 'fal-ai/kling-video/v2.1/pro/image-to-video', input: '{"prompt": prompt, "image_url": first_frame, "duration": $string(duration)}', output: 'video.url', media: 'data_url' };
const FAL_ROUTES: Record<ConformanceRoute, FalRoute> = { submit: 'submit', poll: 'status', download: 'cdn' };
const falAccount = (key: string): UpstreamAccount => ({ memberId: 'mem_conformance', provider: 'fal', baseUrl: fal.url, credentials: { api_key: key }, modelMap: {} });

describeVideoConformance('fal (queue)', { idempotent: false, cancels: true }, () => ({
  provider: new FalVideoProvider(100),
  account: () => falAccount('fal-conformance:secret'),
  badAccount: () => falAccount('fal-not-a-key:of-this-fake'),
  job: (o = {}) => {
    const mapping = o.firstFrame ? FAL_I2V : FAL_T2V;
    const job = baseJob(o, o.model ? { ...mapping, endpoint: o.model } : mapping, 'fal-video', 5);
    return o.firstFrame ? { ...job, firstFrame: o.firstFrame as MediaInput } : job;
  },
  policyPrompt: 'a storm [fal:nsfw]',
  failPrompt: 'a storm [fal:fail]',
  unknownModel: 'fal-ai/no-such-model/text-to-video',
  unknownModelKind: 'misconfigured',
  rateLimitNext: (route, seconds) => fal.rateLimitNext(FAL_ROUTES[route], seconds),
  serverErrorNext: (route) => fal.serverErrorNext(FAL_ROUTES[route]),
  expireOutput: (jobId) => fal.expire(jobId.slice(jobId.lastIndexOf('/') + 1)),
  receivedFirstFrame: (jobId) => dataUrlImage(fal.jobs.get(jobId.slice(jobId.lastIndexOf('/') + 1))?.input.image_url),
  framesKeepTheirSize: true,
  jobCount: () => fal.jobs.size,
  wasCancelled: (jobId) => fal.jobs.get(jobId.slice(jobId.lastIndexOf('/') + 1))?.cancelled === true,
}));

const REPLICATE_VIDEO: UpstreamMapping = { endpoint: 'minimax/video-01', input: '{"prompt": prompt, "prompt_optimizer": false, "first_frame_image": first_frame}', output: 'output', media: 'data_url' };
const REPLICATE_ROUTES: Record<ConformanceRoute, ReplicateRoute> = { submit: 'create', poll: 'get', download: 'cdn' };
const replicateAccount = (token: string): UpstreamAccount => ({ memberId: 'mem_conformance', provider: 'replicate', baseUrl: replicate.baseUrl, credentials: { api_token: token }, modelMap: {} });

describeVideoConformance('replicate (predictions)', { idempotent: false, cancels: true }, () => ({
  provider: new ReplicateVideoProvider(100),
  account: () => replicateAccount('r8_conformance'),
  badAccount: () => replicateAccount('r8_not_a_token_of_this_fake'),
  job: (o = {}) => {
    const job = baseJob(o, o.model ? { ...REPLICATE_VIDEO, endpoint: o.model } : REPLICATE_VIDEO, 'replicate-video', 6);
    return o.firstFrame ? { ...job, firstFrame: o.firstFrame as MediaInput } : job;
  },
  policyPrompt: 'a storm [replicate:nsfw]',
  failPrompt: 'a storm [replicate:fail]',
  unknownModel: 'acme/no-such-model',
  unknownModelKind: 'misconfigured',
  rateLimitNext: (route, seconds) => replicate.rateLimitNext(REPLICATE_ROUTES[route], seconds),
  serverErrorNext: (route) => replicate.serverErrorNext(REPLICATE_ROUTES[route]),
  expireOutput: (jobId) => replicate.expire(jobId),
  receivedFirstFrame: (jobId) => dataUrlImage(replicate.predictions.get(jobId)?.input.first_frame_image),
  framesKeepTheirSize: true,
  jobCount: () => replicate.predictions.size,
  wasCancelled: (jobId) => replicate.predictions.get(jobId)?.status === 'canceled',
}));
