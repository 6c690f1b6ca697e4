/**
 * Image failure paths: a client that disconnects mid-stream stops the work and is charged only for
 * delivered images; a provider failure after the stream began is an `event: error`; an image that
 * was produced but could not be stored leaves the task `needs_attention` with its credits held until
 * an operator settles it, unless the answer carried its bytes (`b64_json`), which are stored while the
 * task settles; upload limits answer 413 with clear codes.
 */
import sharp from 'sharp';
import { request as httpRequest } from 'node:http';
import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { FilesystemMediaStore } from '../../server/storage/media-store.ts';
import { BrokenOutputStore, GatedOutputStore } from '../fakes/media-stores.ts';
import { flakyImageProvider, noiseImageProvider } from '../fakes/providers.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf as holdOfTask, waitImageTask } from '../support/tasks.ts';
import { NO_LIMITS } from '../../server/services/limits/client-limits.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';

type Json = Record<string, any>;

const holdOf = (server: TestServer, taskId: string) => holdOfTask(server.db, taskId);
const waitTask = (server: TestServer, id: string, predicate: (row: { status: string }) => boolean) => waitImageTask(server.db, id, predicate);
const withImages = (provider: ReturnType<typeof flakyImageProvider>) => ({ overrides: { providers: { local: { image: provider } } } });

describe('a client that disconnects mid-stream', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer(withImages(flakyImageProvider({ delayMs: 400 })));
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('stops the work and releases the credits of the images it did not receive', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const controller = new AbortController();
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'x', model: 'local-image-1', n: 5, stream: true }),
      signal: controller.signal,
    });
    const taskId = res.headers.get('x-task-id')!;
    const reader = res.body!.getReader();
    let text = '';
    while (!text.includes('image_generation.completed')) text += new TextDecoder().decode((await reader.read()).value);
    controller.abort();
    const row = await waitTask(server, taskId, (r) => r.status !== 'processing');
    expect(row.status).toBe('completed');
    expect(row.delivered).toBeGreaterThanOrEqual(1);
    expect(row.delivered).toBeLessThan(5);
    const hold = await holdOf(server, taskId);
    expect(hold).toEqual({ amount: 5_000_000, status: 'captured', captured: row.delivered * 1_000_000 });
    const account = await server.db.selectFrom('accounts').select('balance').where('id', '=', c.accountId).executeTakeFirstOrThrow();
    expect(account.balance).toBe(10_000_000 - row.delivered * 1_000_000);
  });
});

describe('a client that disconnects before a JSON response', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer(withImages(flakyImageProvider({ delayMs: 300 })));
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('received nothing, so the task fails and every credit is released', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const controller = new AbortController();
    const pending = fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'x', model: 'local-image-1', n: 3 }),
      signal: controller.signal,
    }).catch(() => undefined);
    // Leave once the server has started the task (rendering takes ~900 ms).
    let started: { id: string } | undefined;
    for (let i = 0; i < 200 && !started; i++) {
      started = await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).executeTakeFirst();
      if (!started) await new Promise((r) => setTimeout(r, 20));
    }
    controller.abort();
    await pending;
    const task = await waitTask(server, started!.id, (r) => r.status !== 'processing');
    expect(task).toMatchObject({ status: 'failed', errorCode: 'client_disconnected', delivered: 0, actualCredits: 0 });
    expect(await holdOf(server, task.id)).toEqual({ amount: 3_000_000, status: 'released', captured: 0 });
    const outputs = await server.db.selectFrom('files').select('id').where('taskId', '=', task.id).where('purpose', '=', 'image_output').execute();
    expect(outputs).toEqual([]);
  });
});

