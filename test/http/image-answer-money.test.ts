/**
 * Money on the image answer path: what a client is charged matches what it got, whatever fails.
 * A `url` answer's links are made before the charge (a store that cannot sign them answers 503
 * storage_unavailable and charges nothing); a stream records each image's file as it goes out, so
 * that a task taken over mid-stream is settled for exactly the images sent, and nothing more is
 * sent once it is; an upstream call that may have been accepted (its job billed there) is never
 * sent to a second member, nor submitted afresh by a background task's next try.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { FilesystemMediaStore } from '../../server/storage/media-store.ts';
import { PresignFailingStore } from '../fakes/media-stores.ts';
import { gatedImageProvider } from '../fakes/providers.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { createAccount, createApiKey, createCustomer, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';

const MICRO = 1_000_000;


/** The local images, the second and later held while `gated.afterFirst` is set. */
const { provider: gatedImages, gate: gated } = gatedImageProvider();

/** The events of a stream, in order. */
function eventsOf(text: string): { event: string; data: Record<string, any> }[] {
  return text
    .split('\n\n')
    .filter((frame) => frame.startsWith('event: '))
    .map((frame) => {
      const [head, data] = frame.split('\ndata: ');
      return { event: head!.slice('event: '.length), data: JSON.parse(data!) as Record<string, any> };
    });
}

const generate = (server: TestServer, key: string, body: Record<string, unknown>) =>
  fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'local-image-1', prompt: 'a lighthouse', n: 2, ...body }),
  });

const taskRow = (server: TestServer, id: string) => server.db.selectFrom('imageTasks').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
const filesOf = (server: TestServer, taskId: string) => server.db.selectFrom('files').select('id').where('taskId', '=', taskId).execute();

describe('a synchronous url answer whose media store cannot sign links', () => {
  let server: TestServer;
  const dir = mkdtempSync(join(tmpdir(), 'mg-presign-'));
  const store = new PresignFailingStore(new FilesystemMediaStore(dir));
  beforeAll(async () => {
    server = await startTestServer({
      env: { MEDIA_STORE: 's3', S3_BUCKET: 'b', S3_ENDPOINT: 'http://127.0.0.1:9', MEDIA_URLS: 'presigned' },
      overrides: { mediaStore: store },
    });
    await seedCatalog(server.db);
  });
  afterAll(async () => {
    await server?.close();
    rmSync(dir, { recursive: true, force: true, maxRetries: 5 });
  });

  it('a JSON url answer whose link cannot be made answers 503 storage_unavailable and charges nothing', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const presigns = store.presigns;
    const res = await generate(server, c.key, { response_format: 'url' });
    const id = res.headers.get('x-task-id')!;
    expect(res.status).toBe(503);
    expect(res.headers.get('retry-after')).toBe('30');
    expect(await res.json()).toMatchObject({ error: { code: 'storage_unavailable', type: 'server_error', message: expect.stringMatching(/nothing was charged/) } });
    // The first link failed: the second image was never stored nor linked.
    expect(store.presigns - presigns).toBe(1);
    expect(await taskRow(server, id)).toMatchObject({ status: 'failed', errorCode: 'storage_unavailable', delivered: 0, actualCredits: 0 });
    expect(await holdOf(server.db, id)).toEqual({ amount: 2 * MICRO, status: 'released', captured: 0 });
    expect(await filesOf(server, id)).toEqual([]);
  });

  it('a task lookup whose links cannot be made answers 503 storage_unavailable, not 500', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    // Made while links could be made; looked up once they cannot (the credentials expired).
    store.failing = false;
    const made = await generate(server, c.key, { response_format: 'url', n: 1 }).finally(() => (store.failing = true));
    expect(made.status).toBe(200);
    const id = made.headers.get('x-task-id')!;
    const res = await fetch(`${server.directUrl}/v1/images/${id}`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(res.status).toBe(503);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('storage_unavailable');
  });

  it('a url stream whose link cannot be made ends with event: error storage_unavailable, not as a client that left', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(server, c.key, { response_format: 'url', stream: true });
    const id = res.headers.get('x-task-id')!;
    expect(res.status).toBe(200);
    const events = eventsOf(await res.text());
    expect(events.map((e) => e.event)).toEqual(['error']);
    expect(events[0]!.data).toMatchObject({ type: 'error', error: { code: 'storage_unavailable', type: 'server_error' } });
    expect(await taskRow(server, id)).toMatchObject({ status: 'failed', errorCode: 'storage_unavailable', delivered: 0 });
    expect(await holdOf(server.db, id)).toEqual({ amount: 2 * MICRO, status: 'released', captured: 0 });
    expect(await filesOf(server, id)).toEqual([]);
  });
});

