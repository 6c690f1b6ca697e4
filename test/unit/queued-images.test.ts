/**
 * The image adapters behind a job queue (kit/queued-images.ts: fal's queue, Replicate's
 * predictions) against the fake fal queue and the fake Replicate API. An accepted job is billed
 * whether or not anyone collects it, and an error out of the adapter makes the pool submit a NEW
 * job elsewhere: so a poll that meets a passing error (5xx, 429) is asked again and the same job
 * collected, as fal-js and Replicate's SDK retry their polls (upstream-apis.md §7.1, §7.2); an output
 * download gets a few attempts, after which the finished job is thrown as kept (not cancelled: a
 * later try collects it); and a job given up on for any reason is cancelled, and not kept. Images a result
 * carries inline (fal's sync_mode, Replicate's sync mode: data URLs of MBs) are taken from it, read
 * once; a result that cannot be read that way fails the request at once, never read again.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { FalImageProvider } from '../../server/providers/fal/fal-image.provider.ts';
import type { UpstreamMapping } from '../../server/providers/kit/mapping.ts';
import type { ProviderError } from '../../server/providers/provider-error.ts';
import { ReplicateImageProvider } from '../../server/providers/replicate/replicate-image.provider.ts';
import type { ImageEvents, ImageJob, UpstreamAccount } from '../../server/providers/types.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { startReplicateFake, type ReplicateFake } from '../fakes/replicate.ts';
import { imageParams } from '../support/image-params.ts';
import { until } from '../support/tasks.ts';

let fal: FalFake;
let replicate: ReplicateFake;
const durationFor = (prompt: string) => (prompt.includes('[forever]') ? ('never' as const) : undefined);
beforeAll(async () => {
  fal = await startFalFake({ apiKeys: ['fal-q:secret'], queueMs: 30, jobDurationMs: 150, durationFor });
  replicate = await startReplicateFake({ tokens: ['r8_q'], queueMs: 30, jobDurationMs: 150, durationFor });
});
afterAll(async () => {
  await fal?.close();
  await replicate?.close();
});
beforeEach(() => {
  fal.faults.clear();
  replicate.faults.clear();
});

const FAL_FLUX: UpstreamMapping = { endpoint: 'fal-ai/flux/dev', input: '{"prompt": prompt, "image_size": {"width": width, "height": height}, "num_images": n, "output_format": "png"}', output: 'images.url' };
const REPLICATE_FLUX: UpstreamMapping = { endpoint: 'black-forest-labs/flux-schnell', input: '{"prompt": prompt, "num_outputs": n, "output_format": "png"}', output: 'output' };
const falAccount: UpstreamAccount = { memberId: 'mem_q', provider: 'fal', baseUrl: '', credentials: { api_key: 'fal-q:secret' }, modelMap: {} };
const replicateAccount: UpstreamAccount = { memberId: 'mem_q', provider: 'replicate', baseUrl: '', credentials: { api_token: 'r8_q' }, modelMap: {} };

const job = (mapping: UpstreamMapping, prompt = 'a lighthouse'): ImageJob => ({ operation: 'generation', model: mapping.endpoint, prompt, n: 1, params: imageParams(), inputs: [], mapping });

/** Runs the adapter; the images it delivered, or the error it ended with. */
async function generate(provider: FalImageProvider | ReplicateImageProvider, account: UpstreamAccount, j: ImageJob, signal = new AbortController().signal) {
  const images: Buffer[] = [];
  const events: ImageEvents = { partial: async () => undefined, image: async (_i, img) => void images.push(img.image) };
  const error = await provider.generate(account, j, signal, events).then(
    () => undefined,
    (e: unknown) => e as ProviderError,
  );
  return { images, error };
}