describe('GET /v1/images/{task_id} while the task runs (§2.4, §4.5)', () => {
  let server: TestServer;
  beforeAll(async () => {
    // No workers: an async task stays processing.
    server = await startTestServer();
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('shows status processing without completed, completed_at or data', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json', Prefer: 'respond-async' },
      body: JSON.stringify({ prompt: 'x', model: 'local-image-1' }),
    });
    expect(res.status).toBe(202);
    const id = res.headers.get('x-task-id')!;
    const { data, response } = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: id } } });
    expect(response.status).toBe(200);
    expect(response.headers.get('x-request-id')).toBeTruthy();
    expect(data).toEqual({
      id,
      object: 'image.task',
      status: 'processing',
      model: 'local-image-1',
      created: expect.any(Number),
      created_at: expect.any(String),
      // Held, nothing charged yet.
      billing: { mode: 'per_item', unit: 'image', unitPrice: 1, images: 1, quotedCredits: 1, actualCredits: 0, delivered: 0 },
    });
    expect(await holdOf(server, id)).toEqual({ amount: 1_000_000, status: 'held', captured: 0 });
  });
});

describe('a synchronous task whose process died', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ workers: true });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('is failed and released by the task engine once its lease expires, never charged', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const auth = { accountId: c.accountId, apiKeyId: c.apiKeyId, groupId: c.groupId, limits: NO_LIMITS };
    const prepared = await server.ctx.services.images.prepare(auth, 'generation', { prompt: 'x', model: 'local-image-1', n: 2 });
    // A request on another instance started it and died: its lease is already over.
    const task = await server.ctx.services.images.start(auth, prepared, { async: false });
    await server.db.updateTable('imageTasks').set({ leaseExpiresAt: new Date(Date.now() - 1000) }).where('id', '=', task.id).execute();
    const row = await waitTask(server, task.id, (r) => r.status !== 'processing');
    expect(row).toMatchObject({ status: 'failed', errorCode: 'interrupted' });
    expect(await holdOf(server, task.id)).toEqual({ amount: 2_000_000, status: 'released', captured: 0 });
  });

  it('keeps the hold of a streamed one for an operator (its events may have delivered images), with the files it recorded', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const auth = { accountId: c.accountId, apiKeyId: c.apiKeyId, groupId: c.groupId, limits: NO_LIMITS };
    const prepared = await server.ctx.services.images.prepare(auth, 'generation', { prompt: 'x', model: 'local-image-1', n: 2, stream: true });
    const task = await server.ctx.services.images.start(auth, prepared, { async: false, stream: true });
    // A stream writes each file's row before the event that carries it: one image went out, then the process died.
    const fileId = `file_streamed${Date.now()}`;
    await server.db
      .insertInto('files')
      .values({ id: fileId, accountId: c.accountId, purpose: 'image_output', contentType: 'image/png', bytes: 10, storageKey: `image_output/xx/${fileId}`, width: 1248, height: 1248, taskId: task.id, expiresAt: new Date(Date.now() + 86_400_000), filename: null })
      .execute();
    await server.db.updateTable('imageTasks').set({ leaseExpiresAt: new Date(Date.now() - 1000) }).where('id', '=', task.id).execute();
    const row = await waitTask(server, task.id, (r) => r.status !== 'processing');
    expect(row).toMatchObject({ status: 'needs_attention', errorCode: 'outcome_unknown', delivered: 1, resultFileIds: [fileId] });
    expect(await holdOf(server, task.id)).toEqual({ amount: 2_000_000, status: 'held', captured: 0 });
    // The operator's refund charges the one image the client received.
    const settled = await server.admin().POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: task.id } }, body: { outcome: 'refunded', reason: 'stream cut off' } });
    expect(settled.data).toMatchObject({ status: 'failed', captured_credits: 1, released_credits: 1 });
  });
});

