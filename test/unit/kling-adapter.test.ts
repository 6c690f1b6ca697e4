/**
 * The `kling` video adapter through the conformance kit against the fake Kling API
 * (test/fakes/kling.ts), and what is Kling's own: the JWT (signed, cached per access key, renewed
 * before it expires, refused by the fake when expired, not yet valid, wrongly signed or malformed),
 * the envelope's codes over the HTTP status, the endpoint a job's shape and model choose, the
 * model-id convention for `mode`, raw base64 images, string durations.
 */
import { SignJWT } from 'jose';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KlingTokens } from '../../server/providers/kling/kling-auth.ts';
import { KlingVideoProvider, endpointOf, klingModel } from '../../server/providers/kling/kling-video.provider.ts';
import { shapeOf, type UpstreamAccount, type VideoJob } from '../../server/providers/types.ts';
import { startKlingFake, type KlingFake } from '../fakes/kling.ts';
import { describeVideoConformance, mediaInputOf, noiseFrame, type ConformanceRoute } from '../support/video-adapter-conformance.ts';
import { providerErrorOf } from '../support/api-error.ts';
import { until } from '../support/tasks.ts';
import { videoJob } from '../support/video-job.ts';

let fake: KlingFake;
beforeAll(async () => {
  fake = await startKlingFake({
    accounts: [
      { accessKey: 'ak-conformance', secretKey: 'sk-conformance-secret' },
      { accessKey: 'ak-other', secretKey: 'sk-other-secret' },
    ],
    jobDurationMs: 250,
  });
});
afterAll(async () => fake?.close());

const account = (o: Partial<Record<'access_key' | 'secret_key', string>> = {}): UpstreamAccount => ({
  memberId: 'mem_kling_conformance',
  provider: 'kling',
  baseUrl: fake.url,
  credentials: { access_key: 'ak-conformance', secret_key: 'sk-conformance-secret', ...o },
  modelMap: {},
});

const job = (o: Partial<VideoJob> = {}): VideoJob => videoJob({ taskId: `vid_kling_${Math.random().toString(36).slice(2)}`, model: 'kling-v3-std', prompt: 'a paper boat on a river', ...o });

const taskOf = (jobId: string) => fake.tasks.get(jobId.slice(jobId.indexOf('/') + 1));
const never = new AbortController().signal;

const ROUTES: Record<ConformanceRoute, 'submit' | 'poll' | 'cdn'> = { submit: 'submit', poll: 'poll', download: 'cdn' };

describeVideoConformance('kling', { idempotent: true, cancels: false }, () => ({
  provider: new KlingVideoProvider({ pollIntervalMs: 100 }),
  account: () => account(),
  badAccount: () => account({ secret_key: 'sk-not-the-secret-of-this-account' }),
  job: (o = {}) => job({ ...(o.prompt && { prompt: o.prompt }), ...(o.model && { model: o.model }), ...(o.taskId && { taskId: o.taskId }), ...(o.firstFrame && { firstFrame: o.firstFrame }) }),
  policyPrompt: 'kling-risk',
  failPrompt: 'kling-fail',
  unknownModel: 'kling-v9-pro',
  unknownModelKind: 'misconfigured',
  // Kling documents no Retry-After; an edge in front of it might send one, and it is honoured.
  rateLimitNext: (route, seconds) => fake.rateLimitNext(ROUTES[route], seconds, { retryAfter: true }),
  serverErrorNext: (route) => fake.serverErrorNext(ROUTES[route]),
  expireOutput: (jobId) => fake.expire(taskOf(jobId)!.taskId),
  receivedFirstFrame: (jobId) => {
    const task = taskOf(jobId);
    const image = task?.image ?? task?.imageList.find((i) => i.type === 'first_frame');
    return image && { mimeType: image.mimeType!, width: image.width!, height: image.height! };
  },
  framesKeepTheirSize: true,
  jobCount: () => fake.tasks.size,
}));

