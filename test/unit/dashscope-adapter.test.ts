/**
 * The `dashscope` adapter's own rules, against the fake DashScope (test/fakes/dashscope.ts) where
 * the wire is involved: which body and endpoint a model id takes, the member's base URL and options,
 * DashScope's codes as kinds with the words member health shows, a failed task's error read from
 * `output` or from the top level (sources disagree), UNKNOWN and CANCELED tasks, a running task's
 * refused cancel.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dashscopeEndpoint, dashscopeErrorOf, dashscopeUrl } from '../../server/providers/dashscope/dashscope-api.ts';
import { DashScopeVideoProvider, dashscopeRouting } from '../../server/providers/dashscope/dashscope-video.provider.ts';
import type { UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { startDashScopeFake, type DashScopeFake } from '../fakes/dashscope.ts';
import { providerErrorOf } from '../support/api-error.ts';

const never = new AbortController().signal;
const account = (baseUrl: string | null, key = 'sk-unit'): UpstreamAccount => ({ memberId: 'mem_unit', provider: 'dashscope', baseUrl, credentials: { api_key: key }, modelMap: {} });

const job = (o: Partial<VideoJob> = {}): VideoJob => ({
  taskId: 'vid_unit',
  model: 'wan2.7-t2v',
  prompt: 'a paper boat on a river',
  negativePrompt: null,
  durationSeconds: 5,
  aspectRatio: '16:9',
  resolution: '720p',
  generateAudio: true,
  referenceImages: [],
  referenceVideos: [],
  referenceAudios: [],
  ...o,
});

describe('dashscope routing by model id', () => {
  it.each([
    ['wan2.2-i2v-plus', 'legacy', 'video-generation', 'i2v'],
    ['wan2.5-t2v-preview', 'legacy', 'video-generation', 't2v'],
    ['wan2.6-i2v-flash', 'legacy', 'video-generation', 'i2v'],
    ['wanx2.1-i2v-turbo', 'legacy', 'video-generation', 'i2v'],
    ['wan2.2-kf2v-flash', 'keyframe', 'image2video', 'kf2v'],
    ['wanx2.1-kf2v-plus', 'keyframe', 'image2video', 'kf2v'],
    ['wan2.7-i2v', 'media', 'video-generation', 'i2v'],
    ['wan2.7-r2v-2026-06-12', 'media', 'video-generation', 'r2v'],
    ['happyhorse-1.1-t2v', 'media', 'video-generation', 't2v'],
    // Other vendors on Model Studio take the new body; a keyframe model of theirs stays at video-generation.
    ['pixverse/pixverse-c1-kf2v', 'media', 'video-generation', 'kf2v'],
    ['vidu/viduq2-turbo', 'media', 'video-generation', undefined],
  ])('%s takes the %s body at %s', (model, body, endpoint, task) => {
    const routing = dashscopeRouting(model);
    expect(routing).toEqual({ body, path: `/api/v1/services/aigc/${endpoint}/video-synthesis`, ...(task && { task }) });
  });
});

describe('dashscope member endpoint', () => {
  it('reads the options from the base URL query and takes the host with or without /api/v1', () => {
    expect(dashscopeEndpoint(account('https://dashscope.aliyuncs.com/api/v1/?inline_media=true&watermark=true'))).toEqual({ baseUrl: 'https://dashscope.aliyuncs.com/', inlineMedia: true, watermark: true });
    expect(dashscopeUrl(account('https://dashscope.aliyuncs.com/api/v1'), '/api/v1/tasks/x')).toBe('https://dashscope.aliyuncs.com/api/v1/tasks/x');
    expect(dashscopeUrl(account('https://ws1.ap-southeast-1.maas.aliyuncs.com?inline_media=false'), '/api/v1/tasks/x')).toBe('https://ws1.ap-southeast-1.maas.aliyuncs.com/api/v1/tasks/x');
    expect(dashscopeUrl(account(null), '/api/v1/tasks/x')).toBe('https://dashscope-intl.aliyuncs.com/api/v1/tasks/x');
  });
});

describe("dashscope's codes", () => {
  const beijing = account('https://dashscope.aliyuncs.com');
  it.each([
    [401, 'InvalidApiKey', 'Invalid API-key provided.', 'auth'],
    [403, 'AccessDenied.Unpurchased', 'Access to model denied.', 'model_not_open'],
    [403, 'Model.AccessDenied', 'Model access denied.', 'model_not_open'],
    [429, 'CommodityNotPurchased', 'Commodity has not purchased yet.', 'model_not_open'],
    [400, 'Arrearage', 'Access denied, please make sure your account is in good standing.', 'account_disabled'],
    [429, 'PostpaidBillOverdue', 'The postpaid bill is overdue.', 'account_disabled'],
    [429, 'Throttling.RateQuota', 'Requests rate limit exceeded, please try again later.', 'rate_limited'],
    [429, 'Throttling', 'Requests throttling triggered.', 'rate_limited'],
    [429, 'Throttling.AllocationQuota', 'Allocated quota exceeded, please increase your quota limit.', 'quota_exhausted'],
    [400, 'DataInspectionFailed', 'Input data may contain inappropriate content.', 'policy'],
    [400, 'IPInfringementSuspect', 'Input data is suspected of infringement.', 'policy'],
    [400, 'InvalidParameter', 'The size is not match.', 'invalid_request'],
    [400, 'InvalidParameter.DataInspection', 'Unable to download the media resource during the data inspection process.', 'misconfigured'],
    [404, 'ModelNotFound', 'Model can not be found.', 'misconfigured'],
    [500, 'InternalError', 'An internal error has occured.', 'retryable'],
    [503, 'ModelUnavailable', 'Model is unavailable, please try again later.', 'retryable'],
  ])('HTTP %i %s is %s', (status, code, message, kind) => {
    expect(dashscopeErrorOf(beijing, { code, message }, 'video submit', { status }).kind).toBe(kind);
  });

  it("says in member health which region a refused key and a missing model are about, whatever status 'Model not exist.' comes with", () => {
    const key = dashscopeErrorOf(beijing, { code: 'InvalidApiKey', message: 'Invalid API-key provided.' }, 'video submit', { status: 401 });
    expect(key.message).toBe("DashScope refused the member's API key (HTTP 401 InvalidApiKey: Invalid API-key provided.); a key works only in the region whose console issued it: check that the key belongs to China (Beijing), dashscope.aliyuncs.com");
    for (const status of [400, 404]) {
      const model = dashscopeErrorOf(beijing, { code: 'InvalidParameter', message: 'Model not exist.' }, 'video submit', { status, model: 'wan2.7-i2v' });
      expect([model.kind, model.message]).toEqual(['misconfigured', expect.stringMatching(/^DashScope has no model 'wan2\.7-i2v' in China \(Beijing\), dashscope\.aliyuncs\.com .*per region/)]);
    }
    const download = dashscopeErrorOf(beijing, { code: 'InvalidParameter.DataInspection', message: 'Unable to download the media resource during the data inspection process.' }, 'video submit', { status: 400 });
    expect(download.message).toMatch(/could not download the task's input images from this gateway.*PUBLIC_BASE_URL.*\?inline_media=true/);
  });
});

describe('dashscope tasks against the fake', () => {
  let fake: DashScopeFake;
  beforeAll(async () => {
    fake = await startDashScopeFake({ accounts: { 'sk-unit': {} }, pendingMs: 30, runningMs: 30 });
  });
  afterAll(async () => fake?.close());
  const provider = new DashScopeVideoProvider(50);

  async function runToEnd(jobId: string) {
    for (;;) {
      const status = await provider.poll(account(fake.url), jobId, job(), never);
      if (status.state !== 'running') return status;
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  it('reads a failed task\'s error from output and from the top level alike', async () => {
    for (const where of ['output', 'top'] as const) {
      fake.failedErrorIn = where;
      const unsafe = await runToEnd(await provider.submit(account(fake.url), job({ prompt: 'x [ds:unsafe]' }), never));
      expect(unsafe).toMatchObject({ state: 'failed', error: { kind: 'policy', message: 'Output data may contain inappropriate content.', upstreamCode: 'DataInspectionFailed' } });
      const bad = await runToEnd(await provider.submit(account(fake.url), job({ prompt: 'x [ds:bad-param]' }), never));
      expect(bad).toMatchObject({ state: 'failed', error: { kind: 'invalid_request', upstreamCode: 'InvalidParameter' } });
    }
    fake.failedErrorIn = 'output';
  });

  it('fails a task DashScope no longer knows (UNKNOWN) and one that was canceled', async () => {
    const expired = await runToEnd(await provider.submit(account(fake.url), job({ prompt: 'x [ds:expire]' }), never));
    expect(expired).toMatchObject({ state: 'failed', error: { kind: 'failed', message: expect.stringContaining('24 hours') } });
    const never_ = await provider.poll(account(fake.url), '00000000-0000-4000-8000-000000000000', job(), never);
    expect(never_).toMatchObject({ state: 'failed', error: { upstreamCode: 'UNKNOWN' } });
    const queued = await provider.submit(account(fake.url), job({ prompt: 'x [ds:stay-pending]' }), never);
    await provider.cancel(account(fake.url), queued, never);
    expect(await provider.poll(account(fake.url), queued, job(), never)).toMatchObject({ state: 'failed', error: { message: 'the upstream task was canceled' } });
  });

  it('reports a running task it cannot cancel as a permanent failure of the cancel', async () => {
    const running = await provider.submit(account(fake.url), job({ prompt: 'x [ds:stay-running]' }), never);
    await new Promise((r) => setTimeout(r, 60));
    const err = await providerErrorOf(provider.cancel(account(fake.url), running, never));
    expect([err.kind, err.upstreamCode, err.message]).toEqual(['failed', 'UnsupportedOperation', expect.stringContaining('PENDING status')]);
    expect(fake.statusOf(running)).toBe('RUNNING');
  });

  it('sends the async header, prompt_extend off, watermark off unless the member asks, and refuses a missing input before any call', async () => {
    const id = await provider.submit(account(`${fake.url}?watermark=true`), job({ negativePrompt: 'rain' }), never);
    const task = fake.tasks.get(id)!;
    expect(task.headers['x-dashscope-async']).toBe('enable');
    expect(task.body).toEqual({ model: 'wan2.7-t2v', input: { prompt: 'a paper boat on a river', negative_prompt: 'rain' }, parameters: { resolution: '720P', ratio: '16:9', duration: 5, audio: true, prompt_extend: false, watermark: true } });
    const before = fake.tasks.size;
    for (const [model, message] of [
      ['wan2.7-i2v', "DashScope's model wan2.7-i2v makes a video from a first frame; send first_frame"],
      ['happyhorse-1.1-r2v', "DashScope's model happyhorse-1.1-r2v makes a video from reference images; send reference_images"],
    ]) {
      const err = await providerErrorOf(provider.submit(account(fake.url), job({ model }), never));
      expect([err.kind, err.message]).toEqual(['invalid_request', message]);
    }
    expect(fake.tasks.size).toBe(before);
  });
});
