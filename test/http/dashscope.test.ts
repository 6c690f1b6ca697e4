/**
 * The `dashscope` adapter through the public API against fake DashScope regions
 * (test/fakes/dashscope.ts): the shipped catalog definitions created through the admin API, members
 * added through it, two members per customer. From a client's side: the legacy bodies (img_url,
 * `W*H` sizes, the keyframe endpoint) and the new one (input.media[]) chosen per model, first and
 * last frames, reference images, inputs as signed Mediagate URLs the fake really downloads, the
 * member's inline option for a gateway DashScope cannot reach, an input DashScope's inspection
 * refuses (the client's, not the members'), a GIF frame sent as a PNG, the catalog's refusals
 * before any call, failures refunded (content inspection, an UNKNOWN task, an expired result link),
 * a refused status call asked again, the deadline's cancel of a queued task; and the pool around
 * DashScope's codes: failover on a throttled submit before acceptance with sticky polls, an account
 * in arrears out until an admin acts, a model the member's region does not have and a key of
 * another region, each said in member health in an operator's words while the other member serves.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { startDashScopeFake, type DashScopeFake, type DashScopeFakeTask } from '../fakes/dashscope.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until, waitVideoFinished } from '../support/tasks.ts';

const MODELS = ['wan2.2-i2v-plus', 'wan2.2-kf2v-flash', 'wan2.5-t2v-preview', 'wan2.5-i2v-preview', 'wan2.6-i2v-flash', 'wan2.7-t2v', 'wan2.7-i2v', 'happyhorse-1.1-r2v'];

let server: TestServer;
/** Singapore (the default host's region), without Wan 2.5 text-to-video; Beijing has every model. */
let sg: DashScopeFake;
let cn: DashScopeFake;
let seq = 0;

beforeAll(async () => {
  sg = await startDashScopeFake({
    region: 'ap-southeast-1',
    models: MODELS.filter((m) => m !== 'wan2.5-t2v-preview'),
    accounts: { 'sk-sg-a': {}, 'sk-sg-b': {}, 'sk-cn': { region: 'cn-beijing' }, 'sk-sg-no-r2v': { models: MODELS.filter((m) => m !== 'happyhorse-1.1-r2v') } },
  });
  cn = await startDashScopeFake({ region: 'cn-beijing', accounts: { 'sk-cn': {} } });
  server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000' } });
  // The shipped definitions, as `npm run admin -- models create --from dashscope/<model>` creates them.
  for (const id of MODELS) {
    const { response } = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(`dashscope/${id}`)!.model });
    expect(response.status).toBe(201);
  }
});
afterAll(async () => {
  await server?.close();
  await sg?.close();
  await cn?.close();
});
beforeEach(() => {
  for (const fake of [sg, cn]) {
    fake.faults.clear();
    fake.urlTtlMs = 24 * 3600_000;
    fake.reachable = () => true;
  }
});

type MemberSpec = { name: string; key: string; priority?: number; baseUrl?: string };

/** A customer whose group has DashScope members (`a` first by priority), added through the admin API. */
async function customer(members: MemberSpec[], balance = 100) {
  const account = await createAccount(server.db, { balance });
  const group = await createGroup(server.db);
  for (const m of members) {
    const { response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: m.name, provider: 'dashscope', base_url: m.baseUrl ?? sg.url, credentials: { api_key: m.key }, models: MODELS, priority: m.priority ?? 0 },
    });
    expect(response.status).toBe(201);
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, groupId: group.id, key: key.key };
}

const twoMembers = (a: Partial<MemberSpec> = {}, b: Partial<MemberSpec> = {}) =>
  customer([
    { name: 'a', key: 'sk-sg-a', priority: 10, ...a },
    { name: 'b', key: 'sk-sg-b', priority: 0, ...b },
  ]);

type Json = Record<string, any>;

async function createVideo(key: string, overrides: Record<string, unknown> = {}) {
  const body = { client_request_id: `ds-${Date.now()}-${++seq}`, prompt: 'a paper boat on a river', model: 'wan2.7-t2v', seconds: 5, aspectRatio: '16:9', resolution: '720p', ...overrides };
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Json };
}

