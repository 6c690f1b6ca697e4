/**
 * The `fal` and `replicate` adapters through the public API (issue 31) against the fake fal queue
 * (test/fakes/fal.ts) and the fake Replicate API (test/fakes/replicate.ts): the shipped definitions
 * created through the admin API as `models create --from` creates them, members added through it.
 * Each shipped mapping runs once and the fake checks the input names it received; media inputs go
 * as signed Mediagate URLs the fakes really download, or as data URLs once the mapping says so;
 * failures, canceled and aborted predictions fail and refund; a 422 is said in full in member
 * health and generically to the client, unless fal says it refused the client's own media, which
 * the client is told in fal's words; a 429's Retry-After cools the member; a task failed by its
 * deadline is cancelled upstream; expiring output links are fetched at once or fail the task; a
 * model without a mapping is the member's misconfiguration.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { startFalFake, type FalFake, type FalJob } from '../fakes/fal.ts';
import { startReplicateFake, type FakePrediction, type ReplicateFake } from '../fakes/replicate.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { noisePng } from '../support/noise-png.ts';
import { holdOf, until, waitVideoFinished } from '../support/tasks.ts';

const FAL_MODELS = ['kling-v2.1-pro-fal', 'wan-2.5-t2v-fal', 'flux-dev-fal', 'seedream-4-fal'];
const REPLICATE_MODELS = ['kling-v2.1-replicate', 'flux-schnell-replicate', 'ideogram-v3-turbo-replicate'];

let server: TestServer;
let fal: FalFake;
let replicate: ReplicateFake;
let seq = 0;

const never = (prompt: string) => (prompt.includes('[forever]') ? ('never' as const) : undefined);
const LIFETIME_S = 3 * 3600;

beforeAll(async () => {
  fal = await startFalFake({ apiKeys: ['fal-a:secret', 'fal-b:secret'], queueMs: 50, jobDurationMs: 200, durationFor: never });
  replicate = await startReplicateFake({ tokens: ['r8_a', 'r8_b'], queueMs: 50, jobDurationMs: 200, durationFor: never });
  // A lifetime above the hour an input's signed URL had at least: its jobs carry it (start timeout, Cancel-After, URLs).
  server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000', TASK_MAX_LIFETIME_SECONDS: String(LIFETIME_S) } });
  for (const id of [...FAL_MODELS.map((m) => `fal/${m}`), ...REPLICATE_MODELS.map((m) => `replicate/${m}`)]) {
    const { response } = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(id)!.model });
    expect(response.status, id).toBe(201);
  }
});
afterAll(async () => {
  await server?.close();
  await fal?.close();
  await replicate?.close();
});
beforeEach(() => {
  fal.faults.clear();
  replicate.faults.clear();
  fal.urlTtlMs = replicate.urlTtlMs = 3_600_000;
});

type Json = Record<string, any>;
type Member = { name: string; provider: 'fal' | 'replicate'; secret: string; priority?: number; models?: string[] };

async function customer(members: Member[]) {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const ids: Record<string, string> = {};
  for (const m of members) {
    const { data, response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: {
        name: m.name,
        provider: m.provider,
        base_url: m.provider === 'fal' ? fal.url : replicate.baseUrl,
        credentials: m.provider === 'fal' ? { api_key: m.secret } : { api_token: m.secret },
        models: m.models ?? (m.provider === 'fal' ? FAL_MODELS : REPLICATE_MODELS),
        priority: m.priority ?? 0,
      },
    });
    expect(response.status).toBe(201);
    ids[m.name] = data!.id;
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, groupId: group.id, key: key.key, ids };
}

const falCustomer = () => customer([{ name: 'a', provider: 'fal', secret: 'fal-a:secret' }]);
const replicateCustomer = () => customer([{ name: 'a', provider: 'replicate', secret: 'r8_a' }]);

async function post(key: string, path: string, body: Json) {
  const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Json, taskId: res.headers.get('x-task-id') };
}

const createVideo = (key: string, body: Json) => post(key, '/v1/videos/generations', { client_request_id: `agg-${Date.now()}-${++seq}`, prompt: 'a paper boat on a river', seconds: 5, aspectRatio: '16:9', ...body });
const frame = async (w = 640, h = 360) => `data:image/png;base64,${(await sharp({ create: { width: w, height: h, channels: 3, background: { r: (w * 7) % 256, g: 90, b: 160 } } }).png().toBuffer()).toString('base64')}`;
const micro = (credits: number) => Math.round(credits * 1_000_000);

async function upstreamJobId(taskId: string): Promise<string> {
  const row = await until(async () => {
    const r = await server.db.selectFrom('videoTasks').select(['upstreamJobId']).where('id', '=', taskId).executeTakeFirstOrThrow();
    return r.upstreamJobId ?? undefined;
  }, 10_000, 'the upstream job id');
  return row;
}
const falJobOf = async (taskId: string): Promise<FalJob> => fal.jobs.get((await upstreamJobId(taskId)).split('/').at(-1)!)!;
const predictionOf = async (taskId: string): Promise<FakePrediction> => replicate.predictions.get(await upstreamJobId(taskId))!;

async function healthOf(groupId: string) {
  const { data } = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } } });
  return Object.fromEntries(data!.data.map((m) => [m.name, m.health]));
}

async function imageMeta(b64: string) {
  const meta = await sharp(Buffer.from(b64, 'base64')).metadata();
  return { width: meta.width, height: meta.height, format: meta.format };
}

describe('fal through the public API', () => {
  it('Kling 2.1 Pro: the frames as signed Mediagate URLs fal downloads, fal\'s input names, status under owner/app only, the video downloaded without the key', async () => {
    const c = await falCustomer();
    const created = await createVideo(c.key, { model: 'kling-v2.1-pro-fal', resolution: '1080p', firstFrame: await frame(), lastFrame: await frame(480, 480), negative_prompt: 'blur' });
    expect(created.status, JSON.stringify(created.body)).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    const job = await falJobOf(created.body.id);
    expect(job.endpoint).toBe('fal-ai/kling-video/v2.1/pro/image-to-video');
    expect(Object.keys(job.input).sort()).toEqual(['duration', 'image_url', 'negative_prompt', 'prompt', 'tail_image_url']);
    expect(job.input).toMatchObject({ prompt: 'a paper boat on a river', duration: '5', negative_prompt: 'blur' });
    expect(job.media.map((m) => `${m.field} ${m.form} ${m.mimeType} ${m.width}x${m.height}`)).toEqual(['image_url url image/png 640x360', 'tail_image_url url image/png 480x480']);
    const polls = fal.requests.filter((r) => r.path.includes(`/requests/${job.id}`));
    expect(new Set(polls.map((r) => r.path))).toEqual(new Set([`/fal-ai/kling-video/requests/${job.id}/status`, `/fal-ai/kling-video/requests/${job.id}`]));
    expect(polls.every((r) => r.headers.authorization === 'Key fal-a:secret')).toBe(true);
    expect([job.downloads, fal.cdnSawAuth]).toEqual([1, 0]);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 5 * micro(0.098) });
  });

  it('Wan 2.5: durations as fal\'s strings, ratio and resolution as they are, prompt expansion off', async () => {
    const c = await falCustomer();
    const created = await createVideo(c.key, { model: 'wan-2.5-t2v-fal', seconds: 10, aspectRatio: '9:16', resolution: '480p' });
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await falJobOf(created.body.id)).input).toEqual({ prompt: 'a paper boat on a river', duration: '10', aspect_ratio: '9:16', resolution: '480p', enable_prompt_expansion: false });
  });

  it('refuses, before any call and refunded, what the mapping refuses ($error): Kling image-to-video without a frame', async () => {
    const c = await falCustomer();
    const before = fal.counts.submit;
    const created = await createVideo(c.key, { model: 'kling-v2.1-pro-fal', resolution: '1080p' });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error?.code, task.error?.message]).toEqual(['failed', 'upstream_rejected', 'Kling 2.1 Pro makes videos from a first frame only; send firstFrame.']);
    expect(fal.counts.submit).toBe(before);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('FLUX dev and Seedream 4: the table\'s size as image_size, n in one request, the promised size and format delivered, charged per image', async () => {
    const c = await falCustomer();
    const flux = await post(c.key, '/v1/images/generations', { model: 'flux-dev-fal', prompt: 'a lighthouse at dusk', n: 2, aspectRatio: '16:9', resolution: '1K', output_format: 'png' });
    expect(flux.status, JSON.stringify(flux.body)).toBe(200);
    expect(flux.body.data).toHaveLength(2);
    for (const d of flux.body.data) expect(await imageMeta(d.b64_json)).toEqual({ width: 1248, height: 704, format: 'png' });
    expect(fal.submitsTo('fal-ai/flux/dev').at(-1)!.input).toEqual({ prompt: 'a lighthouse at dusk', image_size: { width: 1248, height: 704 }, num_images: 2, output_format: 'png', enable_safety_checker: true });
    expect(await holdOf(server.db, flux.taskId!)).toMatchObject({ status: 'captured', captured: 2 * micro(0.04) });

    const seedream = await post(c.key, '/v1/images/generations', { model: 'seedream-4-fal', prompt: 'a harbour', aspectRatio: '4:3', resolution: '2K', output_format: 'jpeg' });
    expect(seedream.status, JSON.stringify(seedream.body)).toBe(200);
    expect(await imageMeta(seedream.body.data[0].b64_json)).toEqual({ width: 2048, height: 1536, format: 'jpeg' });
    expect(fal.submitsTo('fal-ai/bytedance/seedream/v4/text-to-image').at(-1)!.input).toEqual({ prompt: 'a harbour', image_size: { width: 2048, height: 1536 }, num_images: 1, enable_safety_checker: true });
  });

  it('sends a prompt that spells a media token to fal as it is, and faults no member for the model', async () => {
    const c = await customer([
      { name: 'a', provider: 'fal', secret: 'fal-a:secret', priority: 10 },
      { name: 'b', provider: 'fal', secret: 'fal-b:secret' },
    ]);
    const prompt = 'mediagate-media-input:0';
    const image = await post(c.key, '/v1/images/generations', { model: 'flux-dev-fal', prompt });
    expect(image.status, JSON.stringify(image.body)).toBe(200);
    expect(fal.submitsTo('fal-ai/flux/dev').at(-1)!).toMatchObject({ apiKey: 'fal-a:secret', input: { prompt } });
    const video = await createVideo(c.key, { model: 'wan-2.5-t2v-fal', resolution: '720p', prompt: `mediagate-media-input:${'0'.repeat(24)}:0` });
    expect((await waitVideoFinished(server, c.key, video.body.id)).task.status).toBe('completed');
    expect((await falJobOf(video.body.id)).input.prompt).toBe(`mediagate-media-input:${'0'.repeat(24)}:0`);
    const health = await healthOf(c.groupId);
    expect([health.a!.model_faults, health.b!.model_faults]).toEqual([[], []]);
  });

  it('completes an image whose prompt starts like a data URL, which fal\'s result echoes: one request, billed once', async () => {
    const c = await falCustomer();
    for (const prompt of ['data:image/png;base64,A', 'data:text/plain;base64,a lighthouse at dusk']) {
      const before = fal.submitsTo('fal-ai/flux/dev').length;
      const res = await post(c.key, '/v1/images/generations', { model: 'flux-dev-fal', prompt });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      expect(res.body.data).toHaveLength(1);
      const jobs = fal.submitsTo('fal-ai/flux/dev').slice(before);
      expect(jobs.map((j) => j.input.prompt)).toEqual([prompt]);
      // The fake's flux/dev result carries the prompt back, as fal's does.
      expect((jobs[0]!.outcome as { output: Json }).output.prompt).toBe(prompt);
      expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: micro(0.04) });
    }
  });

  it('collects the same fal request through a 503 of its status check: one submit on one member, billed once', async () => {
    const c = await customer([
      { name: 'a', provider: 'fal', secret: 'fal-a:secret', priority: 10 },
      { name: 'b', provider: 'fal', secret: 'fal-b:secret' },
    ]);
    const before = fal.submitsTo('fal-ai/flux/dev').length;
    fal.serverErrorNext('status', 1);
    const res = await post(c.key, '/v1/images/generations', { model: 'flux-dev-fal', prompt: 'a lighthouse' });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const jobs = fal.submitsTo('fal-ai/flux/dev').slice(before);
    expect(jobs.map((j) => [j.apiKey, j.cancelled])).toEqual([['fal-a:secret', false]]);
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'captured', captured: micro(0.04) });
  });

  it('fails a request fal\'s runner failed, and one its content checker refused, refunded', async () => {
    const c = await falCustomer();
    const failed = await createVideo(c.key, { model: 'wan-2.5-t2v-fal', resolution: '720p', prompt: 'a storm [fal:fail]' });
    const a = (await waitVideoFinished(server, c.key, failed.body.id)).task;
    expect([a.status, a.error?.code, a.error?.message]).toEqual(['failed', 'upstream_error', expect.stringContaining('runner_disconnected')]);
    const refused = await post(c.key, '/v1/images/generations', { model: 'flux-dev-fal', prompt: 'a storm [fal:nsfw]' });
    expect([refused.status, refused.body.error.code]).toEqual([400, 'content_policy_violation']);
    for (const id of [failed.body.id, refused.taskId!]) expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('fails a video fal\'s model failed (500 internal_server_error) at once with fal\'s reason, not at its deadline; refunded, no member fault', async () => {
    const c = await falCustomer();
    const created = await createVideo(c.key, { model: 'wan-2.5-t2v-fal', resolution: '720p', prompt: 'a storm [fal:model-error]' });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error?.code, task.error?.message]).toEqual(['failed', 'upstream_error', 'The fal request failed (internal_server_error: Internal server error).']);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
    expect((await healthOf(c.groupId)).a!.model_faults).toEqual([]);
  });

  it('sends a video request what is left of its task\'s lifetime as fal\'s start timeout, its frame signed as long', async () => {
    const c = await falCustomer();
    const created = await createVideo(c.key, { model: 'kling-v2.1-pro-fal', resolution: '1080p', firstFrame: await frame() });
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    const job = await falJobOf(created.body.id);
    const { deadlineAt } = await server.db.selectFrom('videoTasks').select(['deadlineAt']).where('id', '=', created.body.id).executeTakeFirstOrThrow();
    const submit = fal.requests.find((r) => r.method === 'POST' && (r.json as Json | undefined)?.image_url === job.input.image_url)!;
    const left = (deadlineAt.getTime() - submit.receivedAt) / 1000;
    expect(Number(submit.headers['x-fal-request-timeout'])).toBeCloseTo(left, -1);
    expect(left).toBeGreaterThan(LIFETIME_S - 60);
    // fal fetches the frame when a runner starts the request: until the deadline at the latest.
    const expires = Number(new URL(job.input.image_url as string).searchParams.get('expires'));
    expect(expires).toBeGreaterThanOrEqual(Math.floor(deadlineAt.getTime() / 1000));
  });

  it('says a 422 detail list in full in member health, and only a generic error to the client; refunded', async () => {
    // An operator's own model whose mapping sends Wan's duration as a number, which fal refuses.
    const body = { ...findCatalogDefinition('fal/wan-2.5-t2v-fal')!.model, id: 'wan-bad-mapping-fal', upstream_mappings: { fal: { endpoint: 'fal-ai/wan-25-preview/text-to-video', input: '{"prompt": prompt, "duration": duration}', output: 'video.url' } } };
    expect((await server.admin().POST('/admin/v1/models', { body })).response.status).toBe(201);
    const c = await customer([{ name: 'a', provider: 'fal', secret: 'fal-a:secret', models: ['wan-bad-mapping-fal'] }]);
    const created = await createVideo(c.key, { model: 'wan-bad-mapping-fal', resolution: '720p' });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error?.code, task.error?.message]).toEqual(['failed', 'upstream_error', 'The upstream account that serves this request is misconfigured; the operator can see why in the pool member\'s health.']);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
    const health = (await healthOf(c.groupId)).a!;
    expect(health.last_error).toBe("fal refused the input that the mapping made for fal-ai/wan-25-preview/text-to-video (HTTP 422: duration: value is not a valid enumeration member; permitted: '5', '10')");
  });

  it('fails a video whose first frame fal refuses as too small (422 image_too_small) as the client\'s request, in fal\'s words; no member failure, refunded', async () => {
    const c = await falCustomer();
    const created = await createVideo(c.key, { model: 'kling-v2.1-pro-fal', resolution: '1080p', aspectRatio: '1:1', firstFrame: await frame(120, 120) });
    expect(created.status, JSON.stringify(created.body)).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error?.code, task.error?.message]).toEqual(['failed', 'upstream_rejected', 'Image dimensions are too small. Minimum dimensions are 300x300 pixels.']);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
    expect((await falJobOf(created.body.id)).outcome).toMatchObject({ ok: false, status: 422, detail: [{ loc: ['body', 'image_url'], type: 'image_too_small', url: 'https://docs.fal.ai/errors/#image_too_small', ctx: { min_height: 300, min_width: 300 } }] });
    const health = (await healthOf(c.groupId)).a!;
    expect([health.last_error, health.model_faults]).toEqual([null, []]);
  });

  it('answers an image edit whose input fal refuses as too large (422 file_too_large) as the client\'s 400, in fal\'s words; one submit, no model fault on the member', async () => {
    // An operator's own model: Seedream 4's edit endpoint on fal, which takes input images of up to 10 MB.
    const seedream = findCatalogDefinition('fal/seedream-4-fal')!.model;
    const body = {
      ...seedream,
      id: 'seedream-4-edit-fal',
      image: { ...seedream.image!, edits: true },
      upstream_mappings: { fal: { endpoint: 'fal-ai/bytedance/seedream/v4/edit', input: '{"prompt": prompt, "image_urls": images, "image_size": {"width": width, "height": height}, "num_images": n}', output: 'images.url' } },
    };
    expect((await server.admin().POST('/admin/v1/models', { body })).response.status).toBe(201);
    const c = await customer([{ name: 'a', provider: 'fal', secret: 'fal-a:secret', models: ['seedream-4-edit-fal'] }]);
    const before = fal.submitsTo('fal-ai/bytedance/seedream/v4/edit').length;
    const photo = await noisePng(2000, 2000, 3);
    expect(photo.length).toBeGreaterThan(10 * 1024 * 1024);
    const res = await post(c.key, '/v1/images/edits', { model: 'seedream-4-edit-fal', prompt: 'add a boat', size: '2048x2048', images: [`data:image/png;base64,${photo.toString('base64')}`] });
    expect([res.status, res.body.error?.code, res.body.error?.message]).toEqual([400, 'upstream_rejected', `The upstream rejected the request: File too large. Maximum size is 10485760 bytes. Task ${res.taskId} failed; nothing was charged.`]);
    expect(fal.submitsTo('fal-ai/bytedance/seedream/v4/edit').length - before).toBe(1);
    expect(await server.db.selectFrom('memberModelFaults').select('model').where('memberId', '=', c.ids.a!).execute()).toEqual([]);
    expect((await healthOf(c.groupId)).a!.last_error).toBeNull();
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('cools a member that fal rate-limits for its Retry-After and fails over to the other, billed once', async () => {
    const c = await customer([
      { name: 'a', provider: 'fal', secret: 'fal-a:secret', priority: 10 },
      { name: 'b', provider: 'fal', secret: 'fal-b:secret' },
    ]);
    fal.rateLimitNext('submit', 30);
    const created = await createVideo(c.key, { model: 'wan-2.5-t2v-fal', resolution: '720p' });
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await falJobOf(created.body.id)).apiKey).toBe('fal-b:secret');
    const health = (await healthOf(c.groupId)).a!;
    expect(health.cooldown_reason).toBe('rate_limited');
    const left = Date.parse(health.cooldown_until!) - Date.now();
    expect(left).toBeGreaterThan(20_000);
    expect(left).toBeLessThanOrEqual(30_000);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.body.id).orderBy('id').execute();
    expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
  });

  it('cancels the fal request (PUT …/cancel under owner/app) when its task fails by its deadline', async () => {
    const c = await falCustomer();
    const created = await createVideo(c.key, { model: 'kling-v2.1-pro-fal', resolution: '1080p', prompt: 'a long one [forever]', firstFrame: await frame() });
    const job = await falJobOf(created.body.id);
    await server.db.updateTable('videoTasks').set({ deadlineAt: new Date(Date.now() - 1000), nextRunAt: new Date() }).where('id', '=', created.body.id).execute();
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error?.message]).toEqual(['failed', 'The task exceeded its maximum lifetime and was refunded.']);
    await until(() => job.cancelled, 5000, 'the fal request to be cancelled');
    expect(fal.requests.some((r) => r.method === 'PUT' && r.path === `/fal-ai/kling-video/requests/${job.id}/cancel`)).toBe(true);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('fails and refunds a video whose output link expired before it was fetched', async () => {
    const c = await falCustomer();
    fal.urlTtlMs = 0;
    const created = await createVideo(c.key, { model: 'wan-2.5-t2v-fal', resolution: '720p' });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error?.message]).toEqual(['failed', "Fal's link to the video expired before it was downloaded."]);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('says in member health that a model has no fal mapping, and fails the task without charging', async () => {
    const body = { ...findCatalogDefinition('fal/wan-2.5-t2v-fal')!.model, id: 'wan-unmapped', upstream_mappings: {} };
    expect((await server.admin().POST('/admin/v1/models', { body })).response.status).toBe(201);
    const c = await customer([{ name: 'a', provider: 'fal', secret: 'fal-a:secret', models: ['wan-unmapped'] }]);
    const before = fal.counts.submit;
    const created = await createVideo(c.key, { model: 'wan-unmapped', resolution: '720p' });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('failed');
    expect(fal.counts.submit).toBe(before);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
    const health = (await healthOf(c.groupId)).a!;
    expect(health.model_faults).toEqual([expect.objectContaining({ model: 'wan-unmapped', kind: 'misconfigured', reason: expect.stringContaining("has no fal mapping") })]);

    // The operator saves the mapping: the member's fault for the model is forgotten at once and it serves again.
    const mapping = findCatalogDefinition('fal/wan-2.5-t2v-fal')!.model.upstream_mappings!.fal!;
    const saved = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'wan-unmapped' } }, body: { upstream_mappings: { fal: mapping } } });
    expect(saved.response.status).toBe(200);
    expect((await healthOf(c.groupId)).a!.model_faults).toEqual([]);
    const again = await createVideo(c.key, { model: 'wan-unmapped', resolution: '720p' });
    expect((await waitVideoFinished(server, c.key, again.body.id)).task.status).toBe('completed');
  });
});

describe('replicate through the public API', () => {
  it('Kling 2.1: an official model\'s path, start_image as a signed URL, mode by resolution, duration as an integer; the output fetched at once', async () => {
    const c = await replicateCustomer();
    const created = await createVideo(c.key, { model: 'kling-v2.1-replicate', resolution: '1080p', seconds: 10, firstFrame: await frame(), lastFrame: await frame() });
    expect(created.status, JSON.stringify(created.body)).toBe(202);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    const p = await predictionOf(created.body.id);
    expect([p.model, p.via]).toEqual(['kwaivgi/kling-v2.1', 'model']);
    expect(Object.keys(p.input).sort()).toEqual(['duration', 'end_image', 'mode', 'prompt', 'start_image']);
    expect(p.input).toMatchObject({ mode: 'pro', duration: 10 });
    expect(p.media.map((m) => `${m.field} ${m.form}`)).toEqual(['start_image url', 'end_image url']);
    expect([p.downloads, replicate.cdnSawAuth]).toEqual([1, 0]);
    expect(p.prefer).toBeUndefined();
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 10 * micro(0.09) });
  });

  it('gives a video prediction its task\'s deadline (Cancel-After), its frame signed until then', async () => {
    const c = await replicateCustomer();
    const created = await createVideo(c.key, { model: 'kling-v2.1-replicate', resolution: '720p', firstFrame: await frame() });
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    const p = await predictionOf(created.body.id);
    const { deadlineAt } = await server.db.selectFrom('videoTasks').select(['deadlineAt']).where('id', '=', created.body.id).executeTakeFirstOrThrow();
    expect(Math.abs(p.deadlineAt! - deadlineAt.getTime())).toBeLessThan(5000);
    const expires = Number(new URL(p.input.start_image as string).searchParams.get('expires'));
    expect(expires).toBeGreaterThanOrEqual(Math.floor(deadlineAt.getTime() / 1000));
  });

  it('takes the frame as a data URL once the operator edits the mapping (set-mapping), and refuses a last frame at 720p before any call', async () => {
    const mapping = { ...findCatalogDefinition('replicate/kling-v2.1-replicate')!.model.upstream_mappings!.replicate!, media: 'data_url' as const };
    const body = { ...findCatalogDefinition('replicate/kling-v2.1-replicate')!.model, id: 'kling-inline-replicate' };
    expect((await server.admin().POST('/admin/v1/models', { body })).response.status).toBe(201);
    const patched = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'kling-inline-replicate' } }, body: { upstream_mappings: { replicate: mapping } } });
    expect(patched.data!.upstream_mappings).toEqual({ replicate: mapping });
    const c = await customer([{ name: 'a', provider: 'replicate', secret: 'r8_a', models: ['kling-inline-replicate'] }]);
    const ok = await createVideo(c.key, { model: 'kling-inline-replicate', resolution: '720p', firstFrame: await frame(800, 600) });
    expect((await waitVideoFinished(server, c.key, ok.body.id)).task.status).toBe('completed');
    const p = await predictionOf(ok.body.id);
    expect(p.input).toMatchObject({ mode: 'standard', duration: 5 });
    expect(p.media.map((m) => `${m.field} ${m.form} ${m.width}x${m.height}`)).toEqual(['start_image data 800x600']);

    const before = replicate.counts.create;
    const refused = await createVideo(c.key, { model: 'kling-inline-replicate', resolution: '720p', firstFrame: await frame(), lastFrame: await frame() });
    const t = (await waitVideoFinished(server, c.key, refused.body.id)).task;
    expect([t.status, t.error?.code, t.error?.message]).toEqual(['failed', 'upstream_rejected', 'Kling 2.1 takes a last frame at 1080p only.']);
    expect(replicate.counts.create).toBe(before);
  });

  it('FLUX schnell: waited for in the create call (Prefer: wait=10), ratio, num_outputs and jpg; Ideogram: one prediction per image', async () => {
    const c = await replicateCustomer();
    const flux = await post(c.key, '/v1/images/generations', { model: 'flux-schnell-replicate', prompt: 'a fox', n: 3, aspectRatio: '21:9', resolution: '1K', output_format: 'jpeg' });
    expect(flux.status, JSON.stringify(flux.body)).toBe(200);
    expect(flux.body.data).toHaveLength(3);
    expect(await imageMeta(flux.body.data[0].b64_json)).toEqual({ width: 1248, height: 528, format: 'jpeg' });
    const p = replicate.of('black-forest-labs/flux-schnell').at(-1)!;
    expect(p.input).toEqual({ prompt: 'a fox', aspect_ratio: '21:9', num_outputs: 3, output_format: 'jpg', megapixels: '1', go_fast: true });
    expect([p.prefer, p.gets]).toEqual(['wait=10', 0]);

    const before = replicate.of('ideogram-ai/ideogram-v3-turbo').length;
    const ideogram = await post(c.key, '/v1/images/generations', { model: 'ideogram-v3-turbo-replicate', prompt: 'a poster', n: 2, aspectRatio: '3:4', output_format: 'png' });
    expect(ideogram.status, JSON.stringify(ideogram.body)).toBe(200);
    expect(ideogram.body.data).toHaveLength(2);
    const made = replicate.of('ideogram-ai/ideogram-v3-turbo').slice(before);
    expect(made.map((x) => x.input)).toEqual([
      { prompt: 'a poster', aspect_ratio: '3:4', magic_prompt_option: 'Off' },
      { prompt: 'a poster', aspect_ratio: '3:4', magic_prompt_option: 'Off' },
    ]);
    expect(await holdOf(server.db, ideogram.taskId!)).toMatchObject({ status: 'captured', captured: 2 * micro(0.03) });
  });

  it('completes a video and an image whose prompt starts like a data URL, which every prediction echoes in its input: one prediction each, billed once', async () => {
    const c = await replicateCustomer();
    const prompt = 'data:text/plain;base64,a paper boat on a river';
    const before = replicate.counts.create;
    const video = await createVideo(c.key, { model: 'kling-v2.1-replicate', resolution: '720p', prompt, firstFrame: await frame() });
    expect(video.status, JSON.stringify(video.body)).toBe(202);
    expect((await waitVideoFinished(server, c.key, video.body.id)).task.status).toBe('completed');
    expect(replicate.counts.create - before).toBe(1);
    expect((await predictionOf(video.body.id)).input.prompt).toBe(prompt);
    expect(await holdOf(server.db, video.body.id)).toMatchObject({ status: 'captured', captured: 5 * micro(0.05) });

    const image = await post(c.key, '/v1/images/generations', { model: 'flux-schnell-replicate', prompt: 'data:image/png;base64,A' });
    expect(image.status, JSON.stringify(image.body)).toBe(200);
    expect(image.body.data).toHaveLength(1);
    expect(replicate.counts.create - before).toBe(2);
    expect(replicate.of('black-forest-labs/flux-schnell').at(-1)!.input.prompt).toBe('data:image/png;base64,A');
  });

  it('fails failed, aborted and canceled predictions, refunded; a safety refusal as content_policy_violation', async () => {
    const c = await replicateCustomer();
    const nsfw = await createVideo(c.key, { model: 'kling-v2.1-replicate', resolution: '720p', prompt: 'x [replicate:nsfw]', firstFrame: await frame() });
    const aborted = await createVideo(c.key, { model: 'kling-v2.1-replicate', resolution: '720p', prompt: 'x [replicate:abort]', firstFrame: await frame() });
    const canceled = await createVideo(c.key, { model: 'kling-v2.1-replicate', resolution: '720p', prompt: 'x [forever]', firstFrame: await frame() });
    // Someone cancels the prediction on Replicate's side (its dashboard, another client).
    const id = (await predictionOf(canceled.body.id)).id;
    await fetch(`${replicate.baseUrl}/predictions/${id}/cancel`, { method: 'POST', headers: { Authorization: 'Bearer r8_a' } });
    const expected: [string, string, string][] = [
      [nsfw.body.id, 'content_policy_violation', 'NSFW content detected'],
      [aborted.body.id, 'upstream_error', 'Replicate aborted the prediction before it started'],
      [canceled.body.id, 'upstream_error', 'Replicate prediction was canceled'],
    ];
    for (const [taskId, code, message] of expected) {
      const { task } = await waitVideoFinished(server, c.key, taskId);
      expect([task.status, task.error?.code, task.error?.message]).toEqual(['failed', code, expect.stringContaining(message)]);
      expect(await holdOf(server.db, taskId)).toMatchObject({ status: 'released', captured: 0 });
    }
  });

  it('answers a 422 of an image model as a generic upstream error, the invalid fields in member health', async () => {
    const body = { ...findCatalogDefinition('replicate/flux-schnell-replicate')!.model, id: 'flux-bad-replicate' };
    body.upstream_mappings = { replicate: { ...body.upstream_mappings!.replicate!, input: '{"prompt": prompt, "num_outputs": "two"}' } };
    expect((await server.admin().POST('/admin/v1/models', { body })).response.status).toBe(201);
    const c = await customer([{ name: 'a', provider: 'replicate', secret: 'r8_a', models: ['flux-bad-replicate'] }]);
    const res = await post(c.key, '/v1/images/generations', { model: 'flux-bad-replicate', prompt: 'a fox' });
    expect([res.status, res.body.error.code]).toEqual([502, 'upstream_error']);
    expect(res.body.error.message).not.toContain('num_outputs');
    expect((await healthOf(c.groupId)).a!.last_error).toBe('Replicate refused the input that the mapping made for black-forest-labs/flux-schnell (HTTP 422: input.num_outputs: Invalid type. Expected: integer, given: string)');
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('cools a member Replicate throttles for its Retry-After; cancels a prediction whose task failed by its deadline', async () => {
    const c = await customer([
      { name: 'a', provider: 'replicate', secret: 'r8_a', priority: 10 },
      { name: 'b', provider: 'replicate', secret: 'r8_b' },
    ]);
    replicate.rateLimitNext('create', 20);
    const res = await post(c.key, '/v1/images/generations', { model: 'flux-schnell-replicate', prompt: 'a fox' });
    expect(res.status).toBe(200);
    expect(replicate.of('black-forest-labs/flux-schnell').at(-1)!.token).toBe('r8_b');
    const health = (await healthOf(c.groupId)).a!;
    expect([health.cooldown_reason, health.last_error]).toEqual(['rate_limited', 'the Replicate image submit answered HTTP 429 (Request was throttled. Expected available in 20 seconds.)']);
    expect(Date.parse(health.cooldown_until!) - Date.now()).toBeGreaterThan(15_000);

    const long = await createVideo(c.key, { model: 'kling-v2.1-replicate', resolution: '720p', prompt: 'x [forever]', firstFrame: await frame() });
    const p = await predictionOf(long.body.id);
    await server.db.updateTable('videoTasks').set({ deadlineAt: new Date(Date.now() - 1000), nextRunAt: new Date() }).where('id', '=', long.body.id).execute();
    expect((await waitVideoFinished(server, c.key, long.body.id)).task.status).toBe('failed');
    await until(() => p.status === 'canceled', 5000, 'the prediction to be canceled');
  });

  it('fails an image request whose output file expired before it was fetched, refunded', async () => {
    const c = await replicateCustomer();
    replicate.urlTtlMs = 0;
    const res = await post(c.key, '/v1/images/generations', { model: 'ideogram-v3-turbo-replicate', prompt: 'a poster' });
    expect([res.status, res.body.error.code]).toEqual([502, 'upstream_error']);
    expect(res.body.error.message).toContain('expired or gone');
    expect(await holdOf(server.db, res.taskId!)).toMatchObject({ status: 'released', captured: 0 });
  });
});
