/**
 * fal and Replicate video jobs carry what is left of their task's lifetime (`VideoJob.deadline`;
 * docs/ARCHITECTURE.md, "How to add a provider"): fal as its start timeout (`X-Fal-Request-Timeout`,
 * seconds), Replicate as the prediction's deadline (`Cancel-After`, a duration). A job whose cancel
 * at the deadline got no answer then does not start later, billed, for a client already refunded.
 * The signed URLs of their media inputs stay valid until that deadline (an upstream fetches them
 * when the job starts, which may be that late), at least an hour and at most 7 days.
 */
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FalImageProvider } from '../../server/providers/fal/fal-image.provider.ts';
import { FalVideoProvider } from '../../server/providers/fal/fal-video.provider.ts';
import type { UpstreamMapping } from '../../server/providers/kit/mapping.ts';
import type { ProviderError } from '../../server/providers/provider-error.ts';
import { ReplicateVideoProvider } from '../../server/providers/replicate/replicate-video.provider.ts';
import type { MediaInput, UpstreamAccount, VideoJob, VideoStatus } from '../../server/providers/types.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { startReplicateFake, type ReplicateFake } from '../fakes/replicate.ts';
import { imageParams } from '../support/image-params.ts';
import { videoJob } from '../support/video-job.ts';

let fal: FalFake;
let slowFal: FalFake;
let replicate: ReplicateFake;
let slowReplicate: ReplicateFake;
beforeAll(async () => {
  const durationFor = (prompt: string) => (prompt.includes('[forever]') ? ('never' as const) : undefined);
  fal = await startFalFake({ queueMs: 10, jobDurationMs: 30 });
  // Requests that wait in the queue far longer than any deadline here.
  slowFal = await startFalFake({ queueMs: 60_000 });
  replicate = await startReplicateFake({ queueMs: 50, durationFor });
  slowReplicate = await startReplicateFake({ queueMs: 60_000 });
});
afterAll(async () => {
  for (const fake of [fal, slowFal, replicate, slowReplicate]) await fake?.close();
});

const never = new AbortController().signal;
const inSeconds = (s: number) => new Date(Date.now() + s * 1000);
const falAccount = (fake: FalFake): UpstreamAccount => ({ memberId: 'mem_fal', provider: 'fal', baseUrl: fake.url, credentials: { api_key: 'fal-test:secret' }, modelMap: {} });
const replicateAccount = (fake: ReplicateFake): UpstreamAccount => ({ memberId: 'mem_rep', provider: 'replicate', baseUrl: fake.baseUrl, credentials: { api_token: 'r8_test' }, modelMap: {} });

const FAL_WAN: UpstreamMapping = { endpoint: 'fal-ai/wan-25-preview/text-to-video', input: '{"prompt": prompt}', output: 'video.url' };
const FAL_KLING: UpstreamMapping = { endpoint: 'fal-ai/kling-video/v2.1/pro/image-to-video', input: '{"prompt": prompt, "image_url": first_frame}', output: 'video.url' };
const FAL_FLUX_EDIT: UpstreamMapping = { endpoint: 'fal-ai/flux/dev', input: '{"prompt": prompt, "image_url": images[0]}', output: 'images.url' };
const REPLICATE_KLING: UpstreamMapping = { endpoint: 'kwaivgi/kling-v2.1', input: '{"prompt": prompt, "start_image": first_frame}', output: 'output' };

/** A stored input whose signed URL says how long it was asked to stay valid. */
function frame(asked: number[]): MediaInput {
  const bytes = Buffer.from('png bytes');
  return {
    contentType: 'image/png',
    bytes: bytes.length,
    width: 640,
    height: 360,
    open: () => Readable.from([bytes]),
    url: async (ttl = 0) => {
      asked.push(ttl);
      return `http://127.0.0.1:9/v1/files/file_1?ttl=${ttl}`;
    },
  };
}

const lastSubmit = (fake: FalFake | ReplicateFake) => fake.requests.filter((r) => r.method === 'POST').at(-1)!;
const end = (status: VideoStatus | ProviderError) => ('state' in status && status.state === 'failed' ? [status.error.kind, status.error.upstreamCode, status.error.message] : status);

