/**
 * The `ark` adapters' own rules: the size each Seedream version is asked for (every size the shipped
 * definitions offer, the official tables, custom ratios), Ark's error codes as kinds
 * (upstream-apis.md §5.3, §10.3, and rows of Volcengine's error-code table answered by the fake),
 * and the Seedance task states the public API does not reach (a rule only an operator's own
 * catalog model can meet, a cancelled or deleted task).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadCatalogDefinitions } from '../../server/catalog/catalog-definitions.ts';
import { arkErrorOf } from '../../server/providers/ark/ark-errors.ts';
import { ArkImageProvider } from '../../server/providers/ark/ark-image.provider.ts';
import { ArkVideoProvider } from '../../server/providers/ark/ark-video.provider.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { ImageJob, UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { startArkFake, type ArkFake, type ArkTableError } from '../fakes/ark.ts';
import { imageParams } from '../support/image-params.ts';
import { noiseFrame } from '../support/video-adapter-conformance.ts';
import { seedreamSize, seedreamVersion } from '../../server/providers/ark/seedream-sizes.ts';
import { SIZE_TABLES } from '../../server/services/image/image-size.ts';
import { videoJob } from '../support/video-job.ts';

const dims = (size: string) => size.split('x').map(Number) as [number, number];

describe('Seedream sizes', () => {
  const shipped = loadCatalogDefinitions().filter((d) => d.provider === 'ark' && d.model.kind === 'image');

  it('ships Seedream 4.0, 4.5 and 5.0 lite', () => {
    expect(shipped.map((d) => d.upstreamModel).sort()).toEqual(['seedream-4-0-250828', 'seedream-4-5-251128', 'seedream-5-0-260128']);
  });

  it.each(shipped.map((d) => [d.id, d] as const))('%s: every offered size is asked for as a size the version takes, in the same ratio, never smaller', (_id, def) => {
    const version = seedreamVersion(def.upstreamModel);
    const caps = def.model.image!;
    for (const resolution of caps.resolutions) {
      for (const ratio of caps.aspect_ratios) {
        const { width, height } = SIZE_TABLES.reference[resolution]![ratio]!;
        const [w, h] = dims(seedreamSize(version, width, height, ratio));
        const at = `${resolution} ${ratio}: ${w}x${h}`;
        expect(w * h, at).toBeGreaterThanOrEqual(version.minPixels);
        expect(w * h, at).toBeLessThanOrEqual(version.maxPixels);
        expect(w * h, at).toBeGreaterThanOrEqual(width * height);
        // Resized to the promised size afterwards: at most a sliver is cropped.
        expect(Math.abs(Math.log(w / h) - Math.log(width / height)), at).toBeLessThan(0.02);
      }
    }
  });

  it('asks for the promised size when the version takes it, else the official size of the ratio at the smallest tier large enough', () => {
    const v40 = seedreamVersion('seedream-4-0-250828');
    const v45 = seedreamVersion('doubao-seedream-4-5-251128');
    const v50 = seedreamVersion('seedream-5-0-260128');
    expect(seedreamSize(v40, 2048, 1152, '16:9')).toBe('2048x1152');
    // 1248x528 is under 4.0's 921,600 pixels: its 1K 21:9.
    expect(seedreamSize(v40, 1248, 528, '21:9')).toBe('1512x648');
    // 2048x1152 is under 4.5's 3,686,400: its 2K 16:9; 4:3 is landscape (the doc's swapped rows put right).
    expect(seedreamSize(v45, 2048, 1152, '16:9')).toBe('2848x1600');
    expect(seedreamSize(v45, 2048, 1536, '4:3')).toBe('2304x1728');
    expect(seedreamSize(v45, 1248, 832, '3:2')).toBe('2496x1664');
    // Every 4K size of the table is within 5.0 lite's range: exact.
    expect(seedreamSize(v50, 3840, 2160, '16:9')).toBe('3840x2160');
  });

  it('scales a custom ratio no table has into the version\'s range, keeping the ratio', () => {
    const v45 = seedreamVersion('seedream-4-5-251128');
    const [w, h] = dims(seedreamSize(v45, 1024, 640, '8:5'));
    expect(w * h).toBeGreaterThanOrEqual(v45.minPixels);
    expect(w / h).toBeCloseTo(1.6, 2);
  });

  it('treats an endpoint id or an unknown model as what every version takes', () => {
    const common = seedreamVersion('ep-20260101123456-abcde');
    expect([common.minPixels, common.maxPixels, common.png]).toEqual([3_686_400, 10_404_496, false]);
    expect(seedreamSize(common, 2048, 1152, '16:9')).toBe('2848x1600');
    expect(seedreamVersion('seedream-5-0-pro-260628')).toBe(common);
  });
});

describe('Ark error codes', () => {
  const kind = (code: string, status?: number, param = '') => arkErrorOf({ code, message: `${code} happened. Request id: 0217x`, param }, 'video submit', { ...(status !== undefined && { status }) }).kind;

  it('classifies by code before status', () => {
    expect(kind('ModelNotOpen', 404)).toBe('model_not_open');
    expect(kind('InvalidEndpointOrModel.NotFound', 404)).toBe('misconfigured');
    expect(kind('UnsupportedModel', 404)).toBe('misconfigured');
    expect(kind('AccountOverdueError', 403)).toBe('account_disabled');
    expect(kind('OperationDenied.ServiceOverdue', 403)).toBe('account_disabled');
    expect(kind('AccessDenied', 403)).toBe('auth');
    expect(kind('RateLimitExceeded.EndpointRPMExceeded', 429)).toBe('rate_limited');
    expect(kind('ModelAccountIpmRateLimitExceeded', 429)).toBe('rate_limited');
    expect(kind('ServerOverloaded', 429)).toBe('rate_limited');
    // Without a wording of a longer quota, QuotaExceeded is a wait (the table's queued-tasks row).
    expect(kind('QuotaExceeded', 429)).toBe('rate_limited');
    expect(kind('OutputImageSensitiveContentDetected')).toBe('policy');
    expect(kind('InputImageSensitiveContentDetected.PrivacyInformation', 400)).toBe('policy');
    expect(kind('InvalidParameter', 400)).toBe('invalid_request');
    expect(kind('InternalServiceError', 500)).toBe('retryable');
    // A closed or unavailable endpoint is the member's, not the request's (a 400 all the same).
    expect(kind('InvalidEndpoint.ClosedEndpoint', 400)).toBe('misconfigured');
    // The risk-control names of the same refusal, with a status or per image without one.
    expect(kind('InputTextRiskDetection', 400)).toBe('policy');
    expect(kind('OutputImageRiskDetection')).toBe('policy');
    // A refused model parameter is the member's model map, not the client's request.
    expect(kind('InvalidParameter', 400, 'model')).toBe('misconfigured');
    // An unknown code falls back to the status; without a status it is worth another try.
    expect(kind('SomethingNew', 403)).toBe('auth');
    expect(kind('SomethingNew')).toBe('retryable');
  });

  it('keeps a rate limit without Retry-After without a wait (the pool\'s backoff applies), and never quotes what an auth failure said', () => {
    const limited = arkErrorOf({ code: 'RateLimitExceeded.EndpointRPMExceeded', message: 'too fast' }, 'video submit', { status: 429, headers: { get: () => null } });
    expect([limited.kind, limited.retryAfterMs, limited.upstreamCode]).toEqual(['rate_limited', undefined, 'RateLimitExceeded.EndpointRPMExceeded']);
    const auth = arkErrorOf({ code: 'AuthenticationError', message: 'the API key sk-abcdef0123456789 is invalid' }, 'video submit', { status: 401 });
    expect(auth.message).toBe("the upstream refused the account's credentials (HTTP 401 AuthenticationError)");
  });
});

describe('Ark error-table codes through the adapters against the fake', () => {
  // Volcengine's error-code table (https://www.volcengine.com/docs/82379/1299023) as the fake answers it.
  let fake: ArkFake;
  beforeAll(async () => {
    fake = await startArkFake();
  });
  afterAll(async () => fake?.close());
  const never = new AbortController().signal;
  const account = (): UpstreamAccount => ({ memberId: 'mem_unit', provider: 'ark', baseUrl: `${fake.url}/api/v3`, credentials: { api_key: 'ark-test' }, modelMap: {} });
  const video: VideoJob = { taskId: 'vid_unit', model: 'seedance-1-0-pro-250528', prompt: 'a boat', negativePrompt: null, durationSeconds: 5, aspectRatio: '16:9', resolution: '720p', generateAudio: false, referenceImages: [], referenceVideos: [], referenceAudios: [] };
  const submitFails = async (name: ArkTableError) => {
    fake.errorNext('submit', name);
    const err = await new ArkVideoProvider(50).submit(account(), video, never).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    return err as ProviderError;
  };
  const kindOf = async (name: ArkTableError) => {
    const err = await submitFails(name);
    return [err.kind, err.upstreamStatus, err.upstreamCode];
  };

  it('retries a failure of Volcengine\'s risk-detection service (400 ContentSecurityDetectionError) instead of blaming the request', async () => {
    fake.errorNext('images', 'ContentSecurityDetectionError');
    const job: ImageJob = { operation: 'generation', model: 'seedream-4-0-250828', prompt: 'a cat', n: 1, params: imageParams({ width: 2048, height: 2048 }), inputs: [] };
    const err = await new ArkImageProvider().generate(account(), job, never, { partial: async () => {}, image: async () => {} }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    expect([(err as ProviderError).kind, (err as ProviderError).upstreamStatus, (err as ProviderError).upstreamCode]).toEqual(['retryable', 400, 'ContentSecurityDetectionError']);
    expect(await kindOf('ContentSecurityDetectionError')).toEqual(['retryable', 400, 'ContentSecurityDetectionError']);
  });

  it('takes an answer that broke off or held no image after its 200 as maybe accepted: Seedream may have made (and billed) the images', async () => {
    const job: ImageJob = { operation: 'generation', model: 'seedream-4-0-250828', prompt: 'a cat', n: 1, params: imageParams({ width: 2048, height: 2048 }), inputs: [] };
    const generate = async () => (await new ArkImageProvider().generate(account(), job, never, { partial: async () => {}, image: async () => {} }).then(() => undefined, (e: unknown) => e)) as ProviderError;
    fake.faults.push('images', { status: 200, body: { model: 'seedream-4-0-250828', created: 1 } });
    const noList = await generate();
    expect([noList.kind, noList.maybeAccepted, noList.message]).toEqual(['retryable', true, 'the upstream image generation answered without a data list']);
    fake.faults.push('images', { status: 200, body: { data: [{ b64_json: Buffer.from('not an image').toString('base64') }] } });
    const undecodable = await generate();
    expect([undecodable.kind, undecodable.maybeAccepted]).toEqual(['retryable', true]);
    fake.faults.push('images', { cutAfterBytes: 20 });
    const cut = await generate();
    expect([cut.kind, cut.maybeAccepted]).toEqual(['retryable', true]);
  });

  it('takes a model service that is not open (403 OperationDenied.ServiceNotOpen) as that model\'s, not the credentials\'', async () => {
    expect(await kindOf('OperationDenied.ServiceNotOpen')).toEqual(['model_not_open', 403, 'OperationDenied.ServiceNotOpen']);
  });

  it('takes a model paused by its inference limit (429 SetLimitExceeded) as that model\'s until its owner acts, not a rate limit', async () => {
    const err = await submitFails('SetLimitExceeded');
    expect([err.kind, err.upstreamStatus, err.upstreamCode]).toEqual(['model_not_open', 429, 'SetLimitExceeded']);
    expect(err.message).toContain('has reached the set inference limit for the [seedance-1-0-pro-250528] model');
  });

  it('tells the three QuotaExceeded rows apart: queued tasks wait, a used-up free trial is the model\'s, a usage-period quota the account\'s', async () => {
    expect(await kindOf('QuotaExceeded:queued-tasks')).toEqual(['rate_limited', 429, 'QuotaExceeded']);
    expect(await kindOf('QuotaExceeded:free-trial')).toEqual(['model_not_open', 429, 'QuotaExceeded']);
    expect(await kindOf('QuotaExceeded:usage-quota')).toEqual(['quota_exhausted', 429, 'QuotaExceeded']);
  });
});

describe('Seedance tasks', () => {
  let fake: ArkFake;
  beforeAll(async () => {
    fake = await startArkFake({ queuedMs: 30, runningMs: 30 });
  });
  afterAll(async () => fake?.close());
  const never = new AbortController().signal;
  const provider = new ArkVideoProvider(50);
  const account = (): UpstreamAccount => ({ memberId: 'mem_unit', provider: 'ark', baseUrl: `${fake.url}/api/v3`, credentials: { api_key: 'ark-test' }, modelMap: {} });
  const job = (o: Partial<VideoJob> = {}): VideoJob => videoJob({ taskId: 'vid_unit', model: 'seedance-1-0-pro-250528', prompt: 'a boat', ...o });

  it('refuses 1080p with reference images on the lite i2v model (an operator\'s own catalog model may offer it) without calling Ark', async () => {
    const tasks = fake.tasks.size;
    const frame = await noiseFrame(640, 360);
    const err = await provider.submit(account(), job({ model: 'doubao-seedance-1-0-lite-i2v-250428', resolution: '1080p', referenceImages: [frame] }), never).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    expect([(err as ProviderError).kind, (err as ProviderError).message]).toEqual(['invalid_request', 'Seedance accepts no 1080p with reference images on its lite model']);
    expect(fake.tasks.size).toBe(tasks);
  });

  it('reports a task cancelled upstream, and one whose record is gone, as failed', async () => {
    const id = await provider.submit(account(), job({ prompt: 'a queue [ark:stay-queued]' }), never);
    await provider.cancel(account(), id, never);
    const cancelled = await provider.poll(account(), id, job(), never);
    expect(cancelled.state === 'failed' && [cancelled.error.kind, cancelled.error.message]).toEqual(['failed', 'the upstream task was cancelled']);

    const failed = await provider.submit(account(), job({ prompt: 'x [ark:fail]' }), never);
    await new Promise((r) => setTimeout(r, 100));
    // DELETE of a finished task deletes its record; a cancel of a task Ark no longer knows is done.
    await provider.cancel(account(), failed, never);
    const gone = await provider.poll(account(), failed, job(), never);
    expect(gone.state === 'failed' && [gone.error.kind, gone.error.upstreamStatus]).toEqual(['failed', 404]);
    await expect(provider.cancel(account(), failed, never)).resolves.toBeUndefined();
  });
});

describe('Seedance prompt flags', () => {
  it('takes the parameter flags Seedance reads from prompt text out, so only the billed body parameters count', async () => {
    const { withoutParameterFlags } = await import('../../server/providers/ark/ark-video.provider.ts');
    expect(withoutParameterFlags('a fox in the snow --dur 12 --rs 1080p --rt=21:9 --wm true')).toBe('a fox in the snow');
    expect(withoutParameterFlags('--duration 10 a fox --frames 289 --camerafixed false')).toBe('a fox');
    // Other double dashes stay: only Seedance's flags are parameters.
    expect(withoutParameterFlags('a sign that says --open-- and a fox')).toBe('a sign that says --open-- and a fox');
  });
});