describe('fal images', () => {
  const run = (j: ImageJob, signal?: AbortSignal, maxWaitMs = 20_000) => generate(new FalImageProvider(20, maxWaitMs), { ...falAccount, baseUrl: fal.url }, j, signal);
  const newJobs = (before: number) => [...fal.jobs.values()].slice(before);

  for (const [what, fault] of [
    ['a 503 of the status check', () => fal.serverErrorNext('status', 2)],
    ['a 429 of the status check (after its Retry-After)', () => fal.rateLimitNext('status', 1)],
    ['a 503 of the result', () => fal.serverErrorNext('result', 2)],
    ['a 503 of the CDN', () => fal.serverErrorNext('cdn', 2)],
  ] as const) {
    it(`collects the same request through ${what}: one submit, nothing cancelled`, async () => {
      const before = fal.jobs.size;
      fault();
      const { images, error } = await run(job(FAL_FLUX));
      expect(error).toBeUndefined();
      expect(images).toHaveLength(1);
      expect(newJobs(before).map((j) => ({ cancelled: j.cancelled, downloads: j.downloads }))).toEqual([{ cancelled: false, downloads: 1 }]);
    });
  }

  it('keeps a completed request whose output the CDN fails to serve three times: not cancelled, its error says so, collected by the next try', async () => {
    const before = fal.jobs.size;
    fal.serverErrorNext('cdn', 3);
    const refs: unknown[] = [];
    const events: ImageEvents = { partial: async () => undefined, image: async () => expect.unreachable('no image was served'), submitted: async (ref) => void refs.push(ref) };
    const error = await new FalImageProvider(20, 20_000).generate({ ...falAccount, baseUrl: fal.url }, job(FAL_FLUX), new AbortController().signal, events).then(
      () => expect.unreachable('the call succeeded'),
      (e: unknown) => e as ProviderError,
    );
    expect([error.kind, error.upstreamStatus, error.jobKept]).toEqual(['retryable', 503, true]);
    // The next try resumes the request it recorded (ImageJob.resume): no second one.
    const resumed = await run({ ...job(FAL_FLUX), resume: refs[0] });
    expect([resumed.error, resumed.images.length]).toEqual([undefined, 1]);
    expect(newJobs(before).map((j) => j.cancelled)).toEqual([false]);
  });

  it('cancels the request when a status check fails in a way asking again cannot fix', async () => {
    const before = fal.jobs.size;
    fal.faults.push('status', { status: 401, body: { detail: 'No user found for Key ID and Secret' } });
    const { error } = await run(job(FAL_FLUX, 'a lighthouse [forever]'));
    expect(error?.kind).toBe('auth');
    const [submitted, ...more] = newJobs(before);
    expect(more).toEqual([]);
    await until(() => submitted!.cancelled, 5000, 'the fal request to be cancelled');
  });

  it('cancels the request when the client goes away, and when it outlives its wait', async () => {
    const before = fal.jobs.size;
    const controller = new AbortController();
    const left = run(job(FAL_FLUX, 'a lighthouse [forever]'), controller.signal);
    await until(() => fal.jobs.size > before && [...fal.jobs.values()].at(-1)!.statusChecks > 0, 5000, 'the request to be polled');
    controller.abort();
    expect((await left).error).toBeDefined();
    const timedOut = await run(job(FAL_FLUX, 'a lighthouse [forever]'), undefined, 200);
    expect([timedOut.error?.kind, timedOut.error?.message, timedOut.error?.jobKept]).toEqual(['retryable', expect.stringContaining('did not complete within'), false]);
    const made = newJobs(before);
    expect(made).toHaveLength(2);
    await until(() => made.every((j) => j.cancelled), 5000, 'both fal requests to be cancelled');
  });

  it('looks again after a status answer whose error body broke off (a passing failure, not the job\'s): the job is collected', async () => {
    const before = fal.jobs.size;
    fal.faults.push('status', { status: 503, body: { detail: 'upstream busy, please retry later' }, cutAfterBytes: 5 });
    const { error, images } = await run(job(FAL_FLUX));
    expect(error).toBeUndefined();
    expect(images).toHaveLength(1);
    const made = newJobs(before);
    expect(made).toHaveLength(1);
    expect(made[0]!.cancelled).toBe(false);
  });

  it('never waits past its wait for a long Retry-After: the request ends at its wait and is cancelled', async () => {
    const before = fal.jobs.size;
    fal.rateLimitNext('status', 600, 50);
    const ended = await run(job(FAL_FLUX, 'a lighthouse [forever]'), undefined, 300);
    // Its last look, at the end of the wait, met the rate limit again: that is what it ends with.
    expect([ended.error?.kind, ended.error?.retryAfterMs]).toEqual(['rate_limited', 600_000]);
    const made = newJobs(before);
    expect(made).toHaveLength(1);
    await until(() => made[0]!.cancelled, 5000, 'the fal request to be cancelled');
  });

  it('delivers a 2048x2048 image fal put inside its result (sync_mode, a data URL of 16 MB): one submit, one result read', async () => {
    const mapping: UpstreamMapping = { endpoint: 'fal-ai/bytedance/seedream/v4/text-to-image', input: '{"prompt": prompt, "image_size": {"width": 2048, "height": 2048}, "num_images": n, "sync_mode": true}', output: 'images.url' };
    const [submits, results, cdn] = [fal.counts.submit, fal.counts.result, fal.counts.cdn];
    const { images, error } = await run({ ...job(mapping), params: imageParams({ width: 2048, height: 2048, resolution: '2K' }) });
    expect(error).toBeUndefined();
    expect([fal.counts.submit - submits, fal.counts.result - results, fal.counts.cdn - cdn]).toEqual([1, 1, 0]);
    expect(images).toHaveLength(1);
    const meta = await sharp(images[0]!).metadata();
    expect([meta.width, meta.height, meta.format]).toEqual([2048, 2048, 'png']);
  });

  it('fails at once, after one result read, a result it cannot read (a data URL that is not base64): not asked again, not submitted again', async () => {
    const [submits, results] = [fal.counts.submit, fal.counts.result];
    fal.faults.push('result', { status: 200, body: { images: [{ url: 'data:image/png;base64,iVBORw0K!!!!' }] } }, 50);
    const { error } = await run(job(FAL_FLUX), undefined, 600_000);
    expect([error?.kind, error?.message]).toEqual(['failed', 'the fal result holds a data URL that is not valid base64']);
    expect([fal.counts.submit - submits, fal.counts.result - results]).toEqual([1, 1]);
  });

  it('fails a request whose status said it failed without asking again for its result, which answered 503', async () => {
    fal.serverErrorNext('result', 100);
    const before = fal.counts.result;
    const { error } = await run(job(FAL_FLUX, 'a storm [fal:fail]'), undefined, 600_000);
    expect([error?.kind, error?.message, fal.counts.result - before]).toEqual(['failed', expect.stringContaining('Runner disconnected'), 1]);
  });
});