describe('a synchronous task whose process died, found by the task sweeper past its lifetime', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer();
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('ends as an engine ends it: a streamed one waits for an operator with its hold and files, a JSON one is released as interrupted', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const auth = { accountId: c.accountId, apiKeyId: c.apiKeyId, groupId: c.groupId, limits: NO_LIMITS };
    const streamed = await server.ctx.services.images.start(auth, await server.ctx.services.images.prepare(auth, 'generation', { prompt: 'x', model: 'local-image-1', n: 2, stream: true }), { async: false, stream: true });
    const json = await server.ctx.services.images.start(auth, await server.ctx.services.images.prepare(auth, 'generation', { prompt: 'x', model: 'local-image-1', n: 2 }), { async: false });
    const fileId = `file_swept${Date.now()}`;
    await server.db
      .insertInto('files')
      .values({ id: fileId, accountId: c.accountId, purpose: 'image_output', contentType: 'image/png', bytes: 10, storageKey: `image_output/xx/${fileId}`, width: 1248, height: 1248, taskId: streamed.id, expiresAt: new Date(Date.now() + 86_400_000), filename: null })
      .execute();
    // No engine claimed them before TASK_MAX_LIFETIME_SECONDS (3600 s) went by.
    await server.db.updateTable('imageTasks').set({ leaseExpiresAt: new Date(Date.now() - 1000), createdAt: new Date(Date.now() - 3_700_000) }).where('id', 'in', [streamed.id, json.id]).execute();
    expect(await server.ctx.taskSweeper.run()).toMatchObject({ images: 2 });
    const rows = await server.db.selectFrom('imageTasks').select(['id', 'status', 'errorCode', 'delivered', 'resultFileIds']).where('id', 'in', [streamed.id, json.id]).execute();
    const byId = Object.fromEntries(rows.map((r) => [r.id, r]));
    expect(byId[streamed.id]).toMatchObject({ status: 'needs_attention', errorCode: 'outcome_unknown', delivered: 1, resultFileIds: [fileId] });
    expect(await holdOf(server, streamed.id)).toEqual({ amount: 2_000_000, status: 'held', captured: 0 });
    expect(byId[json.id]).toMatchObject({ status: 'failed', errorCode: 'interrupted' });
    expect(await holdOf(server, json.id)).toEqual({ amount: 2_000_000, status: 'released', captured: 0 });
  });
});

describe('a provider failure', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer(withImages(flakyImageProvider({ failFrom: 1 })));
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('after the stream began is an event: error, and only delivered images are charged', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json', Accept: 'text/event-stream' },
      body: JSON.stringify({ prompt: 'x', model: 'local-image-1', n: 3 }),
    });
    const text = await res.text();
    const events = [...text.matchAll(/^event: (.+)$/gm)].map((m) => m[1]);
    expect(events).toEqual(['image_generation.completed', 'error']);
    const error = JSON.parse(/event: error\ndata: (.+)/.exec(text)![1]!) as Json;
    expect(error).toMatchObject({ type: 'error', error: { code: 'upstream_error', type: 'server_error' } });
    const taskId = res.headers.get('x-task-id')!;
    expect(await holdOf(server, taskId)).toEqual({ amount: 3_000_000, status: 'captured', captured: 1_000_000 });
  });

  it('before any image fails the task with error.message, releases everything and answers 502', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'fail at once', model: 'local-image-1', n: 2 }),
    });
    expect(res.status).toBe(502);
    expect(((await res.json()) as Json).error.code).toBe('upstream_error');
    const taskId = res.headers.get('x-task-id')!;
    expect(await holdOf(server, taskId)).toEqual({ amount: 2_000_000, status: 'released', captured: 0 });
    const task = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: taskId } } });
    expect(task.data).toMatchObject({ status: 'failed', error: { message: expect.stringMatching(/failed/), code: 'upstream_error' } });
    expect(task.data?.completed_at).toEqual(expect.any(String));
  });

  // The upstream's failures are ProviderErrors; anything else failed inside the gateway and is blamed on it.
  it.each([
    ['a bug', 'crash at once', 500, 'internal_error', null],
    ['its database gone', 'database gone', 503, 'database_unavailable', '2'],
  ])('inside the gateway (%s) is its own error, never upstream_error, and charges nothing', async (_what, prompt, status, code, retryAfter) => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt, model: 'local-image-1', n: 2 }),
    });
    expect([res.status, ((await res.json()) as Json).error.code, res.headers.get('retry-after')]).toEqual([status, code, retryAfter]);
    const taskId = res.headers.get('x-task-id')!;
    expect(await holdOf(server, taskId)).toEqual({ amount: 2_000_000, status: 'released', captured: 0 });
    const task = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: taskId } } });
    expect(task.data).toMatchObject({ status: 'failed', error: { code } });
    expect(task.data?.error?.message).not.toMatch(/upstream|provider/i);
    expect(server.logs.some((l) => l.includes(taskId) && l.includes('image generation failed inside the gateway'))).toBe(true);
  });

  it('after some images without streaming returns what was delivered and charges only that', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'x', model: 'local-image-1', n: 3 }),
    });
    expect(res.status).toBe(200);
    expect(((await res.json()) as Json).data).toHaveLength(1);
    expect(await holdOf(server, res.headers.get('x-task-id')!)).toEqual({ amount: 3_000_000, status: 'captured', captured: 1_000_000 });
  });
});