/** The DashScope task a video task was submitted as (once its id is saved), on whichever fake has it. */
async function upstreamTask(videoTaskId: string): Promise<DashScopeFakeTask> {
  const id = await until(async () => (await server.db.selectFrom('videoTasks').select('upstreamJobId').where('id', '=', videoTaskId).executeTakeFirstOrThrow()).upstreamJobId ?? undefined, 10_000, 'the upstream task id');
  const task = sg.tasks.get(id) ?? cn.tasks.get(id);
  if (!task) throw new Error(`no DashScope task ${id}`);
  return task;
}

async function healthOf(groupId: string) {
  const { data } = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } } });
  return Object.fromEntries(data!.data.map((m) => [m.name, m.health]));
}

async function balanceOf(accountId: string) {
  return Number((await server.db.selectFrom('accounts').select('balance').where('id', '=', accountId).executeTakeFirstOrThrow()).balance);
}

const micro = (credits: number) => Math.round(credits * 1_000_000);
const png = (w: number, h: number, color = { r: 60, g: 120, b: 200 }) => sharp({ create: { width: w, height: h, channels: 3, background: color } }).png().toBuffer();
const dataUrl = (b: Buffer) => `data:image/png;base64,${b.toString('base64')}`;
const submitsTo = (fake: DashScopeFake, key: string) => fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/video-synthesis') && r.headers.authorization === `Bearer ${key}`).length;

