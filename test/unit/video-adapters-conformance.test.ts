/**
 * The video adapters of this house, each through the conformance kit against its fake upstream
 * (test/support/video-adapter-conformance.ts): OpenAI `/v1/videos` (Sora) and Google Veo.
 */
import { afterAll, beforeAll } from 'vitest';
import { GeminiVideoProvider } from '../../server/providers/gemini/gemini-video.provider.ts';
import { OpenAIVideoProvider } from '../../server/providers/openai/openai-video.provider.ts';
import type { UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { startGeminiFake, type GeminiFake } from '../fakes/gemini.ts';
import { startOpenAIVideosFake, type OpenAIVideosFake } from '../fakes/openai-video-upstream.ts';
import { describeVideoConformance, type ConformanceRoute } from '../support/video-adapter-conformance.ts';
import { videoJob } from '../support/video-job.ts';

let openai: OpenAIVideosFake;
let gemini: GeminiFake;
beforeAll(async () => {
  openai = await startOpenAIVideosFake({
    apiKeys: ['sk-conformance'],
    jobDurationMs: 250,
    durationFor: (p) => (p.includes('very long') ? 'never' : undefined),
    failWhen: (p) =>
      p.includes('refuse-me')
        ? { code: 'moderation_blocked', message: 'Your request was blocked by our moderation system.' }
        : p.includes('break-me')
          ? { code: 'internal_error', message: 'Video generation failed.' }
          : undefined,
  });
  gemini = await startGeminiFake({ apiKeys: ['g-conformance'] });
});
afterAll(async () => {
  await openai?.close();
  await gemini?.close();
});

const baseJob = (o: { taskId?: string; model: string; prompt?: string; durationSeconds: number }): VideoJob =>
  videoJob({ taskId: o.taskId ?? `vid_conformance_${Math.random().toString(36).slice(2)}`, model: o.model, prompt: o.prompt ?? 'a paper boat on a river', durationSeconds: o.durationSeconds });

const account = (provider: 'openai' | 'gemini', baseUrl: string, key: string): UpstreamAccount => ({ memberId: 'mem_conformance', provider, baseUrl, credentials: { api_key: key }, modelMap: {} });

const OPENAI_ROUTES: Record<ConformanceRoute, 'create' | 'retrieve' | 'content'> = { submit: 'create', poll: 'retrieve', download: 'content' };

describeVideoConformance('openai (Sora)', { idempotent: false, cancels: false }, () => ({
  provider: new OpenAIVideoProvider(100),
  account: () => account('openai', `${openai.url}/v1`, 'sk-conformance'),
  badAccount: () => account('openai', `${openai.url}/v1`, 'sk-not-a-key-of-this-fake'),
  job: (o = {}) => ({ ...baseJob({ model: 'sora-2', durationSeconds: 4, ...o }), ...(o.firstFrame && { firstFrame: o.firstFrame }) }),
  policyPrompt: 'refuse-me',
  failPrompt: 'break-me',
  unknownModel: 'sora-9',
  unknownModelKind: 'misconfigured',
  rateLimitNext: (route, seconds) => openai.rateLimitNext(OPENAI_ROUTES[route], seconds),
  serverErrorNext: (route) => openai.faults.push(OPENAI_ROUTES[route], { status: 500, body: { error: { message: 'The server had an error while processing your request.', type: 'server_error', param: null, code: null } } }),
  expireOutput: (jobId) => openai.expire(jobId),
  receivedFirstFrame: (jobId) => {
    const ref = openai.jobs.get(jobId)?.inputReference;
    return ref && { mimeType: ref.mimeType, width: 0, height: 0 };
  },
  // The wire takes a frame of the output's size: the adapter resizes it.
  framesKeepTheirSize: false,
  jobCount: () => openai.jobs.size,
}));

describeVideoConformance('gemini (Veo)', { idempotent: false, cancels: false }, () => ({
  provider: new GeminiVideoProvider(100),
  account: () => account('gemini', `${gemini.url}/v1beta`, 'g-conformance'),
  badAccount: () => account('gemini', `${gemini.url}/v1beta`, 'AIzaNotAKeyOfThisFake0000000000'),
  job: (o = {}) => ({ ...baseJob({ model: 'veo-3.1-generate-preview', durationSeconds: 8, ...o }), ...(o.firstFrame && { firstFrame: o.firstFrame }) }),
  policyPrompt: 'veo-filter',
  failPrompt: 'veo-fail',
  unknownModel: 'veo-9-generate',
  unknownModelKind: 'misconfigured',
  rateLimitNext: (route, seconds) => gemini.rateLimitNext(route, seconds),
  serverErrorNext: (route) => gemini.serverErrorNext(route),
  // The file is gone from Google's side: its download answers 404 NOT_FOUND.
  expireOutput: () => gemini.faults.push('download', { status: 404, body: { error: { code: 404, message: 'File not found.', status: 'NOT_FOUND' } } }),
  receivedFirstFrame: (jobId) => {
    const image = gemini.operations.get(jobId)?.image;
    return image && { mimeType: image.mimeType, width: image.width, height: image.height };
  },
  framesKeepTheirSize: true,
  jobCount: () => gemini.operations.size,
}));
