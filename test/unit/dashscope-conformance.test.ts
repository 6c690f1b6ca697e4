/**
 * The `dashscope` video adapter through the conformance kit against the fake DashScope
 * (test/fakes/dashscope.ts). DashScope has no idempotency key; the adapter cancels (PENDING tasks
 * only). Its inputs are URLs the upstream downloads: the kit's frames are served here, on loopback,
 * and the fake really fetches them.
 */
import { afterAll, beforeAll } from 'vitest';
import { DashScopeVideoProvider } from '../../server/providers/dashscope/dashscope-video.provider.ts';
import type { MediaInput, UpstreamAccount } from '../../server/providers/types.ts';
import { startDashScopeFake, type DashScopeFake, type DashScopeRoute } from '../fakes/dashscope.ts';
import { startFakeServer, type FakeServer } from '../fakes/fake-http.ts';
import { describeVideoConformance, type ConformanceRoute } from '../support/video-adapter-conformance.ts';

let fake: DashScopeFake;
/** Serves the kit's input images at the URLs the adapter hands the upstream. */
let inputs: FakeServer;
const served = new Map<string, { bytes: Buffer; contentType: string }>();

beforeAll(async () => {
  fake = await startDashScopeFake({ accounts: { 'sk-conformance': {} }, pendingMs: 50, runningMs: 100 });
  inputs = await startFakeServer((_req, res, recorded) => {
    const file = served.get(recorded.path);
    if (!file) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'content-type': file.contentType, 'content-length': String(file.bytes.length) });
    res.end(file.bytes);
  });
});
afterAll(async () => {
  await fake?.close();
  await inputs?.close();
});

const account = (key: string): UpstreamAccount => ({ memberId: 'mem_conformance', provider: 'dashscope', baseUrl: fake.url, credentials: { api_key: key }, modelMap: {} });
/** The download is the result URL on the OSS origin. */
const ROUTES: Record<ConformanceRoute, DashScopeRoute> = { submit: 'submit', poll: 'poll', download: 'oss' };

/** The input with a URL of this file server (the gateway's signed URL stands in for it). */
async function servedInput(input: MediaInput): Promise<MediaInput> {
  const chunks: Buffer[] = [];
  for await (const chunk of input.open()) chunks.push(chunk as Buffer);
  const path = `/files/${served.size + 1}.png`;
  served.set(path, { bytes: Buffer.concat(chunks), contentType: input.contentType });
  return { ...input, url: async () => `${inputs.url}${path}` };
}

describeVideoConformance('dashscope (Wan)', { idempotent: false, cancels: true }, () => ({
  provider: new DashScopeVideoProvider(100),
  account: () => account('sk-conformance'),
  badAccount: () => account('sk-not-a-key-of-this-fake'),
  job: (o = {}) => {
    const job = {
      taskId: o.taskId ?? `vid_conformance_${Math.random().toString(36).slice(2)}`,
      // Text alone goes to Wan 2.7's text-to-video model, a frame to its image-to-video one.
      model: o.model ?? (o.firstFrame ? 'wan2.7-i2v' : 'wan2.7-t2v'),
      // A job the kit calls very long stays in DashScope's queue (where it can still be cancelled).
      prompt: o.prompt?.includes('very long') ? `${o.prompt} [ds:stay-pending]` : (o.prompt ?? 'a paper boat on a river'),
      negativePrompt: null,
      durationSeconds: 5,
      aspectRatio: '16:9',
      resolution: '720p',
      generateAudio: true,
      referenceImages: [],
      referenceVideos: [],
      referenceAudios: [],
    };
    if (!o.firstFrame) return job;
    // The kit's frame has no URL of its own: the adapter's signedUrl() gets this server's.
    const frame = o.firstFrame;
    let resolved: Promise<MediaInput> | undefined;
    return { ...job, firstFrame: { ...frame, url: async (ttl?: number) => (await (resolved ??= servedInput(frame))).url(ttl) } };
  },
  policyPrompt: 'a storm [ds:unsafe]',
  failPrompt: 'a storm [ds:fail]',
  unknownModel: 'wan9.9-t2v',
  unknownModelKind: 'misconfigured',
  rateLimitNext: (route, seconds) => fake.rateLimitNext(ROUTES[route], seconds),
  serverErrorNext: (route) => fake.serverErrorNext(ROUTES[route]),
  expireOutput: (jobId) => fake.expireResult(jobId),
  receivedFirstFrame: (jobId) => {
    const frame = fake.tasks.get(jobId)?.media.find((m) => m.type === 'first_frame');
    return frame && { mimeType: frame.mimeType, width: frame.width, height: frame.height };
  },
  framesKeepTheirSize: true,
  jobCount: () => fake.tasks.size,
  wasCancelled: (jobId) => fake.statusOf(jobId) === 'CANCELED',
}));