describe('dashscope bodies', () => {
  let frame: string;
  let last: string;
  beforeAll(async () => {
    frame = dataUrl(await png(1280, 720));
    last = dataUrl(await png(1280, 720, { r: 200, g: 80, b: 40 }));
  });

  it('sends a legacy image-to-video model its img_url as a signed Mediagate URL the upstream downloads, charged per second', async () => {
    const c = await twoMembers();
    const fetched = sg.fetches.length;
    const created = await createVideo(c.key, { model: 'wan2.2-i2v-plus', resolution: '1080p', firstFrame: frame });
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    const upstream = await upstreamTask(created.body.id);
    expect([upstream.endpoint, upstream.protocol, upstream.apiKey]).toEqual(['video-generation', 'legacy-i2v', 'sk-sg-a']);
    expect(upstream.headers['x-dashscope-async']).toBe('enable');
    const input = upstream.body.input as Json;
    expect(input.img_url).toMatch(new RegExp(`^${server.directUrl}/v1/files/file_[^?]+\\?expires=\\d+&signature=`));
    expect(upstream.body.parameters).toEqual({ resolution: '1080P', duration: 5, audio: false, prompt_extend: false, watermark: false });
    // The upstream really fetched the stored frame from the gateway, and got the image the client sent.
    expect(sg.fetches.slice(fetched)).toEqual([{ url: input.img_url, status: 200 }]);
    expect(upstream.media).toEqual([expect.objectContaining({ field: 'img_url', kind: 'url', mimeType: 'image/png', width: 1280, height: 720 })]);
    // The result is downloaded from OSS without the key.
    const url = new URL(task.video_url!);
    const bytes = Buffer.from(await (await fetch(`${server.directUrl}${url.pathname}${url.search}`)).arrayBuffer());
    expect(bytes.subarray(4, 8).toString('latin1')).toBe('ftyp');
    expect(sg.ossSawAuth).toBe(0);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 5 * micro(0.1) });
  });

  it("asks a legacy text-to-video model for DashScope's W*H size of the tier and ratio, and the new protocol for resolution and ratio", async () => {
    const c = await customer([{ name: 'cn', key: 'sk-cn', baseUrl: `${cn.url}/api/v1` }]);
    const legacy = await createVideo(c.key, { model: 'wan2.5-t2v-preview', seconds: 10, aspectRatio: '9:16', negativePrompt: 'rain' });
    const media = await createVideo(c.key, { model: 'wan2.7-t2v', seconds: 12, aspectRatio: '4:3', resolution: '1080p' });
    for (const id of [legacy.body.id, media.body.id]) expect((await waitVideoFinished(server, c.key, id)).task.status).toBe('completed');
    const a = await upstreamTask(legacy.body.id);
    expect([a.endpoint, a.protocol]).toEqual(['video-generation', 'legacy-t2v']);
    expect(a.body).toEqual({ model: 'wan2.5-t2v-preview', input: { prompt: 'a paper boat on a river', negative_prompt: 'rain' }, parameters: { size: '720*1280', duration: 10, audio: true, prompt_extend: false, watermark: false } });
    const b = await upstreamTask(media.body.id);
    expect(b.protocol).toBe('media');
    expect(b.body).toEqual({ model: 'wan2.7-t2v', input: { prompt: 'a paper boat on a river' }, parameters: { resolution: '1080P', ratio: '4:3', duration: 12, audio: true, prompt_extend: false, watermark: false } });
  });

  it('sends first and last frames to the keyframe endpoint (legacy) and as media first_frame / last_frame (new), without a ratio', async () => {
    const c = await twoMembers();
    const keyframe = await createVideo(c.key, { model: 'wan2.2-kf2v-flash', firstFrame: frame, lastFrame: last, resolution: '480p' });
    const media = await createVideo(c.key, { model: 'wan2.7-i2v', firstFrame: frame, lastFrame: last, seconds: 8 });
    for (const id of [keyframe.body.id, media.body.id]) expect((await waitVideoFinished(server, c.key, id)).task.status).toBe('completed');
    const k = await upstreamTask(keyframe.body.id);
    expect([k.endpoint, k.protocol]).toEqual(['image2video', 'keyframe']);
    expect(Object.keys(k.body.input as Json).sort()).toEqual(['first_frame_url', 'last_frame_url', 'prompt']);
    expect(k.media.map((m) => `${m.field} ${m.kind} ${m.width}x${m.height}`)).toEqual(['first_frame_url url 1280x720', 'last_frame_url url 1280x720']);
    expect(k.body.parameters).toMatchObject({ resolution: '480P', duration: 5 });
    const m = await upstreamTask(media.body.id);
    expect((m.body.input as Json).media).toEqual([
      { type: 'first_frame', url: expect.stringContaining(`${server.directUrl}/v1/files/`) },
      { type: 'last_frame', url: expect.stringContaining(`${server.directUrl}/v1/files/`) },
    ]);
    // The frame decides the ratio: none is sent.
    expect(m.body.parameters).toEqual({ resolution: '720P', duration: 8, audio: true, prompt_extend: false, watermark: false });
  });

  it('sends reference images as media reference_image with the ratio (r2v)', async () => {
    const c = await twoMembers();
    const refs = [await png(800, 600), await png(600, 800), await png(640, 640)].map(dataUrl);
    const created = await createVideo(c.key, { model: 'happyhorse-1.1-r2v', referenceImages: refs, aspectRatio: '1:1', resolution: '720p', seconds: 3 });
    expect(created.status).toBe(202);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    const upstream = await upstreamTask(created.body.id);
    expect(upstream.media.map((m) => `${m.type} ${m.width}x${m.height}`)).toEqual(['reference_image 800x600', 'reference_image 600x800', 'reference_image 640x640']);
    expect(upstream.body.parameters).toMatchObject({ resolution: '720P', ratio: '1:1', duration: 3 });
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 3 * micro(0.123) });
  });

  it('turns the sound off only on the model that has a switch, and the watermark on only for a member that asks', async () => {
    const c = await customer([{ name: 'marked', key: 'sk-sg-a', baseUrl: `${sg.url}?watermark=true` }]);
    const silent = await createVideo(c.key, { model: 'wan2.6-i2v-flash', firstFrame: frame, seconds: 2, generate_audio: false });
    expect((await waitVideoFinished(server, c.key, silent.body.id)).task).toMatchObject({ status: 'completed', generate_audio: false });
    expect((await upstreamTask(silent.body.id)).body.parameters).toMatchObject({ audio: false, watermark: true, duration: 2 });
    // Wan 2.5 always makes sound: asking for silence is refused at creation.
    const refused = await createVideo(c.key, { model: 'wan2.5-i2v-preview', firstFrame: frame, generate_audio: false });
    expect([refused.status, refused.body.error?.code]).toEqual([400, 'audio_always_on']);
  });

  it('refuses what a model cannot do before any upstream call, charging nothing', async () => {
    const c = await twoMembers();
    const balance = await balanceOf(c.accountId);
    const submits = sg.tasks.size;
    const cases: [Record<string, unknown>, string][] = [
      [{ model: 'wan2.2-i2v-plus', resolution: '720p', firstFrame: frame }, 'unsupported_resolution'],
      [{ model: 'wan2.2-i2v-plus', seconds: 10, firstFrame: frame }, 'unsupported_duration'],
      [{ model: 'wan2.7-t2v', firstFrame: frame }, 'frames_not_supported'],
      [{ model: 'wan2.5-t2v-preview', aspectRatio: '4:3' }, 'unsupported_aspect_ratio'],
      [{ model: 'wan2.2-i2v-plus', resolution: '480p', firstFrame: frame, lastFrame: last }, 'last_frame_not_supported'],
      [{ model: 'happyhorse-1.1-r2v', referenceImages: Array(10).fill(frame) }, 'too_many_reference_images'],
      // Model Studio's new protocol takes 720P and 1080P: HappyHorse 1.1 offers no 480p.
      [{ model: 'happyhorse-1.1-r2v', referenceImages: [frame], resolution: '480p' }, 'unsupported_resolution'],
      [{ model: 'wan2.7-t2v', seconds: 1 }, 'unsupported_duration'],
      [{ model: 'wan2.7-t2v', reference_videos: ['https://example.com/clip.mp4'] }, 'unsupported_by_upstream'],
    ];
    for (const [body, code] of cases) {
      const res = await createVideo(c.key, body);
      expect([res.status, res.body.error?.code], JSON.stringify(body).slice(0, 120)).toEqual([400, code]);
    }
    expect(sg.tasks.size).toBe(submits);
    expect(await balanceOf(c.accountId)).toBe(balance);
  });

  it('fails and refunds a text-only task of an image-to-video model, and an r2v task without references, without calling the upstream', async () => {
    const c = await twoMembers();
    const submits = sg.tasks.size;
    const i2v = await createVideo(c.key, { model: 'wan2.7-i2v' });
    const r2v = await createVideo(c.key, { model: 'happyhorse-1.1-r2v', seconds: 5 });
    const a = (await waitVideoFinished(server, c.key, i2v.body.id)).task;
    expect([a.status, a.error?.message]).toEqual(['failed', "DashScope's model wan2.7-i2v makes a video from a first frame; send first_frame."]);
    const b = (await waitVideoFinished(server, c.key, r2v.body.id)).task;
    expect([b.status, b.error?.message]).toEqual(['failed', "DashScope's model happyhorse-1.1-r2v makes a video from reference images; send reference_images."]);
    expect(sg.tasks.size).toBe(submits);
    for (const id of [i2v.body.id, r2v.body.id]) expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
  });
});