describe('kling JWT', () => {
  it('signs HS256 with iss = access key, exp 30 min ahead, nbf 5 s back, and the fake accepts it', async () => {
    const tokens = new KlingTokens();
    const before = Math.floor(Date.now() / 1000);
    const token = await tokens.token(account());
    const [header, payload] = token.split('.').slice(0, 2).map((p) => JSON.parse(Buffer.from(p!, 'base64url').toString()) as Record<string, unknown>);
    expect(header).toEqual({ alg: 'HS256', typ: 'JWT' });
    expect(payload).toEqual({ iss: 'ak-conformance', exp: expect.any(Number), nbf: expect.any(Number) });
    expect(payload!.exp as number).toBeGreaterThanOrEqual(before + 1800);
    expect(payload!.nbf as number).toBeLessThanOrEqual(before - 4);
    const res = await fetch(`${fake.url}/v1/videos/text2video?pageNum=1&pageSize=1`, { headers: { Authorization: `Bearer ${token}` } });
    expect(((await res.json()) as { code: number }).code).toBe(0);
  });

  it('reuses a member\'s token until it nears expiry, then signs a new one; a new secret signs at once', async () => {
    let now = Date.parse('2026-11-20T10:00:00Z');
    const tokens = new KlingTokens({ ttlSeconds: 600, renewBeforeSeconds: 60, now: () => now });
    const first = await tokens.token(account());
    now += 500_000; // 100 s left
    expect(await tokens.token(account())).toBe(first);
    now += 45_000; // 55 s left: renewed
    const second = await tokens.token(account());
    expect(second).not.toBe(first);
    expect(await tokens.token(account())).toBe(second);
    expect(await tokens.token(account({ secret_key: 'sk-rotated' }))).not.toBe(second);
    // Another member (another access key) has its own token.
    expect(await tokens.token(account({ access_key: 'ak-other', secret_key: 'sk-other-secret' }))).not.toBe(second);
  });

  it('is refused by the fake when expired (1004), not yet valid (1003), wrongly signed or malformed (1002), unknown (1000) or missing (1001)', async () => {
    const secret = new TextEncoder().encode('sk-conformance-secret');
    const now = Math.floor(Date.now() / 1000);
    const signed = (claims: { exp?: number; nbf?: number; iss?: string }, key = secret, alg = 'HS256') => {
      let jwt = new SignJWT({}).setProtectedHeader({ alg, typ: 'JWT' }).setIssuer(claims.iss ?? 'ak-conformance');
      if (claims.exp !== undefined) jwt = jwt.setExpirationTime(claims.exp);
      if (claims.nbf !== undefined) jwt = jwt.setNotBefore(claims.nbf);
      return jwt.sign(key);
    };
    const answer = async (authorization?: string) => {
      const res = await fetch(`${fake.url}/v1/videos/text2video/123`, { headers: authorization === undefined ? {} : { Authorization: authorization } });
      return [res.status, ((await res.json()) as { code: number }).code];
    };
    expect(await answer(`Bearer ${await signed({ exp: now - 10, nbf: now - 100 })}`)).toEqual([401, 1004]);
    expect(await answer(`Bearer ${await signed({ exp: now + 600, nbf: now + 60 })}`)).toEqual([401, 1003]);
    expect(await answer(`Bearer ${await signed({ exp: now + 600, nbf: now - 5 }, new TextEncoder().encode('another-secret'))}`)).toEqual([401, 1002]);
    expect(await answer(`Bearer ${await signed({ exp: now + 600, nbf: now - 5 }, new TextEncoder().encode('sk-conformance-secret'), 'HS512')}`)).toEqual([401, 1002]);
    expect(await answer(`Bearer ${await signed({ nbf: now - 5 })}`)).toEqual([401, 1002]);
    expect(await answer('Bearer not.a.jwt')).toEqual([401, 1002]);
    expect(await answer(`Bearer ${await signed({ exp: now + 600, iss: 'ak-unknown' })}`)).toEqual([401, 1000]);
    expect(await answer()).toEqual([401, 1001]);
    // A valid token of the same account still passes (and the task is simply not there).
    expect(await answer(`Bearer ${await signed({ exp: now + 600, nbf: now - 5 })}`)).toEqual([404, 1203]);
  });

  it('signs a new token and asks once more when Kling says the token expired (its clock ahead of ours)', async () => {
    // A clock two hours behind: the token Kling gets has expired for it.
    const late = new KlingTokens({ now: () => Date.now() - 2 * 3600_000 });
    let calls = 0;
    const skewed = { token: async (a: UpstreamAccount) => (calls++ === 0 ? late.token(a) : new KlingTokens().token(a)), forget: () => undefined } as unknown as KlingTokens;
    const provider = new KlingVideoProvider({ tokens: skewed });
    const refusals = fake.authRefusals.length;
    const since = fake.requests.length;
    const jobId = await provider.submit(account(), job(), never);
    expect(jobId).toMatch(/^text2video\//);
    expect(fake.authRefusals.slice(refusals).map((r) => r.code)).toEqual([1004]);
    // One token per request: the refused one, then a new one for it and every call after.
    expect(calls).toBe(fake.requests.length - since);
  });

  it('names no token and no key in an auth error', async () => {
    const err = await providerErrorOf(new KlingVideoProvider().submit(account({ access_key: 'ak-nobody-knows', secret_key: 'sk-nobody-knows' }), job(), never));
    expect([err.kind, err.upstreamCode]).toEqual(['auth', '1000']);
    expect(err.message).not.toMatch(/ak-nobody|sk-nobody|Bearer \S{20}/);
  });
});

describe('kling envelope and codes', () => {
  const provider = new KlingVideoProvider();
  it.each([
    [1102, 'account_disabled'],
    [1101, 'account_disabled'],
    [1100, 'account_disabled'],
    [1103, 'model_not_open'],
    [1302, 'rate_limited'],
    [1303, 'rate_limited'],
    [1301, 'policy'],
    [1300, 'policy'],
    [1201, 'invalid_request'],
    [1203, 'misconfigured'],
    [5001, 'retryable'],
  ])('classifies code %i by the code, also at HTTP 200 (%s)', async (code, kind) => {
    for (const status of [undefined, 200]) {
      fake.errorNext('submit', code, { status });
      const err = await providerErrorOf(provider.submit(account(), job({ prompt: `code ${code}` }), never));
      expect([err.kind, err.upstreamCode]).toEqual([kind, String(code)]);
    }
  });

  it('reads code 0 as success whatever the HTTP status, and an answer without the envelope by its status', async () => {
    fake.faults.push('submit', { status: 202, body: { code: 0, message: 'SUCCEED', request_id: 'r', data: { task_id: 'from-a-202', task_status: 'submitted' } } });
    expect(await provider.submit(account(), job(), never)).toBe('text2video/from-a-202');
    fake.faults.push('submit', { status: 502, body: '<html>bad gateway</html>' });
    expect((await providerErrorOf(provider.submit(account(), job(), never))).kind).toBe('retryable');
  });

  it('waits as long as a Retry-After says on 1302, and leaves the wait to the pool without one (as Kling documents it)', async () => {
    fake.rateLimitNext('submit', 4, { retryAfter: true });
    expect((await providerErrorOf(provider.submit(account(), job(), never))).retryAfterMs).toBe(4000);
    fake.rateLimitNext('submit', 4);
    const bare = await providerErrorOf(provider.submit(account(), job(), never));
    expect([bare.kind, bare.retryAfterMs]).toEqual(['rate_limited', undefined]);
  });

  it('says why an account is out: a used-up resource pack', async () => {
    fake.setResourcePack('ak-other', 'exhausted');
    try {
      const err = await providerErrorOf(provider.submit(account({ access_key: 'ak-other', secret_key: 'sk-other-secret' }), job(), never));
      expect(err.kind).toBe('account_disabled');
      expect(err.message).toMatch(/resource pack is used up or expired \(Kling 1102/);
    } finally {
      fake.setResourcePack('ak-other', 'ok');
    }
  });
});

describe('kling wire format', () => {
  const provider = new KlingVideoProvider();
  const frame = (w = 640, h = 360) => noiseFrame(w, h);

  it('maps the model id convention: a trailing -std or -pro is the mode, anything else is the model name', () => {
    expect(klingModel('kling-v3-pro')).toEqual({ name: 'kling-v3', mode: 'pro' });
    expect(klingModel('kling-v2-5-turbo-std')).toEqual({ name: 'kling-v2-5-turbo', mode: 'std' });
    expect(klingModel('kling-v2-1-master')).toEqual({ name: 'kling-v2-1-master' });
    expect(klingModel('kling-v3-omni-pro')).toEqual({ name: 'kling-v3-omni', mode: 'pro' });
  });

  it('chooses the endpoint by the job: omni models always omni-video, else reference images, a first frame or text', () => {
    const shape = (o: Partial<{ hasFirstFrame: boolean; referenceImages: number }>) => ({ hasFirstFrame: false, referenceImages: 0, ...o });
    expect(endpointOf('kling-v3-omni-pro', shape({}))).toBe('omni-video');
    expect(endpointOf('kling-video-o1', shape({ hasFirstFrame: true }))).toBe('omni-video');
    expect(endpointOf('kling-v1-6-pro', shape({ referenceImages: 2 }))).toBe('multi-image2video');
    expect(endpointOf('kling-v3-std', shape({ hasFirstFrame: true }))).toBe('image2video');
    expect(endpointOf('kling-v3-std', shape({}))).toBe('text2video');
  });

  it('text2video: string duration, aspect ratio, mode, negative prompt, sound and the task id as external_task_id', async () => {
    const j = job({ model: 'kling-v3-pro', durationSeconds: 12, aspectRatio: '9:16', resolution: '1080p', negativePrompt: 'blur', generateAudio: true });
    const jobId = await provider.submit(account(), j, never);
    expect(taskOf(jobId)!.body).toEqual({ model_name: 'kling-v3', prompt: j.prompt, negative_prompt: 'blur', mode: 'pro', duration: '12', aspect_ratio: '9:16', sound: 'on', external_task_id: j.taskId });
  });

  it('image2video: the frames as raw base64 (no data: prefix), no aspect ratio, no mode for a model without one', async () => {
    const j = job({ model: 'kling-v2-1-master', durationSeconds: 10, firstFrame: await frame(), lastFrame: undefined });
    const jobId = await provider.submit(account(), j, never);
    const task = taskOf(jobId)!;
    expect(jobId).toMatch(/^image2video\//);
    expect(task.body).not.toHaveProperty('aspect_ratio');
    expect(task.body).not.toHaveProperty('mode');
    expect(task.image).toEqual({ form: 'base64', mimeType: 'image/png', width: 640, height: 360, bytes: expect.any(Number) });
    const raw = fake.requests.findLast((r) => r.path === '/v1/videos/image2video')!.json as { image: string };
    expect(raw.image.startsWith('iVBOR')).toBe(true);

    const tail = await provider.submit(account(), job({ model: 'kling-v2-5-turbo-pro', firstFrame: await frame(), lastFrame: await frame(480, 480) }), never);
    expect(taskOf(tail)!.imageTail).toMatchObject({ mimeType: 'image/png', width: 480, height: 480 });
  });

  it('converts a WebP frame to PNG (Kling takes JPEG and PNG) and refuses a frame Kling cannot take before any call', async () => {
    const webp = await sharp({ create: { width: 400, height: 400, channels: 3, background: '#336699' } }).webp().toBuffer();
    const jobId = await provider.submit(account(), job({ firstFrame: mediaInputOf(webp, 'image/webp', 400, 400) }), never);
    expect(taskOf(jobId)!.image).toMatchObject({ mimeType: 'image/png', width: 400, height: 400 });
    const before = fake.counts.submit;
    const small = await providerErrorOf(provider.submit(account(), job({ firstFrame: await frame(200, 200) }), never));
    expect([small.kind, small.message]).toEqual(['invalid_request', expect.stringContaining('at least 300 px')]);
    const thin = await providerErrorOf(provider.submit(account(), job({ firstFrame: await frame(900, 300) }), never));
    expect(thin.message).toContain('1:2.5 and 2.5:1');
    expect(fake.counts.submit).toBe(before);
  });

  it('multi-image2video: up to 4 reference images as image_list[].image with the aspect ratio', async () => {
    const refs = await Promise.all([frame(), frame(400, 400), frame(360, 640)]);
    const jobId = await provider.submit(account(), job({ model: 'kling-v1-6-pro', durationSeconds: 10, aspectRatio: '1:1', referenceImages: refs }), never);
    const task = taskOf(jobId)!;
    expect(jobId).toMatch(/^multi-image2video\//);
    expect(task).toMatchObject({ modelName: 'kling-v1-6', mode: 'pro', duration: '10', aspectRatio: '1:1' });
    expect(task.imageList.map((i) => [i.width, i.height])).toEqual([[640, 360], [400, 400], [360, 640]]);
  });

  it('omni-video: frames as image_list types, references as plain items, no aspect ratio with a first frame, the negative prompt inside the prompt', async () => {
    const framed = await provider.submit(account(), job({ model: 'kling-v3-omni-pro', durationSeconds: 15, firstFrame: await frame(), lastFrame: await frame(), negativePrompt: 'text overlays', generateAudio: true }), never);
    const task = taskOf(framed)!;
    expect(framed).toMatch(/^omni-video\//);
    expect(task.imageList.map((i) => i.type)).toEqual(['first_frame', 'end_frame']);
    expect(task.body).not.toHaveProperty('aspect_ratio');
    expect(task.body).not.toHaveProperty('negative_prompt');
    expect(task).toMatchObject({ sound: 'on', mode: 'pro', duration: '15', prompt: 'a paper boat on a river\n\nAvoid: text overlays' });

    const refs = await provider.submit(account(), job({ model: 'kling-v3-omni-std', referenceImages: await Promise.all([frame(), frame(), frame()]) }), never);
    expect(taskOf(refs)!.imageList.map((i) => i.type)).toEqual([undefined, undefined, undefined]);
    expect(taskOf(refs)!).toMatchObject({ aspectRatio: '16:9', sound: 'off', mode: 'std' });
  });

  it('refuses before any call what Kling 2.6 cannot render: a last frame with audio', async () => {
    const before = fake.counts.submit;
    const err = await providerErrorOf(provider.submit(account(), job({ model: 'kling-v2-6-pro', firstFrame: await frame(), lastFrame: await frame(), generateAudio: true }), never));
    expect([err.kind, fake.counts.submit]).toEqual(['invalid_request', before]);
  });

  it('check: what no Kling model takes', () => {
    const base = shapeOf(job());
    expect(provider.check(base)).toBeUndefined();
    expect(provider.check({ ...base, durationSeconds: 16 })).toContain('3 to 15 seconds');
    expect(provider.check({ ...base, aspectRatio: '4:3' })).toContain('16:9, 9:16, 1:1');
    expect(provider.check({ ...base, resolution: '4k' })).toContain('720p and 1080p');
    expect(provider.check({ ...base, referenceImages: 8 })).toContain('at most 7');
    expect(provider.check({ ...base, referenceVideos: 1 })).toContain('no reference videos');
  });

  it('omni-video: the negative prompt is shortened at a separator, or left out, to keep the prompt within Kling\'s 2,500 characters; the client\'s prompt is never cut', async () => {
    const prompt = 'a'.repeat(2000);
    const negative = Array.from({ length: 100 }, (_, i) => `blur${i}`).join(', ');
    const jobId = await provider.submit(account(), job({ model: 'kling-v3-omni-std', prompt, negativePrompt: negative }), never);
    const sent = taskOf(jobId)!.prompt;
    expect(sent.length).toBeLessThanOrEqual(2500);
    expect(sent.startsWith(`${prompt}\n\nAvoid: blur0, blur1, `)).toBe(true);
    // Cut between two items, never inside one.
    const kept = sent.slice(`${prompt}\n\nAvoid: `.length).split(', ');
    expect(kept).toEqual(negative.split(', ').slice(0, kept.length));
    // No room left for any of it: the prompt alone.
    const full = await provider.submit(account(), job({ model: 'kling-v3-omni-std', prompt: 'b'.repeat(2495), negativePrompt: 'blur' }), never);
    expect(taskOf(full)!.prompt).toBe('b'.repeat(2495));
    // A prompt over Kling's limit is the client's and is never cut: refused before any call (at
    // creation the same check answers unsupported_by_upstream, before any charge).
    const submits = fake.counts.submit;
    const over = await providerErrorOf(provider.submit(account(), job({ model: 'kling-v3-omni-std', prompt: 'c'.repeat(2501), negativePrompt: 'blur' }), never));
    expect([over.kind, over.message, over.maybeAccepted]).toEqual(['invalid_request', 'Kling accepts prompts of at most 2500 characters', false]);
    expect(fake.counts.submit).toBe(submits);
  });

  it('a poll that finds no such task any more fails the job', async () => {
    const status = await provider.poll(account(), 'text2video/does-not-exist', job(), never);
    expect(status.state).toBe('failed');
  });

  it('the fake refuses what Kling refuses: integer durations, a data: prefix, aspect_ratio on image2video', async () => {
    const token = await new KlingTokens().token(account());
    const post = async (path: string, body: unknown) => {
      const res = await fetch(`${fake.url}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
      return { status: res.status, ...((await res.json()) as { code: number; message: string }) };
    };
    const png = (await sharp({ create: { width: 320, height: 320, channels: 3, background: '#000' } }).png().toBuffer()).toString('base64');
    expect(await post('/v1/videos/text2video', { model_name: 'kling-v3', prompt: 'x', duration: 5 })).toMatchObject({ status: 400, code: 1201, message: 'duration must be a string' });
    expect(await post('/v1/videos/image2video', { model_name: 'kling-v3', image: `data:image/png;base64,${png}` })).toMatchObject({ status: 400, code: 1201 });
    expect(await post('/v1/videos/image2video', { model_name: 'kling-v3', image: png, aspect_ratio: '16:9' })).toMatchObject({ status: 400, code: 1201 });
    expect(await post('/v1/videos/image2video', { model_name: 'kling-v3', image: png })).toMatchObject({ status: 200, code: 0 });
    // Prompts of at most 2,500 characters (text-to-video.md, omni-video-o1.md).
    expect(await post('/v1/videos/omni-video', { model_name: 'kling-v3-omni', prompt: 'x'.repeat(2501), aspect_ratio: '16:9' })).toMatchObject({ status: 400, code: 1201 });
    expect(await post('/v1/videos/text2video', { model_name: 'kling-v3', prompt: 'x', negative_prompt: 'x'.repeat(2501) })).toMatchObject({ status: 400, code: 1201 });
    expect(await post('/v1/videos/omni-video', { model_name: 'kling-v3-omni', prompt: 'x'.repeat(2500), aspect_ratio: '16:9' })).toMatchObject({ status: 200, code: 0 });
  });
});

describe('kling resubmit after a lost answer (external_task_id taken)', () => {
  const provider = new KlingVideoProvider();

  it('a lookup that is rate-limited, fails (5xx) or gets no answer is thrown as transient, never as a refusal, and nothing is created; the next resubmit finds the task', async () => {
    const j = job();
    const first = await provider.submit(account(), j, never);
    const again = { ...j, resubmit: true };
    fake.rateLimitNext('poll', 2, { retryAfter: true });
    const limited = await providerErrorOf(provider.submit(account(), again, never));
    expect([limited.kind, limited.retryAfterMs]).toEqual(['rate_limited', 2000]);
    fake.serverErrorNext('poll', 503);
    const down = await providerErrorOf(provider.submit(account(), again, never));
    expect([down.kind, down.upstreamCode]).toEqual(['retryable', '5001']);
    fake.faults.push('poll', { destroy: true });
    const lost = await providerErrorOf(provider.submit(account(), again, never));
    expect(lost.kind).toBe('retryable');
    expect(fake.requests.filter((r) => r.method === 'POST' && (r.json as { external_task_id?: string }).external_task_id === j.taskId)).toHaveLength(1);
    expect(await provider.submit(account(), again, never)).toBe(first);
    expect([...fake.tasks.values()].filter((t) => t.externalTaskId === j.taskId)).toHaveLength(1);
  });

  it('a task that already failed risk control (the lookup answers 1301 with the task) is taken: its poll fails it as policy', async () => {
    const j = job({ prompt: 'kling-risk at the river' });
    const first = await provider.submit(account(), j, never);
    await until(async () => (await provider.poll(account(), first, j, never)).state === 'failed', 5_000, 'the risk-control failure');
    expect(await provider.submit(account(), j, never)).toBe(first);
    const status = await provider.poll(account(), first, j, never);
    expect(status.state === 'failed' && [status.error.kind, status.error.upstreamCode]).toEqual(['policy', '1301']);
  });
});
