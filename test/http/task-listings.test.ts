/**
 * A client lists its own tasks (issue 27, item 5): GET /v1/videos and GET /v1/images in OpenAI's
 * list shape, newest first, keyset pages that stay exact while tasks are created, filters by
 * status, model and creation time, owner-only; each item is what the task's own lookup answers.
 * Calls go through `client()` (Prism in the contract lane) except deliberately invalid ones.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createWorkers } from '../../server/workers/index.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

type Json = Record<string, any>;

let server: TestServer;

beforeAll(async () => {
  // No workers: tasks stay queued (or processing) until a test runs the engines.
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

async function postJson(key: string, path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Json, taskId: res.headers.get('x-task-id')! };
}

async function createVideo(key: string, extra: Json = {}): Promise<string> {
  const res = await postJson(key, '/v1/videos/generations', { client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', ...extra });
  expect(res.status).toBe(202);
  return res.body.id as string;
}

// Arrays as the contract writes them (`status=queued,failed`); openapi-fetch would repeat the parameter.
const querySerializer = { array: { style: 'form', explode: false } } as const;

async function listVideos(key: string, query: Json = {}) {
  const res = await server.client(key).GET('/v1/videos', { params: { query }, querySerializer });
  return { status: res.response.status, body: (res.data ?? res.error) as Json, headers: res.response.headers };
}

async function listImages(key: string, query: Json = {}) {
  const res = await server.client(key).GET('/v1/images', { params: { query }, querySerializer });
  return { status: res.response.status, body: (res.data ?? res.error) as Json, headers: res.response.headers };
}

const ids = (body: Json) => (body.data as Json[]).map((t) => t.id as string);

/** Runs the task engines until `done` holds. */
async function runWorkersUntil(done: () => Promise<boolean>): Promise<void> {
  const workers = createWorkers(server.ctx);
  workers.start();
  try {
    await until(async () => (await done()) || undefined, 30_000, 'the tasks to finish');
  } finally {
    await workers.stop();
  }
}

const videoStatus = async (id: string) => (await server.db.selectFrom('videoTasks').select('status').where('id', '=', id).executeTakeFirstOrThrow()).status;

/** A signed URL without its signature and expiry (two reads a second apart sign differently). */
const unsigned = (url: string) => new URL(url).pathname;
function withoutSignatures(task: Json): Json {
  const copy = structuredClone(task);
  if (copy.video_url) copy.video_url = unsigned(copy.video_url);
  for (const item of copy.data ?? []) if (item.url) item.url = unsigned(item.url);
  return copy;
}