describe('dashscope inputs DashScope cannot download', () => {
  let frame: string;
  beforeAll(async () => {
    frame = dataUrl(await png(960, 540));
  });

  it("fails a member whose input URLs DashScope cannot reach over to the member that sends them inline, and says why in the first one's health", async () => {
    const c = await twoMembers({}, { baseUrl: `${sg.url}?inline_media=true` });
    // This gateway is behind a firewall: DashScope reaches none of its URLs.
    sg.reachable = (url) => !url.startsWith(server.directUrl);
    const before = sg.fetches.length;
    const created = await createVideo(c.key, { model: 'wan2.2-i2v-plus', resolution: '480p', firstFrame: frame });
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    const upstream = await upstreamTask(created.body.id);
    expect(upstream.apiKey).toBe('sk-sg-b');
    expect((upstream.body.input as Json).img_url).toMatch(/^data:image\/png;base64,/);
    expect(upstream.media).toEqual([expect.objectContaining({ kind: 'data', width: 960, height: 540 })]);
    expect(sg.fetches.slice(before)).toEqual([{ url: expect.stringContaining(server.directUrl), status: 'unreachable' }]);
    const health = (await healthOf(c.groupId)).a!;
    expect(health.model_faults).toEqual([
      { model: 'wan2.2-i2v-plus', kind: 'misconfigured', reason: expect.stringMatching(/HTTP 400 InvalidParameter\.DataInspection: DashScope could not download the task's input images from this gateway.*\?inline_media=true/), since: expect.any(String), until: expect.any(String) },
    ]);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 5 * micro(0.02) });
  });

  it('still sends the new protocol URLs with the inline option: its media take URLs only', async () => {
    const c = await customer([{ name: 'inline', key: 'sk-sg-a', baseUrl: `${sg.url}?inline_media=true` }]);
    const created = await createVideo(c.key, { model: 'wan2.7-i2v', firstFrame: frame });
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(created.body.id)).media).toEqual([expect.objectContaining({ type: 'first_frame', kind: 'url' })]);
  });
});