describe('needs_attention', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ overrides: { mediaStore: new BrokenOutputStore(new FilesystemMediaStore(`/tmp/mg-broken-${process.pid}`)) } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('keeps the credits held until an operator settles the task as completed or refunded', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await fetch(`${server.directUrl}/v1/images/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
        // Links to stored copies: an image whose copy could not be written cannot be delivered.
        body: JSON.stringify({ prompt: 'x', model: 'local-image-1', response_format: 'url' }),
      });
      // The gateway's own failure (not the upstream's): 500, with what happens to the credits.
      expect(res.status).toBe(500);
      const body = (await res.json()) as Json;
      expect(body.error.code).toBe('internal_error');
      expect(body.error.message).toMatch(/needs attention/);
      ids.push(res.headers.get('x-task-id')!);
    }
    const [completeId, refundId, otherId] = ids as [string, string, string];
    const task = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: completeId } } });
    expect(task.data).toMatchObject({ status: 'needs_attention' });
    expect(task.data).not.toHaveProperty('completed_at');
    expect(await holdOf(server, completeId)).toEqual({ amount: 1_000_000, status: 'held', captured: 0 });
    expect((await server.db.selectFrom('accounts').select('balance').where('id', '=', c.accountId).executeTakeFirstOrThrow()).balance).toBe(7_000_000);

    const admin = server.admin();
    const got = await admin.GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: completeId } } });
    expect(got.data).toMatchObject({ id: completeId, kind: 'image', status: 'needs_attention', held_credits: 1, captured_credits: 0, released_credits: 0 });

    const completed = await admin.POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: completeId } }, body: { outcome: 'completed', reason: 'delivered by email' } });
    expect(completed.response.status).toBe(200);
    expect(completed.data).toMatchObject({ status: 'completed', captured_credits: 1, released_credits: 0 });
    expect(await holdOf(server, completeId)).toEqual({ amount: 1_000_000, status: 'captured', captured: 1_000_000 });
    // The operator confirmed the image delivered: the usage report counts it with its charge.
    const from = new Date(Date.now() - 86_400_000).toISOString();
    const to = new Date(Date.now() + 86_400_000).toISOString();
    const usage = await admin.GET('/admin/v1/usage', { params: { query: { from, to, group_by: ['account'], account_id: c.accountId } } });
    expect([usage.response.status, usage.error]).toEqual([200, undefined]);
    expect((usage.data as Exclude<typeof usage.data, string | undefined>).rows.map((r) => [r.credits_spent, r.images_delivered])).toEqual([[1, 1]]);

    const refunded = await admin.POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: refundId } }, body: { outcome: 'refunded', reason: 'storage outage' } });
    expect(refunded.data).toMatchObject({ status: 'failed', captured_credits: 0, released_credits: 1 });
    const seen = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: refundId } } });
    // The reason is the ledger's (settled_reason, the entries): the client reads a fixed message.
    expect(seen.data).toMatchObject({ status: 'failed', error: { code: 'refunded', message: "The operator refunded this task's credits." } });
    expect(JSON.stringify(seen.data)).not.toContain('storage outage');
    expect(refunded.data).toMatchObject({ settled_reason: 'storage outage', error: { code: 'refunded', message: "The operator refunded this task's credits." } });

    const again = await admin.POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: completeId } }, body: { outcome: 'refunded', reason: 'twice' } });
    expect(again.response.status).toBe(409);
    expect(again.error?.error.code).toBe('task_not_settleable');
    const account = await server.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', c.accountId).executeTakeFirstOrThrow();
    // 10 − 1 captured − 1 still held (otherId); the refunded one came back.
    expect(account).toEqual({ balance: 8_000_000, totalSpent: 1_000_000 });
    expect((await holdOf(server, otherId)).status).toBe('held');
  });
});

describe('needs_attention after some images were stored', () => {
  const store = new BrokenOutputStore(new FilesystemMediaStore(`/tmp/mg-broken2-${process.pid}`), 1);
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ overrides: { mediaStore: store } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('keeps the stored images for the operator; a refund charges nothing, since a JSON answer (a 500) delivered none', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'x', model: 'local-image-1', n: 3, response_format: 'url' }),
    });
    expect(res.status).toBe(500);
    const id = res.headers.get('x-task-id')!;
    const row = await server.db.selectFrom('imageTasks').select(['status', 'delivered', 'resultFileIds']).where('id', '=', id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'needs_attention', delivered: 0 });
    expect(row.resultFileIds).toHaveLength(1);
    const story = await server.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: id } } });
    expect(story.data).toMatchObject({ status: 'needs_attention', held_credits: 3, delivered_credits: 0, outputs: [expect.anything()] });
    const settled = await server.admin().POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: id } }, body: { outcome: 'refunded', reason: 'two images lost' } });
    // `refunded` gives back what the client did not receive: all of it.
    expect(settled.data).toMatchObject({ status: 'failed', held_credits: 3, captured_credits: 0, released_credits: 3, delivered_credits: 0 });
    expect(await holdOf(server, id)).toEqual({ amount: 3_000_000, status: 'released', captured: 0 });
    const ledger = await server.admin().GET('/admin/v1/ledger', { params: { query: { task_id: id } } });
    const reasons = Object.fromEntries((ledger.data?.data ?? []).map((e) => [e.kind, e.reason]));
    expect(reasons).toEqual({ hold: null, release: 'two images lost' });
  });

  it('a stream that delivered an image before the store failed: the refund still captures that image', async () => {
    store.reset();
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'x', model: 'local-image-1', n: 3, stream: true, response_format: 'url' }),
    });
    const events = await res.text();
    expect(events).toContain('image_generation.completed');
    const id = res.headers.get('x-task-id')!;
    const row = await server.db.selectFrom('imageTasks').select(['status', 'delivered']).where('id', '=', id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'needs_attention', delivered: 1 });
    const story = await server.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: id } } });
    expect(story.data).toMatchObject({ held_credits: 3, delivered_credits: 1 });
    const settled = await server.admin().POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: id } }, body: { outcome: 'refunded', reason: 'two images lost' } });
    // The image the stream delivered stays charged (the contract); the operator's reason is on the capture and the release.
    expect(settled.data).toMatchObject({ status: 'failed', held_credits: 3, captured_credits: 1, released_credits: 2 });
    const ledger = await server.admin().GET('/admin/v1/ledger', { params: { query: { task_id: id } } });
    const reasons = Object.fromEntries((ledger.data?.data ?? []).map((e) => [e.kind, e.reason]));
    expect(reasons).toEqual({ hold: null, capture: 'two images lost', release: 'two images lost' });
    // The client reads that the rest was refunded, never the operator's reason.
    const seen = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: id } } });
    expect(seen.data).toMatchObject({
      status: 'failed',
      error: { code: 'refunded', message: 'The operator refunded the credits of the images this task did not deliver; the images it delivered stay charged.' },
    });
    expect(JSON.stringify(seen.data)).not.toContain('two images lost');
  });
});

describe('a JSON answer that carries the images (b64_json)', () => {
  const gated = new GatedOutputStore(new FilesystemMediaStore(`/tmp/mg-gated-${process.pid}`));
  // The second image's write fails, the first and third are stored.
  const broken = new BrokenOutputStore(new FilesystemMediaStore(`/tmp/mg-broken3-${process.pid}`), 1, 2);
  let gatedServer: TestServer;
  let brokenServer: TestServer;
  beforeAll(async () => {
    gatedServer = await startTestServer({ overrides: { mediaStore: gated } });
    brokenServer = await startTestServer({ overrides: { mediaStore: broken } });
    await seedCatalog(gatedServer.db);
    await seedCatalog(brokenServer.db);
  });
  afterAll(async () => {
    await gatedServer?.close();
    await brokenServer?.close();
  });
  const generate = (server: TestServer, key: string, n: number) =>
    fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'x', model: 'local-image-1', n }),
    });

  it("settles the task only once its images' copies have landed, and completes the answer after both", async () => {
    const c = await createCustomer(gatedServer.db, { balance: 10 });
    let responded = false;
    // The answer's head may go out meanwhile; its end waits for the writes and the settlement.
    const pending = generate(gatedServer, c.key, 2).then(async (res) => {
      const text = await res.text();
      responded = true;
      return { status: res.status, headers: res.headers, json: () => JSON.parse(text) as Json };
    });
    // Both writes wait at the gate: nothing is settled yet (a process that died now would leave the
    // task to be failed and released, never completed and charged with rows whose bytes never landed).
    for (let i = 0; i < 300 && gated.waiting < 2; i++) await new Promise((r) => setTimeout(r, 20));
    expect(gated.waiting).toBe(2);
    await new Promise((r) => setTimeout(r, 100));
    const row = await gatedServer.db.selectFrom('imageTasks').select(['id', 'status', 'delivered']).where('accountId', '=', c.accountId).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'processing', delivered: 0 });
    expect(await holdOf(gatedServer, row.id)).toMatchObject({ status: 'held' });
    expect(await gatedServer.db.selectFrom('files').select('id').where('taskId', '=', row.id).execute()).toEqual([]);
    expect(responded).toBe(false);
    gated.open();
    const res = await pending;
    expect(res.status).toBe(200);
    expect(await holdOf(gatedServer, row.id)).toMatchObject({ status: 'captured', captured: 2_000_000 });
    const body = res.json();
    expect(body.data).toHaveLength(2);
    const task = await gatedServer.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: res.headers.get('x-task-id')! } } });
    const answered = (body.data as Json[]).map((d) => d.b64_json as string);
    expect(task.data?.data?.map((d) => answered.indexOf(d.b64_json!))).toEqual([0, 1]);
  });

  it('still delivers and charges an image whose stored copy could not be written, and leaves it out of the task', async () => {
    const c = await createCustomer(brokenServer.db, { balance: 10 });
    const res = await generate(brokenServer, c.key, 3);
    expect(res.status).toBe(200);
    const body = (await res.json()) as Json;
    expect(body.data).toHaveLength(3);
    for (const item of body.data) expect(Buffer.from(item.b64_json, 'base64').subarray(1, 4).toString()).toBe('PNG');
    const id = res.headers.get('x-task-id')!;
    expect(await holdOf(brokenServer, id)).toEqual({ amount: 3_000_000, status: 'captured', captured: 3_000_000 });
    const row = await brokenServer.db.selectFrom('imageTasks').select(['status', 'delivered', 'actualCredits', 'resultFileIds']).where('id', '=', id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'completed', delivered: 3, actualCredits: 3_000_000 });
    expect(row.resultFileIds).toHaveLength(2);
    const files = await brokenServer.db.selectFrom('files').select('id').where('taskId', '=', id).where('purpose', '=', 'image_output').execute();
    expect(files.map((f) => f.id).sort()).toEqual([...row.resultFileIds].sort());
    // The task lists the first and the third image, in that order.
    const task = await brokenServer.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: id } } });
    expect(task.data).toMatchObject({ status: 'completed' });
    const answered = (body.data as Json[]).map((d) => d.b64_json as string);
    expect(new Set(answered).size).toBe(3);
    expect(task.data?.data?.map((d) => answered.indexOf(d.b64_json!))).toEqual([0, 2]);
  });
});

describe('a synchronous answer written while its task settles', () => {
  const PROVIDER_DELAY_MS = 500;
  let server: TestServer;
  beforeEach(async () => {
    // Photo-weight images (an answer longer than one write, whose head goes out while the task
    // settles), answered after PROVIDER_DELAY_MS: time for the test to lock the task's row first.
    server = await startTestServer({ overrides: { providers: { local: { image: noiseImageProvider({ delayMs: PROVIDER_DELAY_MS }) } } } });
    await seedCatalog(server.db);
  });
  afterEach(async () => {
    await server?.close();
  });

  /**
   * A request whose settlement is held up by a lock on its task row: the provider takes a moment,
   * the test locks the task's row as soon as it exists, so the settlement's statement waits for the
   * lock while the answer is written (its head, when it is longer than one write). Returns what the
   * client received so far and the lock's owner.
   */
  async function heldAtSettlement(key: string, accountId: string, body: Json = { prompt: 'x', model: 'local-image-1', n: 1, size: '1024x1024', response_format: 'b64_json' }, head = true) {
    const url = new URL('/v1/images/generations', server.directUrl);
    const received: Buffer[] = [];
    let length = 0;
    let ended = false;
    const response = new Promise<{ status: number; contentLength: number; error?: Error }>((resolve) => {
      const req = httpRequest(url, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' } }, (res) => {
        length = Number(res.headers['content-length']);
        res.on('data', (chunk: Buffer) => received.push(chunk));
        res.on('end', () => ((ended = true), resolve({ status: res.statusCode!, contentLength: length })));
        res.on('error', (error) => resolve({ status: res.statusCode!, contentLength: length, error }));
        res.on('aborted', () => resolve({ status: res.statusCode!, contentLength: length, error: new Error('aborted') }));
      });
      req.on('error', (error) => resolve({ status: 0, contentLength: 0, error }));
      req.end(JSON.stringify(body));
    });
    let task: { id: string } | undefined;
    for (let i = 0; i < 500 && !task; i++) {
      await new Promise((r) => setTimeout(r, 5));
      task = await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', accountId).executeTakeFirst();
    }
    const taskId = task!.id;
    let locked!: () => void;
    let release!: () => void;
    const isLocked = new Promise<void>((r) => (locked = r));
    const released = new Promise<void>((r) => (release = r));
    const lock = server.db.transaction().execute(async (trx) => {
      await sql`select id from image_tasks where id = ${taskId} for update`.execute(trx);
      locked();
      await released;
    });
    await isLocked;
    // The provider answered only now (PROVIDER_DELAY_MS): the settlement comes after the lock.
    expect(await holdOf(server, taskId)).toMatchObject({ status: 'held' });
    for (let i = 0; i < 1000 && !(await settlementWaits()); i++) await new Promise((r) => setTimeout(r, 10));
    // The answer's head (if it has one) arrives while the settlement waits for the lock.
    for (let i = 0; head && i < 1000 && !(length > 0 && received.reduce((n, b) => n + b.length, 0) >= length - 1); i++) await new Promise((r) => setTimeout(r, 10));
    return { response, received: () => Buffer.concat(received), ended: () => ended, length: () => length, taskId, unlock: async () => (release(), await lock) };
  }

  /** Once unlocked: the whole answer arrived, 200, and the one image was charged. */
  async function answeredAndCharged(held: Awaited<ReturnType<typeof heldAtSettlement>>): Promise<Json> {
    const res = await held.response;
    expect(res.error).toBeUndefined();
    expect(res.status).toBe(200);
    expect(await holdOf(server, held.taskId)).toEqual({ amount: 1_000_000, status: 'captured', captured: 1_000_000 });
    return JSON.parse(held.received().toString('utf8')) as Json;
  }

  /** The server's settlement statement is waiting for the test's lock on the task row. */
  async function settlementWaits(): Promise<boolean> {
    const { rows } = await sql`select 1 from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock' and query ilike '%image_tasks%' and pid <> pg_backend_pid()`.execute(server.db);
    return rows.length > 0;
  }

  it('writes a short answer (links) whole, in one write, once the charge has committed', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const held = await heldAtSettlement(c.key, c.accountId, { prompt: 'x', model: 'local-image-1', n: 1, size: '1024x1024', response_format: 'url' }, false);
    try {
      expect(await settlementWaits()).toBe(true);
      await new Promise((r) => setTimeout(r, 100));
      // Nothing of it, not even the status line, before the settlement commits.
      expect(held.length()).toBe(0);
      expect(held.received().length).toBe(0);
      expect(await holdOf(server, held.taskId)).toMatchObject({ status: 'held' });
    } finally {
      await held.unlock();
    }
    const body = await answeredAndCharged(held);
    expect(body.data[0].url).toMatch(/\/v1\/files\//);
  });

  it('sends all of the answer but its last byte before the charge commits, and the rest after it', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const held = await heldAtSettlement(c.key, c.accountId);
    try {
      expect(held.received().length).toBe(held.length() - 1);
      await new Promise((r) => setTimeout(r, 100));
      expect(held.ended()).toBe(false);
      expect(await holdOf(server, held.taskId)).toMatchObject({ status: 'held' });
    } finally {
      await held.unlock();
    }
    const body = await answeredAndCharged(held);
    expect(body.data).toHaveLength(1);
  });

  it('leaves a truncated, uncharged answer when the settlement fails after the answer began', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const held = await heldAtSettlement(c.key, c.accountId);
    if (held.received().length !== held.length() - 1) await held.unlock();
    expect(held.received().length).toBe(held.length() - 1);
    // The server's statement waiting for the lock loses its connection, as in a crash of the database link.
    let killed = 0;
    try {
      for (let i = 0; i < 500 && killed === 0; i++) {
        const { rows } = await sql`select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock' and query ilike '%image_tasks%' and pid <> pg_backend_pid()`.execute(server.db);
        killed = rows.length;
        if (killed === 0) await new Promise((r) => setTimeout(r, 20));
      }
    } finally {
      if (killed === 0) await held.unlock();
    }
    expect(killed).toBe(1);
    const res = await held.response;
    await held.unlock();
    expect(res.error).toBeDefined();
    expect(held.received().length).toBeLessThan(res.contentLength);
    expect(() => JSON.parse(held.received().toString('utf8'))).toThrow();
    const hold = await holdOf(server, held.taskId);
    expect(hold.status).toBe('held');
    expect(hold.captured ?? 0).toBe(0);
  });
});

