/**
 * A fal video request that ended with an error (docs.fal.ai/errors: a model error, HTTP 500
 * `internal_server_error` or 504 `generation_timeout`, a typed `detail[]` with `X-Fal-Retryable`;
 * or a request error such as 503 `runner_disconnected`, `error_type` and `X-Fal-Error-Type`) is a
 * failed job with fal's reason: its result answers the same every time, so a poll that threw it as
 * passing had the runner poll it until the task's deadline, to end as a timeout with the reason lost.
 * Only a bare 429/5xx of fal's edge is asked again.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FalVideoProvider } from '../../server/providers/fal/fal-video.provider.ts';
import type { UpstreamMapping } from '../../server/providers/kit/mapping.ts';
import type { ProviderError } from '../../server/providers/provider-error.ts';
import type { UpstreamAccount, VideoJob, VideoStatus } from '../../server/providers/types.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { videoJob } from '../support/video-job.ts';

let fal: FalFake;
beforeAll(async () => {
  fal = await startFalFake({ queueMs: 10, jobDurationMs: 30 });
});
afterAll(async () => {
  await fal?.close();
});

const WAN: UpstreamMapping = { endpoint: 'fal-ai/wan-25-preview/text-to-video', input: '{"prompt": prompt}', output: 'video.url' };
const account = (): UpstreamAccount => ({ memberId: 'mem_fal', provider: 'fal', baseUrl: fal.url, credentials: { api_key: 'fal-test:secret' }, modelMap: {} });
const never = new AbortController().signal;
const provider = new FalVideoProvider(10);

async function finished(prompt: string): Promise<{ jobId: string; job: VideoJob }> {
  const job = videoJob({ model: 'wan', mapping: WAN, prompt });
  const jobId = await provider.submit(account(), job, never);
  await new Promise((r) => setTimeout(r, 60));
  return { jobId, job };
}

const poll = (jobId: string, job: VideoJob): Promise<VideoStatus | ProviderError> => provider.poll(account(), jobId, job, never).catch((err: ProviderError) => err);

function failure(end: VideoStatus | ProviderError): [string, string | undefined, string] | undefined {
  if (!('state' in end) || end.state !== 'failed') return undefined;
  return [end.error.kind, end.error.upstreamCode, end.error.message];
}

describe('a fal video request that ended with an error', () => {
  it('fails on its first poll with fal\'s model error (500 internal_server_error, 504 generation_timeout, 500 downstream_service_unavailable), every time it is read', async () => {
    for (const [marker, status, type, msg] of [
      ['[fal:model-error]', 500, 'internal_server_error', 'Internal server error'],
      ['[fal:generation-timeout]', 504, 'generation_timeout', 'Generation timeout'],
      ['[fal:downstream-unavailable]', 500, 'downstream_service_unavailable', 'Downstream service unavailable'],
    ] as const) {
      const { jobId, job } = await finished(`a storm ${marker}`);
      for (let i = 0; i < 2; i++) {
        const end = await poll(jobId, job);
        expect(failure(end), `${marker}: ${JSON.stringify(end)}`).toEqual(['failed', type, `the fal request failed (${type}: ${msg})`]);
        expect((end as { error: ProviderError }).error.upstreamStatus).toBe(status);
      }
    }
  });

  it('fails with the request error of a runner that died through fal\'s retries (503 runner_disconnected, X-Fal-Error-Type)', async () => {
    const { jobId, job } = await finished('a storm [fal:fail]');
    expect(failure(await poll(jobId, job))).toEqual(['failed', 'runner_disconnected', expect.stringContaining('runner_disconnected: Runner disconnected while processing the request')]);
  });

  it('fails a finished request whose typed error fal says a new request may pass (X-Fal-Retryable: true): its result cannot change', async () => {
    const { jobId, job } = await finished('a quiet lake');
    fal.faults.push('result', { status: 400, headers: { 'x-fal-retryable': 'true' }, body: { detail: [{ loc: ['body'], msg: 'Downstream service error', type: 'downstream_service_error', url: 'https://docs.fal.ai/errors/#downstream_service_error' }] } });
    expect(failure(await poll(jobId, job))).toEqual(['failed', 'downstream_service_error', 'the fal request failed (downstream_service_error: Downstream service error)']);
  });

  it('asks a bare 5xx or 429 of fal\'s edge again, then collects the video of the same request', async () => {
    const { jobId, job } = await finished('a quiet lake');
    fal.serverErrorNext('result');
    const first = await poll(jobId, job);
    expect([(first as ProviderError).kind, (first as ProviderError).upstreamStatus]).toEqual(['retryable', 503]);
    fal.rateLimitNext('result', 2);
    expect((await poll(jobId, job) as ProviderError).kind).toBe('rate_limited');
    const end = await poll(jobId, job);
    expect(end).toMatchObject({ state: 'succeeded', output: { url: expect.stringContaining(fal.cdnUrl) } });
    expect(fal.jobs.get(jobId.split('/').at(-1)!)!.cancelled).toBe(false);
  });

  it('fails with the status\' error when the status said the request failed and its result meets a passing error', async () => {
    const { jobId, job } = await finished('a storm [fal:fail]');
    fal.serverErrorNext('result');
    expect(failure(await poll(jobId, job))).toEqual(['failed', 'runner_disconnected', 'fal reported the request failed (Runner disconnected while processing the request)']);
  });

  it('reads the same model error behind a FAILED status word', async () => {
    fal.failureWords = true;
    try {
      const { jobId, job } = await finished('a storm [fal:model-error]');
      expect(failure(await poll(jobId, job))).toEqual(['failed', 'internal_server_error', 'the fal request failed (internal_server_error: Internal server error)']);
    } finally {
      fal.failureWords = false;
    }
  });
});
