/**
 * The `minimax` video adapter's own rules, beyond the conformance kit: MiniMax's codes as kinds
 * (one table), models found whatever their case and sent in MiniMax's spelling, the prompt
 * optimizer off unless the upstream id asks for it, the bodies of both API generations, both
 * words MiniMax uses for a failed v1 task, and the rules a catalog definition cannot state.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { minimaxErrorOf, MINIMAX_CODES } from '../../server/providers/minimax/minimax-api.ts';
import { minimaxModel } from '../../server/providers/minimax/minimax-models.ts';
import { MiniMaxVideoProvider } from '../../server/providers/minimax/minimax-video.provider.ts';
import type { UpstreamAccount, VideoJob, VideoStatus } from '../../server/providers/types.ts';
import { startMiniMaxFake, type MiniMaxFake } from '../fakes/minimax.ts';
import { noiseFrame } from '../support/video-adapter-conformance.ts';
import { providerErrorOf } from '../support/api-error.ts';

let fake: MiniMaxFake;
beforeAll(async () => {
  fake = await startMiniMaxFake({ apiKeys: ['mm-unit'], queueMs: 20, jobDurationMs: 80 });
});
afterAll(async () => fake?.close());

const never = new AbortController().signal;
const provider = new MiniMaxVideoProvider(50);
const account = (): UpstreamAccount => ({ memberId: 'mem_unit', provider: 'minimax', baseUrl: fake.url, credentials: { api_key: 'mm-unit' }, modelMap: {} });
const job = (o: Partial<VideoJob> = {}): VideoJob => ({
  taskId: `vid_unit_${Math.random().toString(36).slice(2)}`,
  model: 'minimax-hailuo-2.3',
  prompt: 'a paper boat on a river',
  negativePrompt: null,
  durationSeconds: 6,
  aspectRatio: '16:9',
  resolution: '768p',
  generateAudio: false,
  referenceImages: [],
  referenceVideos: [],
  referenceAudios: [],
  ...o,
});
const taskOf = (jobId: string) => fake.tasks.get(jobId.slice(3))!;

async function runToEnd(jobId: string, j: VideoJob): Promise<VideoStatus> {
  for (let i = 0; i < 100; i++) {
    const status = await provider.poll(account(), jobId, j, never);
    if (status.state !== 'running') return status;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error('still running');
}

describe("MiniMax's codes", () => {
  it.each([
    [1002, 'rate_limited'],
    [1004, 'auth'],
    [2049, 'auth'],
    [1008, 'account_disabled'],
    [2038, 'account_disabled'],
    [1026, 'policy'],
    [1027, 'policy'],
    [2013, 'invalid_request'],
    [2061, 'model_not_open'],
    [1028, 'quota_exhausted'],
    [1000, 'retryable'],
    [1024, 'retryable'],
    [1033, 'retryable'],
    [9999, 'retryable'],
  ])('%i is %s', (code, kind) => {
    expect(minimaxErrorOf(code, 'said', 'video submit').kind).toBe(kind);
    if (code !== 9999) expect(MINIMAX_CODES[String(code)]).toBe(kind);
  });

  it("takes 2013 for an unknown model as the member's configuration, and says what the account codes mean", () => {
    expect(minimaxErrorOf(2013, "invalid params, unknown model 'MiniMax-Hailuo-9'", 'video submit').kind).toBe('misconfigured');
    expect(minimaxErrorOf(2013, 'invalid params, duration must be an integer', 'video submit').kind).toBe('invalid_request');
    expect(minimaxErrorOf(1008, 'insufficient balance', 'video submit').message).toBe("the MiniMax account's balance is used up (MiniMax 1008: insufficient balance)");
    expect(minimaxErrorOf(2061, 'x', 'video submit').message).toMatch(/plan does not include this model/);
    expect(minimaxErrorOf(2013, 'invalid params, duration must be an integer', 'video submit').message).toBe('MiniMax rejected the request as invalid (MiniMax 2013: invalid params, duration must be an integer)');
    expect(minimaxErrorOf(1002, 'rate limit', 'video submit').message).toBe('rate limit');
  });
});

describe('models', () => {
  it("finds a model whatever its case and sends MiniMax's spelling; an unknown one goes as given, on v1", () => {
    expect(minimaxModel('minimax-hailuo-2.3')).toEqual({ name: 'MiniMax-Hailuo-2.3', protocol: 'v1', promptOptimizer: false, known: true });
    expect(minimaxModel('MiniMax-H3')).toMatchObject({ name: 'MiniMax-H3', protocol: 'v2' });
    expect(minimaxModel('minimax-h3-max')).toEqual({ name: 'MiniMax-H3-Max', protocol: 'v2', promptOptimizer: false, known: true });
    expect(minimaxModel('s2v-01')).toMatchObject({ name: 'S2V-01', needs: 'subject' });
    expect(minimaxModel('MiniMax-Hailuo-3')).toEqual({ name: 'MiniMax-Hailuo-3', protocol: 'v1', promptOptimizer: false, known: false });
    expect(minimaxModel('minimax-hailuo-2.3-fast-prompt-optimizer')).toMatchObject({ name: 'MiniMax-Hailuo-2.3-Fast', needs: 'first-frame', promptOptimizer: true });
  });

  it('sends a v1 body with the optimizer and the watermark off, in MiniMax\'s tiers', async () => {
    const id = await provider.submit(account(), job({ durationSeconds: 10 }), never);
    expect(id).toMatch(/^v1\/\d+$/);
    expect(taskOf(id).body).toEqual({ model: 'MiniMax-Hailuo-2.3', prompt: 'a paper boat on a river', duration: 10, resolution: '768P', prompt_optimizer: false, aigc_watermark: false });
    const optimized = await provider.submit(account(), job({ model: 'minimax-hailuo-2.3-prompt-optimizer' }), never);
    expect(taskOf(optimized).body).toMatchObject({ model: 'MiniMax-Hailuo-2.3', prompt_optimizer: true });
  });

  it('sends a v2 body: content with the roles, the ratio, 2K', async () => {
    const first = await noiseFrame(640, 360);
    const last = await noiseFrame(640, 360);
    const id = await provider.submit(account(), job({ model: 'minimax-h3', durationSeconds: 12, resolution: '2k', aspectRatio: '9:16', generateAudio: true, firstFrame: first, lastFrame: last }), never);
    expect(id).toMatch(/^v2\/\d+$/);
    const { content, ...rest } = taskOf(id).body as { content: Record<string, unknown>[] };
    expect(rest).toEqual({ model: 'MiniMax-H3', resolution: '2K', duration: 12, ratio: '9:16', aigc_watermark: false });
    expect(content.map((c) => c.role ?? c.type)).toEqual(['text', 'first_frame', 'last_frame']);
    const refs = await provider.submit(account(), job({ model: 'minimax-h3', durationSeconds: 5, referenceImages: [first, last, first] }), never);
    expect(taskOf(refs).images.map((i) => i.role)).toEqual(['reference_image', 'reference_image', 'reference_image']);
  });

  it('sends the one reference image of S2V-01 as its subject', async () => {
    const id = await provider.submit(account(), job({ model: 's2v-01', resolution: '720p', referenceImages: [await noiseFrame(512, 512)] }), never);
    expect(taskOf(id).body.subject_reference).toEqual([{ type: 'character', image: [expect.objectContaining({ role: 'subject', form: 'data', width: 512 })] }]);
  });

  it('refuses before any call what a model cannot take and its catalog definition cannot state', async () => {
    const frame = await noiseFrame(640, 360);
    const before = fake.counts.submit;
    const cases: [Partial<VideoJob>, RegExp][] = [
      [{ model: 'minimax-hailuo-2.3-fast' }, /a first frame on its image-to-video model MiniMax-Hailuo-2.3-Fast/],
      [{ model: 'i2v-01-live', resolution: '720p' }, /a first frame/],
      [{ model: 's2v-01', resolution: '720p' }, /a subject reference image on S2V-01/],
      [{ model: 'minimax-hailuo-02', resolution: '512p' }, /512p on MiniMax-Hailuo-02 only from a first frame/],
      [{ model: 'minimax-hailuo-02', resolution: '512p', firstFrame: frame, lastFrame: frame }, /no last frame at 512p/],
      [{ aspectRatio: '9:16' }, /only 16:9 on MiniMax-Hailuo-2.3/],
      [{ model: 's2v-01', resolution: '720p', referenceImages: [frame, frame] }, /one subject reference image/],
      [{ negativePrompt: 'rain' }, /no negative prompt/],
      [{ durationSeconds: 3 }, /durations of 4 to 15/],
      // MiniMax's prompt limits: 2,000 characters on v1, 7,000 on H3.
      [{ prompt: 'a'.repeat(2001) }, /prompts of at most 2000 characters on MiniMax-Hailuo-2.3/],
      [{ model: 'minimax-h3', durationSeconds: 5, prompt: 'a'.repeat(7001) }, /prompts of at most 7000 characters/],
    ];
    for (const [o, message] of cases) {
      const err = await providerErrorOf(provider.submit(account(), job(o), never));
      expect([err.kind, err.message], JSON.stringify(o)).toEqual(['invalid_request', expect.stringMatching(message)]);
    }
    expect(fake.counts.submit).toBe(before);
    // At the limits, both are taken.
    await provider.submit(account(), job({ prompt: 'a'.repeat(2000) }), never);
    await provider.submit(account(), job({ model: 'minimax-h3', durationSeconds: 5, prompt: 'a'.repeat(7000) }), never);
  });
});

describe('polls', () => {
  it('reads a failed v1 task as Fail or Failed, by its base_resp code when it has one', async () => {
    for (const word of ['Fail', 'Failed'] as const) {
      fake.failWord = word;
      try {
        const refused = job({ prompt: `x ${word} [minimax:sensitive-output]` });
        const failed = job({ prompt: `x ${word} [minimax:fail]` });
        const a = await runToEnd(await provider.submit(account(), refused, never), refused);
        const b = await runToEnd(await provider.submit(account(), failed, never), failed);
        expect(a.state === 'failed' && [a.error.kind, a.error.message, a.error.upstreamCode]).toEqual(['policy', 'MiniMax refused the generated video under its content policy (MiniMax 1027: output new_sensitive)', '1027']);
        expect(b.state === 'failed' && [b.error.kind, b.error.message]).toEqual(['failed', 'the upstream reported the video task as failed']);
      } finally {
        fake.failWord = 'Fail';
      }
    }
  });

  it('records a finished v1 job by its file id and fetches a fresh link at each download', async () => {
    const j = job();
    const id = await provider.submit(account(), j, never);
    const done = await runToEnd(id, j);
    expect(done).toEqual({ state: 'succeeded', output: { file_id: taskOf(id).fileId } });
    for (let i = 0; i < 2; i++) {
      const content = await provider.download(account(), id, (done as { output: Record<string, string> }).output, j, never);
      for await (const _ of content.stream) void _;
    }
    expect(taskOf(id)).toMatchObject({ retrieves: 2, downloads: 2 });
    expect(fake.cdnSawAuth).toBe(0);
  });

  it('fails a job MiniMax does not know instead of asking again, and throws what the query itself met', async () => {
    const unknown = await provider.poll(account(), 'v1/123456789', job(), never);
    expect(unknown.state === 'failed' && [unknown.error.kind, unknown.error.message]).toEqual(['failed', expect.stringMatching(/does not know this video task/)]);
    fake.errorNext('poll', 1004);
    expect((await providerErrorOf(provider.poll(account(), 'v1/123456789', job(), never))).kind).toBe('auth');
    await expect(provider.poll(account(), 'cgt-123', job(), never)).rejects.toThrow(/not a MiniMax video job id/);
  });
});

describe('v2 (MiniMax-H3) refusals and ends, as MiniMax\'s CLI reads them', () => {
  const h3 = (o: Partial<VideoJob> = {}) => job({ model: 'minimax-h3', durationSeconds: 5, resolution: '2k', ...o });

  it('reads the v2 error envelope at an error status: a used-up balance is the account\'s, the content filter a policy refusal', async () => {
    for (const mode of ['error', 'base_resp'] as const) {
      fake.v2Errors = mode;
      fake.setBalance('mm-unit', 'empty');
      try {
        const broke = await providerErrorOf(provider.submit(account(), h3(), never));
        expect([mode, broke.kind, broke.upstreamCode]).toEqual([mode, 'account_disabled', '1008']);
      } finally {
        fake.setBalance('mm-unit', 'ok');
      }
      const refused = await providerErrorOf(provider.submit(account(), h3({ prompt: 'a boat [minimax:sensitive]' }), never));
      expect([mode, refused.kind, refused.upstreamCode]).toEqual([mode, 'policy', '1026']);
    }
    fake.v2Errors = 'error';
  });

  it('sends MiniMax-H3-Max to v2 in its own spelling', async () => {
    const id = await provider.submit(account(), h3({ model: 'minimax-h3-max' }), never);
    expect([id.slice(0, 3), taskOf(id).protocol, (taskOf(id).body as { model: string }).model]).toEqual(['v2/', 'v2', 'MiniMax-H3-Max']);
  });

  it('downloads the recorded link while it works, and asks the task again, once, for a fresh one when it has expired', async () => {
    const j = h3();
    const id = await provider.submit(account(), j, never);
    const done = await runToEnd(id, j);
    const output = (done as { output: Record<string, string> }).output;
    const polls = taskOf(id).polls;
    for await (const _ of (await provider.download(account(), id, output, j, never)).stream) void _;
    expect([taskOf(id).polls, taskOf(id).downloads]).toEqual([polls, 1]);

    // Every link signed while the TTL is 0 is dead at once: the one recorded at the poll, and the
    // one a query signs before the TTL is back; the next query signs one that works.
    const stale = h3();
    fake.urlTtlMs = 0;
    try {
      const staleId = await provider.submit(account(), stale, never);
      const staleOutput = ((await runToEnd(staleId, stale)) as { output: Record<string, string> }).output;
      const before = taskOf(staleId).polls;
      const gone = await providerErrorOf(provider.download(account(), staleId, staleOutput, stale, never));
      expect([gone.kind, gone.message, taskOf(staleId).polls - before]).toEqual(['failed', "the upstream's link to the video expired before it was downloaded", 1]);

      fake.urlTtlMs = 9 * 3_600_000;
      const content = await provider.download(account(), staleId, staleOutput, stale, never);
      for await (const _ of content.stream) void _;
      expect([taskOf(staleId).polls - before, taskOf(staleId).downloads]).toEqual([2, 1]);
    } finally {
      fake.urlTtlMs = 9 * 3_600_000;
    }
    expect(fake.cdnSawAuth).toBe(0);
  });

  it('ends a v2 task MiniMax reports `expired` as failed, not as a word to ask about again', async () => {
    const j = h3({ prompt: 'a boat [minimax:expired]' });
    const end = await runToEnd(await provider.submit(account(), j, never), j);
    expect(end.state).toBe('failed');
  });
});