describe('GET /v1/videos', () => {
  let c: Awaited<ReturnType<typeof createCustomer>>;
  let other: Awaited<ReturnType<typeof createCustomer>>;
  let completed: string;
  let failed: string;
  let queued: string;

  beforeAll(async () => {
    c = await createCustomer(server.db, { balance: 100 });
    other = await createCustomer(server.db, { balance: 100 });
    completed = await createVideo(c.key);
    failed = await createVideo(c.key, { model: 'local-video-lite' });
    // Past its deadline, the engine fails (and refunds) it at its next step.
    await server.db.updateTable('videoTasks').set({ deadlineAt: new Date(Date.now() - 1000) }).where('id', '=', failed).execute();
    await runWorkersUntil(async () => (await videoStatus(completed)) === 'completed' && (await videoStatus(failed)) === 'failed');
    queued = await createVideo(c.key);
    await createVideo(other.key);
  });

  it("lists the account's tasks newest first, each as GET /v1/videos/{id} answers it, and no other account's", async () => {
    const res = await listVideos(c.key);
    expect(res.status).toBe(200);
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect(res.body).toMatchObject({ object: 'list', first_id: queued, last_id: completed, has_more: false });
    expect(ids(res.body)).toEqual([queued, failed, completed]);
    for (const item of res.body.data as Json[]) {
      const single = await server.client(c.key).GET('/v1/videos/{id}', { params: { path: { id: item.id } } });
      expect(withoutSignatures(item)).toEqual(withoutSignatures(single.data!));
    }
    const done = (res.body.data as Json[])[2]!;
    expect(done).toMatchObject({ status: 'completed', video_url: expect.stringMatching(/\/v1\/files\/file_\w+\?expires=\d+&signature=/) });
    expect((res.body.data as Json[])[1]).toMatchObject({ status: 'failed', error: { code: 'timeout' } });

    const theirs = await listVideos(other.key);
    expect(theirs.body.data).toHaveLength(1);
    expect(ids(theirs.body)).not.toContain(queued);
  });

  it('filters by one or several states, by model and by creation time (exclusive, at the precision created_at is shown with)', async () => {
    expect(ids((await listVideos(c.key, { status: ['completed'] })).body)).toEqual([completed]);
    expect(ids((await listVideos(c.key, { status: ['queued', 'failed'] })).body)).toEqual([queued, failed]);
    expect(ids((await listVideos(c.key, { model: 'local-video-lite' })).body)).toEqual([failed]);
    expect(ids((await listVideos(c.key, { model: 'local-video-1', status: ['queued', 'in_progress'] })).body)).toEqual([queued]);
    const all = (await listVideos(c.key)).body.data as Json[];
    const createdAt = (id: string) => all.find((t) => t.id === id)!.created_at as string;
    expect(ids((await listVideos(c.key, { created_after: createdAt(completed) })).body)).toEqual([queued, failed]);
    expect(ids((await listVideos(c.key, { created_before: createdAt(queued) })).body)).toEqual([failed, completed]);
    expect(ids((await listVideos(c.key, { created_after: createdAt(completed), created_before: createdAt(queued) })).body)).toEqual([failed]);
    expect(ids((await listVideos(c.key, { status: ['in_progress'] })).body)).toEqual([]);
    // As a hand-written URL has it (the README's example): a time with raw colons, a model with a slash.
    const raw = await fetch(`${server.directUrl}/v1/videos?created_after=${createdAt(completed)}&model=local-video-1/x`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(raw.status, await raw.clone().text()).toBe(200);
    expect(ids((await raw.json()) as Json)).toEqual([]);
  });

  it('pages with after = last_id: tasks created between pages are never listed twice and make none go missing, newest or oldest first', async () => {
    const p = await createCustomer(server.db, { balance: 100 });
    const originals: string[] = [];
    for (let i = 0; i < 5; i++) originals.push(await createVideo(p.key));
    const added: string[] = [];
    const collect = async (query: Json) => {
      const seen: string[] = [];
      let after: string | undefined;
      for (;;) {
        const res = await listVideos(p.key, { ...query, ...(after && { after }) });
        expect(res.status).toBe(200);
        seen.push(...ids(res.body));
        if (!res.body.has_more) return seen;
        after = res.body.last_id;
        added.push(await createVideo(p.key));
      }
    };
    expect(await collect({ limit: 2 })).toEqual([...originals].reverse());
    const before = [...originals, ...added];
    added.length = 0;
    const oldestFirst = await collect({ limit: 2, order: 'asc' });
    expect(oldestFirst).toEqual([...before, ...added]);
    expect(added.length).toBeGreaterThan(0);
  });

  it("answers 400 invalid_cursor for an after that names no video task of the account (unknown, another account's, an image task)", async () => {
    const theirs = ids((await listVideos(other.key)).body)[0]!;
    const image = await postJson(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'x', response_format: 'url' });
    for (const after of ['vid_unknown', theirs, image.taskId]) {
      const res = await listVideos(c.key, { after });
      expect([res.status, res.body.error.code, res.body.error.param]).toEqual([400, 'invalid_cursor', 'after']);
    }
    expect((await listVideos(c.key, { after: completed })).body).toEqual({ object: 'list', data: [], first_id: null, last_id: null, has_more: false });
    // Invalid on purpose: straight to the server (Prism would refuse them first).
    for (const query of [{ status: 'done' }, { limit: 0 }, { created_after: 'yesterday' }, { order: 'sideways' }]) {
      const res = await server.direct(c.key).GET('/v1/videos', { params: { query: query as never } });
      expect([res.response.status, res.error?.error.code]).toEqual([400, 'invalid_request']);
    }
  });
});

describe('GET /v1/images', () => {
  it("lists the account's image tasks newest first, each as GET /v1/images/{task_id} answers it, b64_json images included", async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const other = await createCustomer(server.db, { balance: 100 });
    const url = await postJson(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'a harbour', response_format: 'url' });
    const b64 = await postJson(c.key, '/v1/images/generations', { model: 'local-image-pro', prompt: 'a lighthouse', n: 2, size: '1024x1024' });
    const running = await postJson(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'later' }, { Prefer: 'respond-async' });
    expect([url.status, b64.status, running.status]).toEqual([200, 200, 202]);
    await postJson(other.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'theirs', response_format: 'url' });

    const res = await listImages(c.key);
    expect(res.status).toBe(200);
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect(res.body).toMatchObject({ object: 'list', first_id: running.taskId, last_id: url.taskId, has_more: false });
    expect(ids(res.body)).toEqual([running.taskId, b64.taskId, url.taskId]);
    for (const item of res.body.data as Json[]) {
      const single = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: item.id } } });
      expect(withoutSignatures(item)).toEqual(withoutSignatures(single.data!));
    }
    const images = (res.body.data as Json[])[1]!.data as Json[];
    expect(images).toHaveLength(2);
    expect(images.map((d) => d.b64_json)).toEqual((b64.body.data as Json[]).map((d) => d.b64_json));

    expect(ids((await listImages(c.key, { status: ['processing'] })).body)).toEqual([running.taskId]);
    expect(ids((await listImages(c.key, { status: ['completed', 'failed'] })).body)).toEqual([b64.taskId, url.taskId]);
    expect(ids((await listImages(c.key, { model: 'local-image-pro' })).body)).toEqual([b64.taskId]);
    const page = await listImages(c.key, { limit: 1, order: 'asc' });
    expect([ids(page.body), page.body.has_more]).toEqual([[url.taskId], true]);
    expect(ids((await listImages(c.key, { limit: 2, order: 'asc', after: page.body.last_id })).body)).toEqual([b64.taskId, running.taskId]);
    expect((await listImages(other.key)).body.data).toHaveLength(1);
    const foreign = await listImages(other.key, { after: url.taskId });
    expect([foreign.status, foreign.body.error.code]).toEqual([400, 'invalid_cursor']);
  });
});
