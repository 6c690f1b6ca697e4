/**
 * Storage failures injected into the media store (test/fakes/media-stores.ts), so that the mapping
 * is tested on every machine (test/http/storage-full.test.ts fills a real disk, as root): a store
 * that is full (ENOSPC) or cannot be written (EIO) is the gateway's own fault, answered 507
 * storage_full / 503 storage_unavailable with Retry-After, charging and holding nothing for what
 * was not delivered, never `needs_attention`, and working again as soon as the store does.
 */
import { randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FilesystemMediaStore } from '../../server/storage/media-store.ts';
import { createWorkers } from '../../server/workers/index.ts';
import { BrokenOutputStore, FailingWritesStore, storageError } from '../fakes/media-stores.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { accountState, holdOf, until } from '../support/tasks.ts';

type Json = Record<string, any>;

describe('a media store that refuses every write', () => {
  const store = new FailingWritesStore(new FilesystemMediaStore(`/tmp/mg-failing-${process.pid}`));
  let server: TestServer;
  let png: Buffer;
  beforeAll(async () => {
    png = await sharp({ create: { width: 64, height: 48, channels: 3, background: '#336699' } }).png().toBuffer();
    server = await startTestServer({ overrides: { mediaStore: store } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  const filesOf = (accountId: string) => server.db.selectFrom('files').select('id').where('accountId', '=', accountId).execute();

  it('fails a URL image with 503 storage_unavailable (EIO) or 507 storage_full (ENOSPC), releases the hold, and works once the store does', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    for (const [code, status, apiCode, retryAfter] of [
      ['EIO', 503, 'storage_unavailable', '30'],
      ['ENOSPC', 507, 'storage_full', '60'],
    ] as const) {
      store.code = code;
      store.failing = true;
      const res = await server.client(c.key).POST('/v1/images/generations', { body: { prompt: 'x', model: 'local-image-1', n: 2, response_format: 'url' } });
      expect([res.response.status, res.error?.error.code, res.error?.error.type, res.response.headers.get('retry-after')]).toEqual([status, apiCode, 'server_error', retryAfter]);
      const taskId = res.response.headers.get('x-task-id')!;
      const task = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: taskId } } });
      expect(task.data).toMatchObject({ status: 'failed', error: { code: apiCode } });
      expect(await holdOf(server.db, taskId)).toEqual({ amount: 2_000_000, status: 'released', captured: 0 });
    }
    expect(await accountState(server.db, c.accountId, c.apiKeyId)).toMatchObject({ balance: 10_000_000, creditsUsed: 0 });
    expect(await filesOf(c.accountId)).toEqual([]);

    store.failing = false;
    const ok = await server.client(c.key).POST('/v1/images/generations', { body: { prompt: 'x', model: 'local-image-1', response_format: 'url' } });
    expect(ok.response.status).toBe(200);
  });

  it('answers an upload 507 at once and a video with a data URL input 503, keeping nothing and holding nothing', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    store.failing = true;
    store.code = 'ENOSPC';
    const form = new FormData();
    form.append('purpose', 'input');
    form.append('file', new Blob([png], { type: 'image/png' }), 'frame.png');
    const upload = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    expect([upload.status, ((await upload.json()) as Json).error.code, upload.headers.get('retry-after')]).toEqual([507, 'storage_full', '60']);

    store.code = 'EROFS';
    const video = { client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', firstFrame: `data:image/png;base64,${png.toString('base64')}` };
    const created = await server.client(c.key).POST('/v1/videos/generations', { body: video });
    expect([created.response.status, created.error?.error.code, created.response.headers.get('retry-after')]).toEqual([503, 'storage_unavailable', '30']);
    await until(async () => (await filesOf(c.accountId)).length === 0, 3000, 'staged inputs to be removed');
    expect(await accountState(server.db, c.accountId, c.apiKeyId)).toMatchObject({ balance: 10_000_000, holds: [], tasks: 0 });
    expect(store.failedWrites).toBeGreaterThan(0);

    store.failing = false;
    const again = await server.client(c.key).POST('/v1/videos/generations', { body: { ...video, client_request_id: randomUUID() } });
    expect(again.response.status).toBe(202);
  });
});