describe('dashscope inputs DashScope cannot read', () => {
  it("fails the task of an input DashScope's inspection refuses as the client's (upstream_rejected, refunded), leaving both members to serve another client's task", async () => {
    const c = await twoMembers();
    const balance = await balanceOf(c.accountId);
    const spare = submitsTo(sg, 'sk-sg-b');
    // What DashScope answers an image its data inspection cannot take: the status-code table's row (one per member).
    sg.faults.push('submit', { status: 400, body: { request_id: 'ds-inspection', code: 'InvalidParameter.DataInspection', message: 'The media format is not supported or incorrect for the data inspection.' } }, 2);
    const refused = await createVideo(c.key, { model: 'wan2.7-i2v', firstFrame: dataUrl(await png(800, 600)) });
    expect(refused.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, refused.body.id);
    expect([task.status, task.error?.message]).toEqual(['failed', 'The media format is not supported or incorrect for the data inspection.']);
    expect((await server.db.selectFrom('videoTasks').select('errorCode').where('id', '=', refused.body.id).executeTakeFirstOrThrow()).errorCode).toBe('upstream_rejected');
    expect(await holdOf(server.db, refused.body.id)).toMatchObject({ status: 'released', captured: 0 });
    expect(await balanceOf(c.accountId)).toBe(balance);
    // The request's fault: not failed over, no member left out of the model.
    expect(submitsTo(sg, 'sk-sg-b')).toBe(spare);
    const health = await healthOf(c.groupId);
    expect([health.a!.model_faults, health.b!.model_faults]).toEqual([[], []]);
    sg.faults.clear();
    const other = await createApiKey(server.db, { accountId: (await createAccount(server.db, { balance: 100 })).id, groupId: c.groupId });
    const valid = await createVideo(other.key, { model: 'wan2.7-i2v', firstFrame: dataUrl(await png(1280, 720)) });
    expect(valid.status).toBe(202);
    expect((await waitVideoFinished(server, other.key, valid.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(valid.body.id)).apiKey).toBe('sk-sg-a');
  });

  it('sends a GIF frame as a PNG of its first frame, which DashScope takes (it refuses GIF)', async () => {
    const c = await twoMembers();
    const gif = await sharp({ create: { width: 800, height: 600, channels: 3, background: { r: 10, g: 200, b: 30 } } }).gif().toBuffer();
    const created = await createVideo(c.key, { model: 'wan2.7-i2v', firstFrame: `data:image/gif;base64,${gif.toString('base64')}` });
    expect(created.status).toBe(202);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(created.body.id)).media).toEqual([expect.objectContaining({ type: 'first_frame', kind: 'url', mimeType: 'image/png', width: 800, height: 600 })]);
  });
});

