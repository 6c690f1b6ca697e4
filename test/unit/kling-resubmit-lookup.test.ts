/**
 * The Kling video adapter looks a task up by its external_task_id before creating it, so that a
 * resubmit after a lost answer is answered with the task Kling already runs, whatever Kling would
 * say to a second create (undocumented), and whichever way Kling takes the external id in its
 * query (a query parameter, or in the path: the documents do not say plainly; the fake takes the
 * query parameter, and with `externalIdLookup: 'path'` the path). A status call answered 404
 * without Kling's envelope is asked again; only Kling's 1203 says the task is gone.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KlingImageProvider } from '../../server/providers/kling/kling-image.provider.ts';
import { KlingVideoProvider } from '../../server/providers/kling/kling-video.provider.ts';
import type { ImageJob, UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { startKlingFake, type KlingFake } from '../fakes/kling.ts';
import { providerErrorOf } from '../support/api-error.ts';
import { imageParams } from '../support/image-params.ts';
import { videoJob } from '../support/video-job.ts';

let byQuery: KlingFake;
let inPath: KlingFake;
beforeAll(async () => {
  const accounts = [
    { accessKey: 'ak-lookup', secretKey: 'sk-lookup-secret' },
    { accessKey: 'ak-pack', secretKey: 'sk-pack-secret' },
  ];
  byQuery = await startKlingFake({ accounts, jobDurationMs: 200 });
  inPath = await startKlingFake({ accounts, jobDurationMs: 200, externalIdLookup: 'path' });
});
afterAll(async () => {
  await byQuery?.close();
  await inPath?.close();
});

const never = new AbortController().signal;
let seq = 0;
const account = (fake: KlingFake, ak = 'ak-lookup'): UpstreamAccount => ({
  memberId: `mem_${ak}`,
  provider: 'kling',
  baseUrl: fake.url,
  credentials: { access_key: ak, secret_key: `sk-${ak.slice(3)}-secret` },
  modelMap: {},
});
const job = (o: Partial<VideoJob> = {}): VideoJob => videoJob({ taskId: `vid_lookup_${Date.now()}_${++seq}`, model: 'kling-v3-std', prompt: 'a paper boat', ...o });
const tasksOf = (fake: KlingFake, j: VideoJob) => [...fake.tasks.values()].filter((t) => t.externalTaskId === j.taskId);
const createsOf = (fake: KlingFake, j: VideoJob) => fake.requests.filter((r) => r.method === 'POST' && (r.json as { external_task_id?: string } | undefined)?.external_task_id === j.taskId);

describe('a resubmit after a lost answer', () => {
  const provider = new KlingVideoProvider();

  it.each([
    ['as a query parameter', () => byQuery],
    ['in the path (the query parameter unknown: the list answered)', () => inPath],
  ])('finds the task Kling runs by its external id %s and creates nothing', async (_form, fakeOf) => {
    const fake = fakeOf();
    const j = job();
    const first = await provider.submit(account(fake), j, never);
    const again = await provider.submit(account(fake), { ...j, resubmit: true }, never);
    expect(again).toBe(first);
    expect([tasksOf(fake, j).length, createsOf(fake, j).length]).toEqual([1, 1]);
  });

  it('asks by the query parameter first: the form the documents and clients favour', async () => {
    const j = job();
    await provider.submit(account(byQuery), j, never);
    const since = byQuery.requests.length;
    await provider.submit(account(byQuery), { ...j, resubmit: true }, never);
    const asked = byQuery.requests.slice(since);
    expect(asked.map((r) => [r.method, r.path, r.query.get('external_task_id')])).toEqual([['GET', '/v1/videos/text2video', j.taskId]]);
  });

  it('whose create would be refused first for the resource pack the first task used up (1102) is answered with that task', async () => {
    const fake = byQuery;
    const j = job();
    const first = await provider.submit(account(fake, 'ak-pack'), j, never);
    fake.setResourcePack('ak-pack', 'exhausted');
    try {
      expect(await provider.submit(account(fake, 'ak-pack'), { ...j, resubmit: true }, never)).toBe(first);
      expect(createsOf(fake, j)).toHaveLength(1);
    } finally {
      fake.setResourcePack('ak-pack', 'ok');
    }
  });

  it('whose create would be refused first for the concurrency the first task holds (1303) is answered with that task', async () => {
    const fake = inPath;
    const j = job();
    const first = await provider.submit(account(fake), j, never);
    fake.rateLimitNext('submit', 5, { code: 1303 });
    try {
      expect(await provider.submit(account(fake), { ...j, resubmit: true }, never)).toBe(first);
      expect(createsOf(fake, j)).toHaveLength(1);
    } finally {
      fake.faults.clear();
    }
  });

  it('whose lookup fails in passing or for the member throws that failure, never a refusal of the request, and creates nothing', async () => {
    const fake = byQuery;
    const j = job();
    const first = await provider.submit(account(fake), j, never);
    fake.rateLimitNext('poll', 2);
    const again = { ...j, resubmit: true };
    const limited = await providerErrorOf(provider.submit(account(fake), again, never));
    expect([limited.kind, limited.upstreamCode]).toEqual(['rate_limited', '1302']);
    fake.serverErrorNext('poll', 503);
    const down = await providerErrorOf(provider.submit(account(fake), again, never));
    expect([down.kind, down.upstreamCode]).toEqual(['retryable', '5001']);
    fake.errorNext('poll', 1000);
    const refused = await providerErrorOf(provider.submit(account(fake), again, never));
    expect([refused.kind, refused.upstreamCode]).toEqual(['auth', '1000']);
    expect(createsOf(fake, j)).toHaveLength(1);
    expect(await provider.submit(account(fake), again, never)).toBe(first);
  });
});

describe('a first submit', () => {
  const provider = new KlingVideoProvider();

  it('creates the task at once: no earlier submit can have made it, so nothing is looked up', async () => {
    const j = job();
    const since = byQuery.requests.length;
    const jobId = await provider.submit(account(byQuery), j, never);
    expect(tasksOf(byQuery, j).map((t) => `text2video/${t.taskId}`)).toEqual([jobId]);
    expect(byQuery.requests.slice(since).map((r) => r.method)).toEqual(['POST']);
  });
});

describe('a resubmit whose earlier submit made nothing', () => {
  const provider = new KlingVideoProvider();

  it('creates the task once Kling says it has none under either form of the lookup', async () => {
    const j = { ...job(), resubmit: true };
    const since = byQuery.requests.length;
    const jobId = await provider.submit(account(byQuery), j, never);
    expect(tasksOf(byQuery, j).map((t) => `text2video/${t.taskId}`)).toEqual([jobId]);
    expect(byQuery.requests.slice(since).map((r) => r.method)).toEqual(['GET', 'GET', 'POST']);
  });

  it('whose lookup fails in passing creates nothing and is not maybe accepted by the adapter', async () => {
    const j = { ...job(), resubmit: true };
    byQuery.serverErrorNext('poll', 500);
    const err = await providerErrorOf(provider.submit(account(byQuery), j, never));
    expect([err.kind, err.maybeAccepted]).toEqual(['retryable', false]);
    expect(createsOf(byQuery, j)).toEqual([]);
  });

  it('creates the task when Kling refuses both forms of the lookup as a request (no retry would change that)', async () => {
    const j = { ...job(), resubmit: true };
    byQuery.errorNext('poll', 1201);
    byQuery.errorNext('poll', 1202);
    const jobId = await provider.submit(account(byQuery), j, never);
    expect(tasksOf(byQuery, j).map((t) => `text2video/${t.taskId}`)).toEqual([jobId]);
  });
});

describe('a status call answered 404', () => {
  it('without Kling\'s envelope (a page in front of Kling) is asked again; Kling\'s own 1203 fails the task as gone', async () => {
    const provider = new KlingVideoProvider();
    const j = job();
    const jobId = await provider.submit(account(byQuery), j, never);
    byQuery.faults.push('poll', { status: 404, body: Buffer.from('<html><body>Not Found</body></html>'), headers: { 'content-type': 'text/html' } });
    const bare = await providerErrorOf(provider.poll(account(byQuery), jobId, j, never));
    expect([bare.kind, bare.upstreamStatus, bare.maybeAccepted]).toEqual(['retryable', 404, false]);
    expect((await provider.poll(account(byQuery), jobId, j, never)).state).not.toBe('failed');
    byQuery.errorNext('poll', 1203);
    const gone = await provider.poll(account(byQuery), jobId, j, never);
    expect(gone.state === 'failed' && [gone.error.kind, gone.error.upstreamCode]).toEqual(['failed', '1203']);
  });

  it('without the envelope on an image\'s status call is asked again: the image is delivered', async () => {
    const provider = new KlingImageProvider({ pollIntervalMs: 20 });
    const image: ImageJob = { operation: 'generation', model: 'kling-v2-1', prompt: `a lighthouse ${++seq}`, n: 1, params: imageParams(), inputs: [] };
    byQuery.faults.push('image-poll', { status: 404, body: Buffer.from('<html><body>Not Found</body></html>'), headers: { 'content-type': 'text/html' } });
    const delivered: number[] = [];
    await provider.generate(account(byQuery), image, never, { partial: async () => undefined, image: async (i) => void delivered.push(i) });
    expect(delivered).toEqual([0]);
  });
});