describe('fal: the task\'s deadline as the request\'s start timeout', () => {
  it('sends what is left of the task\'s lifetime in whole seconds as X-Fal-Request-Timeout, and the request runs as usual', async () => {
    const provider = new FalVideoProvider(10);
    const job = videoJob({ model: 'wan', mapping: FAL_WAN, deadline: inSeconds(5400) });
    const jobId = await provider.submit(falAccount(fal), job, never);
    expect(Number(lastSubmit(fal).headers['x-fal-request-timeout'])).toBeOneOf([5399, 5400]);
    await new Promise((r) => setTimeout(r, 60));
    expect(await provider.poll(falAccount(fal), jobId, job, never)).toMatchObject({ state: 'succeeded' });
  });

  it('ends a request still queued when its task\'s deadline passes: fal answers its start timeout (504, X-Fal-Request-Timeout-Type: user) and the job fails', async () => {
    const provider = new FalVideoProvider(10);
    const job = videoJob({ model: 'wan', mapping: FAL_WAN, deadline: inSeconds(1) });
    const jobId = await provider.submit(falAccount(slowFal), job, never);
    expect(lastSubmit(slowFal).headers['x-fal-request-timeout']).toBe('1');
    expect(await provider.poll(falAccount(slowFal), jobId, job, never)).toEqual({ state: 'running' });
    await new Promise((r) => setTimeout(r, 1100));
    expect(end(await provider.poll(falAccount(slowFal), jobId, job, never))).toEqual(['failed', 'request_timeout', 'the fal request failed (request_timeout: Request timed out)']);
  });

  it('the fake refuses a start timeout fal would not take (400 bad_request)', async () => {
    for (const value of ['0', '0.1', 'soon']) {
      const res = await fetch(`${fal.url}/${FAL_WAN.endpoint}`, { method: 'POST', headers: { Authorization: 'Key fal-test:secret', 'content-type': 'application/json', 'X-Fal-Request-Timeout': value }, body: '{"prompt": "a fox"}' });
      expect([res.status, res.headers.get('x-fal-error-type'), ((await res.json()) as { error_type: string }).error_type], value).toEqual([400, 'bad_request', 'bad_request']);
    }
  });
});

describe('Replicate: the task\'s deadline as the prediction\'s', () => {
  it('sends what is left of the task\'s lifetime as Cancel-After in seconds (at least 5 s), which the prediction shows as its deadline', async () => {
    const provider = new ReplicateVideoProvider(10);
    for (const [seconds, sent] of [[5400, ['5399s', '5400s']], [2, ['5s']]] as const) {
      const deadline = inSeconds(seconds);
      const jobId = await provider.submit(replicateAccount(replicate), videoJob({ model: 'kling', mapping: REPLICATE_KLING, firstFrame: frame([]), deadline }), never);
      expect(sent).toContain(lastSubmit(replicate).headers['cancel-after']);
      expect(replicate.predictions.get(jobId)!.deadlineAt).toBeGreaterThanOrEqual(Date.now() + (Math.max(5, seconds) - 2) * 1000);
    }
  });

  it('fails a prediction Replicate aborted at that deadline before it started, and one it canceled there while it ran', { timeout: 15_000 }, async () => {
    const provider = new ReplicateVideoProvider(10);
    const submit = async (fake: ReplicateFake, prompt: string): Promise<[ReplicateFake, string, VideoJob]> => {
      const job = videoJob({ model: 'kling', mapping: REPLICATE_KLING, firstFrame: frame([]), prompt, deadline: inSeconds(5) });
      return [fake, await provider.submit(replicateAccount(fake), job, never), job];
    };
    const jobs = [await submit(slowReplicate, 'a queue that never moves'), await submit(replicate, 'a long one [forever]')];
    await new Promise((r) => setTimeout(r, 5200));
    const ends = await Promise.all(jobs.map(([fake, jobId, job]) => provider.poll(replicateAccount(fake), jobId, job, never)));
    expect(ends.map(end)).toEqual([
      ['failed', 'aborted', 'Replicate aborted the prediction before it started'],
      ['failed', 'canceled', 'the Replicate prediction was canceled'],
    ]);
  });
});

describe('signed URLs of media inputs', () => {
  it('stay valid until the video task\'s deadline (at least an hour, at most the 7 days an S3 presigned URL lives), for fal and Replicate alike', async () => {
    for (const [seconds, ttl] of [
      [3 * 86_400, 3 * 86_400],
      [30 * 60, 3600],
      [30 * 86_400, 7 * 86_400],
    ] as const) {
      const asked: number[] = [];
      await new FalVideoProvider().submit(falAccount(fal), videoJob({ model: 'kling', mapping: FAL_KLING, firstFrame: frame(asked), deadline: inSeconds(seconds) }), never);
      await new ReplicateVideoProvider().submit(replicateAccount(replicate), videoJob({ model: 'kling', mapping: REPLICATE_KLING, firstFrame: frame(asked), deadline: inSeconds(seconds) }), never);
      expect(asked, `${seconds} s left`).toHaveLength(2);
      for (const t of asked) expect(t, `${seconds} s left`).toBeOneOf([ttl, ttl + 1]);
      expect((lastSubmit(fal).json as { image_url: string }).image_url).toBe(`http://127.0.0.1:9/v1/files/file_1?ttl=${asked[0]}`);
    }
  });

  it('of an image job (no deadline: fal waits for it within the request) stay valid an hour', async () => {
    const asked: number[] = [];
    const job = { operation: 'edit' as const, model: 'flux', prompt: 'a fox', n: 1, params: imageParams(), inputs: [], inputFiles: [frame(asked)], mapping: FAL_FLUX_EDIT };
    const events = { partial: async () => undefined, image: async () => undefined };
    // The fake fetches the URL, which serves nothing: the edit fails, after its input was signed.
    await new FalImageProvider(10, 2000).generate(falAccount(fal), job, never, events).catch(() => undefined);
    expect(asked).toEqual([3600]);
  });
});