describe('dashscope failures', () => {
  it('fails and refunds a task refused under content inspection, at submit and after it, without cooling the member', async () => {
    const c = await twoMembers();
    const balance = await balanceOf(c.accountId);
    const spare = submitsTo(sg, 'sk-sg-b');
    const atSubmit = await createVideo(c.key, { prompt: 'a storm [ds:inspect]' });
    const afterwards = await createVideo(c.key, { prompt: 'a storm [ds:unsafe]' });
    const a = (await waitVideoFinished(server, c.key, atSubmit.body.id)).task;
    expect([a.status, a.error?.message]).toEqual(['failed', 'Input data may contain inappropriate content.']);
    const b = (await waitVideoFinished(server, c.key, afterwards.body.id)).task;
    expect([b.status, b.error?.message]).toEqual(['failed', 'Output data may contain inappropriate content.']);
    const codes = await server.db.selectFrom('videoTasks').select(['id', 'errorCode']).where('id', 'in', [atSubmit.body.id, afterwards.body.id]).execute();
    expect(codes.map((r) => r.errorCode)).toEqual(['content_policy_violation', 'content_policy_violation']);
    for (const id of [atSubmit.body.id, afterwards.body.id]) expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
    expect(await balanceOf(c.accountId)).toBe(balance);
    // A refusal of the request says nothing about the member: no failover, no cooldown.
    expect(submitsTo(sg, 'sk-sg-b')).toBe(spare);
    expect((await healthOf(c.groupId)).a).toMatchObject({ cooldown_until: null, credentials_rejected: false, account_disabled: null, model_faults: [] });
  });

  it('fails and refunds a task DashScope no longer knows (UNKNOWN), and one whose result link expired before its download', async () => {
    const c = await twoMembers();
    const unknown = await createVideo(c.key, { prompt: 'a long queue [ds:expire]' });
    const a = (await waitVideoFinished(server, c.key, unknown.body.id)).task;
    expect([a.status, a.error?.message]).toEqual(['failed', 'DashScope no longer knows this video task (its task ids expire after 24 hours).']);
    // The link is dead the moment the task succeeds (as 24 hours later).
    sg.urlTtlMs = 0;
    const expired = await createVideo(c.key);
    const b = (await waitVideoFinished(server, c.key, expired.body.id)).task;
    expect([b.status, b.error?.message]).toEqual(['failed', expect.stringMatching(/link to the video expired.*24 hours/)]);
    for (const id of [unknown.body.id, expired.body.id]) expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('asks again after a status call DashScope refuses (HTTP 400): the job runs on, and is collected and charged once', async () => {
    const c = await twoMembers();
    sg.faults.push('poll', { status: 400, body: { request_id: 'ds-poll', code: 'InvalidParameter', message: 'Required parameter(s) missing or invalid, please check the request parameters.' } });
    const created = await createVideo(c.key);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect([task.status, task.error]).toEqual(['completed', undefined]);
    const upstream = await upstreamTask(created.body.id);
    expect(upstream.apiKey).toBe('sk-sg-a');
    expect(sg.requests.filter((r) => r.method === 'GET' && r.path === `/api/v1/tasks/${upstream.id}`).length).toBeGreaterThan(upstream.polls);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 5 * micro(0.1) });
  });

  it('cancels a queued task upstream when its task fails by its deadline', async () => {
    const c = await twoMembers();
    const queued = await createVideo(c.key, { prompt: 'a long queue [ds:stay-pending]' });
    const upstreamId = (await upstreamTask(queued.body.id)).id;
    await server.db.updateTable('videoTasks').set({ deadlineAt: new Date(Date.now() - 1000), nextRunAt: new Date() }).where('id', '=', queued.body.id).execute();
    const { task } = await waitVideoFinished(server, c.key, queued.body.id);
    expect([task.status, task.error?.message]).toEqual(['failed', 'The task exceeded its maximum lifetime and was refunded.']);
    expect(await holdOf(server.db, queued.body.id)).toMatchObject({ status: 'released', captured: 0 });
    await until(() => sg.statusOf(upstreamId) === 'CANCELED', 5000, 'the queued task to be canceled');
  });
});