describe('a stream taken over by an engine while it runs', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ workers: true, overrides: { providers: { local: { image: gatedImages } } } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('a b64_json stream taken over after its first image is settled for that image, and sends no other', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    let open!: () => void;
    gated.afterFirst = new Promise((resolve) => (open = resolve));
    try {
      const res = await generate(server, c.key, { stream: true });
      const id = res.headers.get('x-task-id')!;
      const reader = res.body!.getReader();
      let text = '';
      while (!text.includes('event: image_generation.completed')) text += Buffer.from((await reader.read()).value!).toString();
      // The request's process stalls past its lease: an engine takes the task over and ends it.
      await sql`update image_tasks set lease_expires_at = now() - interval '1 second' where id = ${id}`.execute(server.db);
      const ended = await until(async () => {
        const row = await taskRow(server, id);
        return row.status !== 'processing' && row;
      }, 10_000, 'the engine to end the task');
      // The image the client has is recorded for the operator.
      expect(ended).toMatchObject({ status: 'needs_attention', errorCode: 'outcome_unknown', delivered: 1 });
      expect(ended.resultFileIds).toEqual((await filesOf(server, id)).map((f) => f.id));
      // The request goes on with the second image: refused, it sends no other.
      open();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += Buffer.from(value).toString();
      }
      const events = eventsOf(text);
      expect(events.filter((e) => e.event === 'image_generation.completed').map((e) => e.data.image_index)).toEqual([0]);
      expect(events.at(-1)).toMatchObject({ event: 'error', data: { error: { code: 'internal_error', message: expect.stringMatching(/taken over/) } } });
      expect(await taskRow(server, id)).toMatchObject({ status: 'needs_attention', delivered: 1 });
      expect(await filesOf(server, id)).toHaveLength(1);
      // The operator's refund charges the image the client received.
      const settled = await server.admin().POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: id } }, body: { outcome: 'refunded', reason: 'stream cut off' } });
      expect(settled.error).toBeUndefined();
      expect(settled.data).toMatchObject({ status: 'failed', captured_credits: 1, released_credits: 1 });
      expect(await holdOf(server.db, id)).toEqual({ amount: 2 * MICRO, status: 'captured', captured: MICRO });
    } finally {
      open?.();
      gated.afterFirst = undefined;
    }
  });
});

describe('an upstream call that may have been accepted', () => {
  let server: TestServer;
  let fal: FalFake;
  let proxy: http.Server;
  let proxyUrl = '';
  let seq = 0;
  beforeAll(async () => {
    fal = await startFalFake({ apiKeys: ['fal-a:secret', 'fal-b:secret'], queueMs: 50, jobDurationMs: 200 });
    server = await startTestServer({ workers: true });
    const { response } = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition('fal/flux-dev-fal')!.model });
    expect(response.status).toBe(201);
    // Member a's fal: the submit reaches fal (its job is created, and billed), but the answer carries no request id.
    proxy = http.createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      const forwarded = await fetch(`${fal.url}${req.url}`, {
        method: req.method,
        headers: { authorization: req.headers.authorization!, 'content-type': 'application/json' },
        ...(req.method === 'POST' && { body: Buffer.concat(chunks) }),
      });
      await forwarded.text();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"status":"IN_QUEUE"}');
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    proxyUrl = `http://127.0.0.1:${(proxy.address() as { port: number }).port}`;
  });
  afterAll(async () => {
    await server?.close();
    await fal?.close();
    proxy?.close();
  });

  /** A key whose group has member a (first by priority, behind the proxy) and member b (fal itself). */
  async function customer() {
    const account = await createAccount(server.db, { balance: 100 });
    const group = await createGroup(server.db);
    for (const [name, secret, priority, baseUrl] of [['a', 'fal-a:secret', 10, proxyUrl], ['b', 'fal-b:secret', 0, fal.url]] as const) {
      const { response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
        params: { path: { group_id: group.id } },
        body: { name, provider: 'fal', base_url: baseUrl, credentials: { api_key: secret }, models: ['flux-dev-fal'], priority },
      });
      expect(response.status).toBe(201);
    }
    return (await createApiKey(server.db, { accountId: account.id, groupId: group.id })).key;
  }

  const jobsFor = (prompt: string) => [...fal.jobs.values()].filter((j) => j.input.prompt === prompt).map((j) => j.apiKey);

  const generate = (key: string, prompt: string, background: boolean) =>
    fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...(background && { Prefer: 'respond-async' }) },
      body: JSON.stringify({ model: 'flux-dev-fal', prompt }),
    });

  it('is not sent to another member: one fal job, the task failed and released', async () => {
    const key = await customer();
    const prompt = `a lighthouse #${++seq}`;
    const res = await generate(key, prompt, false);
    const id = res.headers.get('x-task-id')!;
    expect(res.status).toBe(502);
    expect(await res.json()).toMatchObject({ error: { code: 'upstream_error', message: expect.stringMatching(/without a request id.*nothing was charged/) } });
    expect(jobsFor(prompt)).toEqual(['fal-a:secret']);
    expect(await taskRow(server, id)).toMatchObject({ status: 'failed', errorCode: 'upstream_error' });
    expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('fails a background task instead of submitting it afresh on a later try: one fal job, released', async () => {
    const key = await customer();
    const prompt = `a lighthouse #${++seq}`;
    const res = await generate(key, prompt, true);
    expect(res.status).toBe(202);
    const id = res.headers.get('x-task-id')!;
    const row = await until(async () => {
      const r = await taskRow(server, id);
      return r.status !== 'processing' && r;
    }, 15_000, 'the task to end');
    expect(row).toMatchObject({ status: 'failed', errorCode: 'upstream_error', retries: 0 });
    expect(jobsFor(prompt)).toEqual(['fal-a:secret']);
    expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
  });
});
