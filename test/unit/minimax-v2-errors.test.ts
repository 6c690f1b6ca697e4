/**
 * MiniMax's v2 API (H3) refuses in the envelope of its own pages (video-generation-v2-create and
 * -regeneration): `{type: "error", error: {type, message: "… (2013)", http_code}, request_id}`,
 * with no `error.code`. The adapter reads the code at the end of the message, so the code table
 * applies to v2 as to v1; takes the envelope at any HTTP status as an answered refusal (never a job
 * maybe accepted); and falls back to `error.type` when no code is found. And a 2013 about the
 * client's input that mentions "the model" stays the client's, not the member's model map.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { errorOfAnswer, minimaxErrorOf } from '../../server/providers/minimax/minimax-api.ts';
import { MiniMaxVideoProvider } from '../../server/providers/minimax/minimax-video.provider.ts';
import type { UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { startMiniMaxFake, type MiniMaxFake } from '../fakes/minimax.ts';
import { providerErrorOf } from '../support/api-error.ts';

let fake: MiniMaxFake;
beforeAll(async () => {
  fake = await startMiniMaxFake({ apiKeys: ['mm-v2'], queueMs: 20, jobDurationMs: 80 });
});
afterAll(async () => fake?.close());

const never = new AbortController().signal;
const provider = new MiniMaxVideoProvider(50);
const account = (): UpstreamAccount => ({ memberId: 'mem_v2', provider: 'minimax', baseUrl: fake.url, credentials: { api_key: 'mm-v2' }, modelMap: {} });
const h3 = (o: Partial<VideoJob> = {}): VideoJob => ({
  taskId: `vid_v2_${Math.random().toString(36).slice(2)}`,
  model: 'minimax-h3',
  prompt: 'a paper boat on a river',
  negativePrompt: null,
  durationSeconds: 5,
  aspectRatio: '16:9',
  resolution: '2k',
  generateAudio: false,
  referenceImages: [],
  referenceVideos: [],
  referenceAudios: [],
  ...o,
});
const noHeaders = { get: () => null };

describe('v2 refusals in the documented envelope, through the fake', () => {
  it('applies the code table to the code at the end of the message: 2061 takes the member out for the model, 2038 for the account, 1028 is a used-up quota', async () => {
    fake.permitModels('mm-v2', ['MiniMax-Hailuo-2.3']);
    try {
      const plan = await providerErrorOf(provider.submit(account(), h3(), never));
      expect([plan.kind, plan.upstreamCode, plan.upstreamStatus, plan.maybeAccepted]).toEqual(['model_not_open', '2061', 400, false]);
      expect(plan.message).toBe("the MiniMax account's plan does not include this model (MiniMax 2061: your current token plan does not support this model)");
    } finally {
      fake.permitModels('mm-v2', undefined);
    }
    fake.errorNext('submit', 2038, { message: 'real-name verification required' });
    const unverified = await providerErrorOf(provider.submit(account(), h3(), never));
    expect([unverified.kind, unverified.upstreamCode]).toEqual(['account_disabled', '2038']);
    fake.errorNext('submit', 1028, { message: 'token plan usage quota exhausted' });
    const quota = await providerErrorOf(provider.submit(account(), h3(), never));
    expect([quota.kind, quota.upstreamCode, quota.upstreamStatus]).toEqual(['quota_exhausted', '1028', 429]);
  });

  it("reads an unknown model as the member's configuration, a content refusal as policy, a rate limit with its Retry-After", async () => {
    fake.errorNext('submit', 2013, { message: "invalid params, unknown model 'MiniMax-H3'" });
    const unknown = await providerErrorOf(provider.submit(account(), h3(), never));
    expect([unknown.kind, unknown.message]).toEqual(['misconfigured', "MiniMax does not have the model the member asked for (MiniMax 2013: invalid params, unknown model 'MiniMax-H3')"]);
    const refused = await providerErrorOf(provider.submit(account(), h3({ prompt: 'a storm [minimax:sensitive]' }), never));
    expect([refused.kind, refused.upstreamCode, refused.message]).toEqual(['policy', '1026', 'MiniMax refused the prompt or an input image under its content policy (MiniMax 1026: video description contains sensitive content)']);
    fake.rateLimitNext('submit', 7);
    const limited = await providerErrorOf(provider.submit(account(), h3(), never));
    expect([limited.kind, limited.upstreamCode, limited.retryAfterMs]).toEqual(['rate_limited', '1002', 7000]);
  });

  it('takes the envelope at HTTP 200 as an answered refusal, not as a job maybe accepted without its id', async () => {
    fake.errorNext('submit', 1008, { status: 200 });
    const broke = await providerErrorOf(provider.submit(account(), h3(), never));
    expect([broke.kind, broke.upstreamCode, broke.maybeAccepted, broke.message]).toEqual(['account_disabled', '1008', false, "the MiniMax account's balance is used up (MiniMax 1008: insufficient balance)"]);
  });

  it('fails a v2 task MiniMax no longer knows (2013 in the envelope of the query) instead of asking again', async () => {
    const status = await provider.poll(account(), 'v2/123456789', h3(), never);
    expect(status.state === 'failed' && [status.error.kind, status.error.message]).toEqual(['failed', expect.stringMatching(/does not know this video task .*task 123456789 not found/)]);
  });
});

describe('v2 refusals without a code', () => {
  const refusal = (status: number, error: Record<string, unknown>) => errorOfAnswer({ status, headers: noHeaders, body: { type: 'error', error, request_id: 'r' } }, 'video submit');

  it('falls back to the documented error.type, then to the status the envelope names', () => {
    expect(refusal(402, { type: 'insufficient_balance_error', message: 'insufficient balance', http_code: '402' })?.kind).toBe('account_disabled');
    expect(refusal(401, { type: 'authorized_error', message: 'login fail', http_code: '401' })?.kind).toBe('auth');
    expect(refusal(422, { type: 'unprocessable_entity_error', message: 'video description contains sensitive content', http_code: '422' })?.kind).toBe('policy');
    expect(refusal(500, { type: 'server_error', message: 'internal error', http_code: '500' })?.kind).toBe('retryable');
    const bad = refusal(400, { type: 'bad_request_error', message: 'invalid params', http_code: '400' });
    expect([bad?.kind, bad?.message, bad?.upstreamCode]).toEqual(['invalid_request', 'invalid params (HTTP 400)', undefined]);
    // At HTTP 200, with a type this adapter does not know: the status it names.
    expect(refusal(200, { type: 'some_new_error', message: 'slow down', http_code: '429' })?.kind).toBe('rate_limited');
    // A code the table does not know: the type says what it is.
    expect(refusal(400, { type: 'bad_request_error', message: 'invalid params, something new (2999)', http_code: '400' })).toMatchObject({ kind: 'invalid_request', upstreamCode: '2999' });
  });

  it('still reads a 2xx answer without the envelope as no error', () => {
    expect(errorOfAnswer({ status: 200, headers: noHeaders, body: { task_id: '42' } }, 'video submit')).toBeUndefined();
    expect(errorOfAnswer({ status: 200, headers: noHeaders, body: { task: { status: 'failed', error: { code: '1027', message: 'x' } } } }, 'video status')).toBeUndefined();
  });
});

describe("a 2013 that mentions the model: the member's model, or the client's input", () => {
  it.each([
    ["invalid params, unknown model 'MiniMax-Hailuo-9'", 'misconfigured'],
    ["invalid params, model 'MiniMax-H9' does not exist", 'misconfigured'],
    ['invalid params, model MiniMax-H9 is not supported (2013)', 'misconfigured'],
    ['model not found', 'misconfigured'],
    ['invalid params, the model does not support this first_frame_image', 'invalid_request'],
    ['invalid params, the model does not support 512P, use 768P', 'invalid_request'],
    ['the model is not supported for image input', 'invalid_request'],
    ['invalid params, duration must be an integer', 'invalid_request'],
  ])('"%s" is %s', (message, kind) => {
    expect(minimaxErrorOf(2013, message, 'video submit').kind).toBe(kind);
  });
});