describe('dashscope and the pool', () => {
  it('fails a throttled submit over to the second member before acceptance, charged once, and polls only the member that accepted', async () => {
    const c = await twoMembers();
    sg.rateLimitNext('submit');
    const created = await createVideo(c.key);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    const upstream = await upstreamTask(created.body.id);
    expect(upstream.apiKey).toBe('sk-sg-b');
    expect(upstream.polls).toBeGreaterThan(0);
    const polls = sg.requests.filter((r) => r.method === 'GET' && r.path === `/api/v1/tasks/${upstream.id}`);
    expect(new Set(polls.map((r) => r.headers.authorization))).toEqual(new Set(['Bearer sk-sg-b']));
    const health = (await healthOf(c.groupId)).a!;
    expect([health.cooldown_reason, health.last_error]).toEqual(['rate_limited', 'Requests rate limit exceeded, please try again later.']);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 5 * micro(0.1) });
  });

  it('cools a member whose allocated quota is used up for minutes, not seconds', async () => {
    const c = await twoMembers();
    sg.quotaNext('submit');
    const created = await createVideo(c.key);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(created.body.id)).apiKey).toBe('sk-sg-b');
    const health = (await healthOf(c.groupId)).a!;
    expect(health.cooldown_reason).toBe('quota_exhausted');
    expect(Date.parse(health.cooldown_until!) - Date.now()).toBeGreaterThan(4 * 60_000);
  });

  it('takes an account in arrears out until an admin updates the member, while the other member serves', async () => {
    const c = await twoMembers();
    sg.accounts.get('sk-sg-a')!.arrears = true;
    try {
      const first = await createVideo(c.key);
      expect((await waitVideoFinished(server, c.key, first.body.id)).task.status).toBe('completed');
      expect((await upstreamTask(first.body.id)).apiKey).toBe('sk-sg-b');
      expect((await healthOf(c.groupId)).a!.account_disabled).toEqual({ reason: 'the Alibaba Cloud account is in arrears (overdue payment) (HTTP 400 Arrearage: Access denied, please make sure your account is in good standing.)', since: expect.any(String) });
      const refusals = submitsTo(sg, 'sk-sg-a');
      const second = await createVideo(c.key);
      expect((await waitVideoFinished(server, c.key, second.body.id)).task.status).toBe('completed');
      expect(submitsTo(sg, 'sk-sg-a')).toBe(refusals);
    } finally {
      sg.accounts.get('sk-sg-a')!.arrears = false;
    }
  });

  it("leaves a member whose region lacks a model out for that model only, says so in its health, and lets the other region's member serve it", async () => {
    const c = await customer([
      { name: 'singapore', key: 'sk-sg-a', priority: 10 },
      { name: 'beijing', key: 'sk-cn', baseUrl: cn.url, priority: 0 },
    ]);
    const created = await createVideo(c.key, { model: 'wan2.5-t2v-preview' });
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect(cn.tasks.has((await upstreamTask(created.body.id)).id)).toBe(true);
    const health = (await healthOf(c.groupId)).singapore!;
    expect(health.model_faults).toEqual([
      { model: 'wan2.5-t2v-preview', kind: 'misconfigured', reason: expect.stringMatching(/^HTTP 400 InvalidParameter: DashScope has no model 'wan2\.5-t2v-preview' in the region of 127\.0\.0\.1:\d+ \(HTTP 400 InvalidParameter: Model not exist\.\); models, API keys and base URLs are per region/), since: expect.any(String), until: expect.any(String) },
    ]);
    expect(health).toMatchObject({ credentials_rejected: false, account_disabled: null, cooldown_until: null });
    // Its other models are still its own.
    const other = await createVideo(c.key);
    expect((await waitVideoFinished(server, c.key, other.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(other.body.id)).apiKey).toBe('sk-sg-a');
  });

  it("rejects a member whose key belongs to another region, saying so in its health, while the other member serves", async () => {
    const c = await twoMembers({ key: 'sk-cn' });
    const created = await createVideo(c.key);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(created.body.id)).apiKey).toBe('sk-sg-b');
    const health = (await healthOf(c.groupId)).a!;
    expect(health.credentials_rejected).toBe(true);
    expect(health.last_error).toMatch(/^DashScope refused the member's API key \(HTTP 401 InvalidApiKey: Invalid API-key provided\.\); a key works only in the region whose console issued it/);
    expect(health.last_error).not.toContain('sk-cn');
  });

  it('leaves a member whose account may not use a model out for that model until an admin acts', async () => {
    const c = await twoMembers({ key: 'sk-sg-no-r2v' });
    const ref = dataUrl(await png(800, 600));
    const created = await createVideo(c.key, { model: 'happyhorse-1.1-r2v', referenceImages: [ref], seconds: 4 });
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await upstreamTask(created.body.id)).apiKey).toBe('sk-sg-b');
    expect((await healthOf(c.groupId)).a!.model_faults).toEqual([
      { model: 'happyhorse-1.1-r2v', kind: 'model_not_open', reason: expect.stringContaining("may not use model 'happyhorse-1.1-r2v': activate or purchase it in the Model Studio console"), since: expect.any(String), until: null },
    ]);
  });
});