describe('upload limits', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ env: { EDIT_MAX_FILE_BYTES: '200000', EDIT_MAX_BODY_BYTES: '1000000' } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('answers 413 media_too_large for a file over the limit and body_too_large for a body over it', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    // ~390 KB: over the 200 KB per-file limit, under the 1 MB body limit.
    const big = await sharp({ create: { width: 360, height: 360, channels: 3, background: '#808080' } }).png({ compressionLevel: 0 }).toBuffer();
    const send = async (files: Buffer[]) => {
      const form = new FormData();
      form.append('prompt', 'x');
      form.append('model', 'local-image-1');
      for (const f of files) form.append('image[]', new Blob([f], { type: 'image/png' }), 'a.png');
      const res = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
      return { status: res.status, body: (await res.json()) as Json };
    };
    const one = await send([big]);
    expect([one.status, one.body.error.code, one.body.error.param]).toEqual([413, 'media_too_large', 'image[]']);
    // 9 × ~120 KB: each under the file limit, together over the body limit.
    const small = await sharp({ create: { width: 200, height: 200, channels: 3, background: '#808080' } }).png({ compressionLevel: 0 }).toBuffer();
    const many = await send(Array.from({ length: 9 }, () => small));
    expect([many.status, many.body.error.code]).toEqual([413, 'body_too_large']);
  });
});
