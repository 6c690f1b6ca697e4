/**
 * Which DashScope failures are whose: `InvalidParameter.DataInspection` read by its message (an input
 * the client sent, or a gateway DashScope cannot download from), an image format Wan does not take
 * refused before any call, an unknown error code inside a 2xx answer, and a status call's own
 * failure, which never fails the job it asks about as the client's.
 */
import { Readable } from 'node:stream';
import sharp from 'sharp';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { isFailover } from '../../server/pool/pool.ts';
import { dashscopeErrorOf } from '../../server/providers/dashscope/dashscope-api.ts';
import { DashScopeVideoProvider } from '../../server/providers/dashscope/dashscope-video.provider.ts';
import type { MediaInput, UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { startDashScopeFake, type DashScopeFake } from '../fakes/dashscope.ts';
import { providerErrorOf } from '../support/api-error.ts';

const never = new AbortController().signal;
const account = (baseUrl: string, key = 'sk-errors'): UpstreamAccount => ({ memberId: 'mem_errors', provider: 'dashscope', baseUrl, credentials: { api_key: key }, modelMap: {} });
const sg = account('https://dashscope-intl.aliyuncs.com');

const job = (o: Partial<VideoJob> = {}): VideoJob => ({
  taskId: 'vid_errors',
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

/** A stored input as the file service hands it over: its type as recorded, its bytes as stored. */
const input = (bytes: Buffer, contentType: string, width: number, height: number): MediaInput => ({
  contentType,
  bytes: bytes.length,
  width,
  height,
  open: () => Readable.from([bytes]),
  url: async () => {
    throw new Error('not asked for a URL in this test');
  },
});

describe('InvalidParameter.DataInspection, by its message', () => {
  it.each([
    'The media format is not supported or incorrect for the data inspection.',
    'Failed to decode the image during the data inspection.',
    'The image size is not supported for the data inspection.',
    '',
  ])("'%s' is the request's input: the client's 400, the member left in rotation", (message) => {
    const err = dashscopeErrorOf(sg, { code: 'InvalidParameter.DataInspection', message }, 'video submit', { status: 400, model: 'wan2.7-i2v' });
    expect([err.kind, err.upstreamCode, isFailover(err)]).toEqual(['invalid_request', 'InvalidParameter.DataInspection', false]);
    if (message) expect(err.message).toBe(message);
  });

  it.each([
    'Unable to download the media resource during the data inspection process.',
    'Download the media resource timed out during the data inspection process.',
    'Failed to download multimodal content.',
    'Failed to find the requested media resource during the data inspection process.',
    "Don't have authorization to access the media resource during the data inspection process.",
  ])("'%s' is about reaching this gateway: the member's setup, said in its health", (message) => {
    const err = dashscopeErrorOf(sg, { code: 'InvalidParameter.DataInspection', message }, 'video submit', { status: 400 });
    expect(err.kind).toBe('misconfigured');
    expect(err.message).toMatch(/could not download the task's input images from this gateway.*\?inline_media=true/);
  });
});

describe('an error code inside a 2xx answer', () => {
  it('is retryable when the table does not know it (no verdict on the request), and keeps the kind the table gives', () => {
    const unknown = dashscopeErrorOf(sg, { code: 'InternalError', message: 'An internal error has occured, please try again later.' }, 'video submit', { status: 200 });
    expect([unknown.kind, unknown.maybeAccepted, unknown.upstreamCode]).toEqual(['retryable', false, 'InternalError']);
    expect(dashscopeErrorOf(sg, { code: 'Throttling.RateQuota', message: 'Requests rate limit exceeded.' }, 'video submit', { status: 200 }).kind).toBe('rate_limited');
    expect(dashscopeErrorOf(sg, { code: 'InvalidParameter', message: 'The size is not match.' }, 'video submit', { status: 200 }).kind).toBe('invalid_request');
    // A 4xx with an unknown code is still the status's.
    expect(dashscopeErrorOf(sg, { code: 'SomethingNew', message: 'x' }, 'video submit', { status: 400 }).kind).toBe('invalid_request');
  });
});

describe('dashscope calls against the fake', () => {
  let fake: DashScopeFake;
  let gif: Buffer;
  beforeAll(async () => {
    fake = await startDashScopeFake({ accounts: { 'sk-errors': {} }, pendingMs: 30, runningMs: 30 });
    gif = await sharp({ create: { width: 800, height: 600, channels: 3, background: { r: 10, g: 200, b: 30 } } }).gif().toBuffer();
  });
  afterAll(async () => fake?.close());
  beforeEach(() => fake.faults.clear());
  const provider = new DashScopeVideoProvider(50);
  const submits = () => fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/video-synthesis')).length;

  it('refuses an image in a format Wan does not take before any call', async () => {
    const before = submits();
    const err = await providerErrorOf(provider.submit(account(fake.url), job({ model: 'wan2.7-i2v', firstFrame: input(gif, 'image/gif', 800, 600) }), never));
    expect([err.kind, err.message]).toEqual(['invalid_request', 'DashScope takes JPEG, PNG, BMP or WebP images; the first frame is image/gif']);
    expect(submits()).toBe(before);
  });

  it("reads DashScope's refusal of an input's format as the client's, not the member's", async () => {
    // Recorded as a PNG, but its bytes are a GIF: only DashScope's inspection can tell.
    const err = await providerErrorOf(provider.submit(account(`${fake.url}?inline_media=true`), job({ model: 'wan2.2-i2v-plus', resolution: '480p', firstFrame: input(gif, 'image/png', 800, 600) }), never));
    expect([err.kind, err.upstreamStatus, err.upstreamCode, err.message]).toEqual(['invalid_request', 400, 'InvalidParameter.DataInspection', 'The media format is not supported or incorrect for the data inspection.']);
    expect(isFailover(err)).toBe(false);
  });

  it('retries a submit answered 200 with an error code it does not know, on another member (the upstream refused it: nothing was accepted)', async () => {
    fake.faults.push('submit', { status: 200, body: { request_id: 'r-1', code: 'InternalError', message: 'An internal error has occured, please try again later.' } });
    const err = await providerErrorOf(provider.submit(account(fake.url), job(), never));
    expect([err.kind, err.maybeAccepted, isFailover(err)]).toEqual(['retryable', false, true]);
  });

  it("never reads a status call's own failure as the job's or the client's: a 400 or an unknown code at 200 is asked again", async () => {
    const jobId = await provider.submit(account(fake.url), job(), never);
    fake.faults.push('poll', { status: 400, body: { request_id: 'r-2', code: 'InvalidParameter', message: 'Required parameter(s) missing or invalid, please check the request parameters.' } });
    const refused = await providerErrorOf(provider.poll(account(fake.url), jobId, job(), never));
    expect([refused.kind, refused.upstreamStatus, refused.upstreamCode]).toEqual(['retryable', 400, 'InvalidParameter']);
    fake.faults.push('poll', { status: 200, body: { request_id: 'r-3', code: 'InternalError', message: 'An internal error has occured.' } });
    expect((await providerErrorOf(provider.poll(account(fake.url), jobId, job(), never))).kind).toBe('retryable');
    // Credentials and a wrong address keep their kinds (the member's, retried by the runner to the deadline).
    expect((await providerErrorOf(provider.poll(account(fake.url, 'sk-not-a-key'), jobId, job(), never))).kind).toBe('auth');
    fake.faults.push('poll', { status: 404, body: { request_id: 'r-4', code: 'NotFound', message: 'url error, please check url!' } });
    expect((await providerErrorOf(provider.poll(account(fake.url), jobId, job(), never))).kind).toBe('misconfigured');
    // The job itself ran on and is collected.
    for (;;) {
      const status = await provider.poll(account(fake.url), jobId, job(), never);
      if (status.state === 'running') {
        await new Promise((r) => setTimeout(r, 20));
        continue;
      }
      expect(status.state).toBe('succeeded');
      break;
    }
  });
});