describe('a media store that fills up after the first image', () => {
  // The first image output is stored, the next ones fail with ENOSPC.
  const store = new BrokenOutputStore(new FilesystemMediaStore(`/tmp/mg-fills-${process.pid}`), 1, Number.POSITIVE_INFINITY, (key) => storageError('ENOSPC', key));
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ overrides: { mediaStore: store } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('a stream keeps the delivered image charged, releases the rest and ends with event: error storage_full', async () => {
    store.reset();
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json', Accept: 'text/event-stream' },
      body: JSON.stringify({ prompt: 'x', model: 'local-image-1', n: 3, response_format: 'url' }),
    });
    const text = await res.text();
    expect([...text.matchAll(/^event: (.+)$/gm)].map((m) => m[1])).toEqual(['image_generation.completed', 'error']);
    const error = (JSON.parse(/event: error\ndata: (.+)/.exec(text)![1]!) as Json).error;
    expect(error).toMatchObject({ code: 'storage_full', type: 'server_error', message: expect.stringMatching(/1 of 3 images were delivered and only those are charged/) });
    const taskId = res.headers.get('x-task-id')!;
    expect(await holdOf(server.db, taskId)).toEqual({ amount: 3_000_000, status: 'captured', captured: 1_000_000 });
    const row = await server.db.selectFrom('imageTasks').select(['status', 'delivered', 'resultFileIds']).where('id', '=', taskId).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'completed', delivered: 1 });
    expect(row.resultFileIds).toHaveLength(1);
  });

  it('a JSON answer with URLs delivers nothing: 507, everything released, the stored copy removed', async () => {
    store.reset();
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await server.client(c.key).POST('/v1/images/generations', { body: { prompt: 'x', model: 'local-image-1', n: 3, response_format: 'url' } });
    expect([res.response.status, res.error?.error.code]).toEqual([507, 'storage_full']);
    const taskId = res.response.headers.get('x-task-id')!;
    expect(await holdOf(server.db, taskId)).toEqual({ amount: 3_000_000, status: 'released', captured: 0 });
    expect(await server.db.selectFrom('imageTasks').select(['status', 'errorCode']).where('id', '=', taskId).executeTakeFirstOrThrow()).toEqual({ status: 'failed', errorCode: 'storage_full' });
    expect(await server.db.selectFrom('files').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  });
});

describe('a media store that cannot read back the inputs of a respond-async edit', () => {
  class InputReadsFail extends FilesystemMediaStore {
    failing = false;
    override read(key: string, range?: { start: number; end: number }) {
      if (this.failing && key.startsWith('input/')) {
        return new Readable({
          read() {
            this.destroy(storageError('EIO', key));
          },
        });
      }
      return super.read(key, range);
    }
  }
  const store = new InputReadsFail(`/tmp/mg-input-reads-${process.pid}`);
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ overrides: { mediaStore: store } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it("fails the task as the gateway's storage fault (storage_unavailable), not the upstream's, once its retries are spent, and releases the hold", async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const png = await sharp({ create: { width: 64, height: 64, channels: 3, background: '#aa3366' } }).png().toBuffer();
    const form = new FormData();
    form.append('prompt', 'edit it');
    form.append('model', 'local-image-1');
    form.append('image', new Blob([png], { type: 'image/png' }), 'in.png');
    const res = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}`, Prefer: 'respond-async' }, body: form });
    expect(res.status).toBe(202);
    const taskId = res.headers.get('x-task-id')!;
    store.failing = true;
    const workers = createWorkers(server.ctx);
    workers.start();
    try {
      await until(async () => ((await server.db.selectFrom('imageTasks').select('status').where('id', '=', taskId).executeTakeFirstOrThrow()).status !== 'processing' ? true : undefined), 20_000, 'the task to end');
    } finally {
      await workers.stop();
      store.failing = false;
    }
    const task = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: taskId } } });
    expect(task.data).toMatchObject({ status: 'failed', error: { code: 'storage_unavailable' } });
    expect(task.data!.error!.message).toMatch(/media storage/);
    expect(await holdOf(server.db, taskId)).toMatchObject({ status: 'released', captured: 0 });
  });
});