describe('Replicate images', () => {
  const run = (j: ImageJob) => generate(new ReplicateImageProvider(20, 20_000), { ...replicateAccount, baseUrl: replicate.baseUrl }, j);
  const newPredictions = (before: number) => [...replicate.predictions.values()].slice(before);

  for (const [what, fault] of [
    ['a 503 of the prediction GET', () => replicate.serverErrorNext('get', 2)],
    ['a 429 of the prediction GET (after its Retry-After)', () => replicate.rateLimitNext('get', 1)],
    ['a 503 of the file CDN', () => replicate.serverErrorNext('cdn', 2)],
  ] as const) {
    it(`collects the same prediction through ${what}: one create, nothing canceled`, async () => {
      const before = replicate.predictions.size;
      fault();
      const { images, error } = await run(job(REPLICATE_FLUX));
      expect(error).toBeUndefined();
      expect(images).toHaveLength(1);
      expect(newPredictions(before).map((p) => ({ status: p.status, downloads: p.downloads }))).toEqual([{ status: 'succeeded', downloads: 1 }]);
    });
  }

  it('delivers images a waited-for prediction carries inline (data URLs over 4 MiB in all): one create, nothing downloaded', async () => {
    const before = replicate.predictions.size;
    replicate.inlineOutputs = true;
    try {
      const { images, error } = await run({ ...job({ ...REPLICATE_FLUX, wait: 10 }), n: 2 });
      expect(error).toBeUndefined();
      expect(images).toHaveLength(2);
    } finally {
      replicate.inlineOutputs = false;
    }
    const made = newPredictions(before);
    expect(made.map((p) => ({ status: p.status, prefer: p.prefer, gets: p.gets, downloads: p.downloads }))).toEqual([{ status: 'succeeded', prefer: 'wait=10', gets: 0, downloads: 0 }]);
    expect((made[0]!.output as string[]).reduce((sum, url) => sum + url.length, 0)).toBeGreaterThan(4 * 1024 * 1024);
  });

  it('keeps a finished prediction whose output the file CDN fails to serve three times: not canceled, its error says so', async () => {
    const before = replicate.predictions.size;
    replicate.serverErrorNext('cdn', 3);
    const { images, error } = await run(job(REPLICATE_FLUX));
    expect([images.length, error?.kind, error?.jobKept]).toEqual([0, 'retryable', true]);
    expect(newPredictions(before).map((p) => p.status)).toEqual(['succeeded']);
  });

  it('cancels the prediction when a GET fails in a way asking again cannot fix', async () => {
    const before = replicate.predictions.size;
    replicate.faults.push('get', { status: 401, body: { title: 'Unauthenticated', detail: 'You did not pass a valid authentication token', status: 401 } });
    const { error } = await run(job(REPLICATE_FLUX, 'a fox [forever]'));
    expect(error?.kind).toBe('auth');
    const [created, ...more] = newPredictions(before);
    expect(more).toEqual([]);
    await until(() => created!.status === 'canceled', 5000, 'the prediction to be canceled');
  });
});
