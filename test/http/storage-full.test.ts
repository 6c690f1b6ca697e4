/**
 * A full media disk, for real: the gateway's MEDIA_DIR is a small tmpfs (mounting needs root; the
 * tests are skipped elsewhere, see test/support/full-disk.ts) filled with a filler file. A full
 * disk is the gateway's own fault: every request that needs it answers 507 storage_full at once
 * (uploads and media bodies stop being read), charges and holds nothing, keeps no file and no row,
 * leaves no task `needs_attention`; an image stream keeps charged only what it delivered; a video
 * whose output cannot be stored waits and is retried; and once the filler is removed the same
 * requests succeed without a restart.
 */
import { randomUUID } from 'node:crypto';
import { request } from 'node:http';
import sharp from 'sharp';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { instantImageProvider, instantVideoProvider } from '../fakes/providers.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { FullDisk, canMount } from '../support/full-disk.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { accountState, holdOf, until, waitImageTask, waitVideoFinished } from '../support/tasks.ts';
import { TEST_CA, startHttpsReceiver, type HttpsReceiver } from '../support/tls.ts';

type Json = Record<string, any>;
const MiB = 1024 * 1024;

/** A PNG of random pixels (incompressible): about `width × height × 3` bytes. */
async function noisePng(width: number, height: number): Promise<Buffer> {
  const raw = Buffer.alloc(width * height * 3);
  for (let i = 0; i < raw.length; i++) raw[i] = (i * 2654435761) >>> 24;
  return sharp(raw, { raw: { width, height, channels: 3 } }).png({ compressionLevel: 0 }).toBuffer();
}

describe.skipIf(!canMount)('a full media disk (a real tmpfs; needs root)', () => {
  let disk: FullDisk;
  let server: TestServer;
  let receiver: HttpsReceiver;
  /** What the upstream returns for every image: about 1 MiB (a 4K image's size). */
  let image: Buffer;
  /** A small image for inputs. */
  let frame: Buffer;
  const video = Buffer.alloc(MiB, 9);

  beforeAll(async () => {
    image = await noisePng(640, 540);
    frame = await noisePng(300, 200);
    receiver = await startHttpsReceiver((_req, res) => {
      res.writeHead(200, { 'content-type': 'image/png', 'content-length': frame.length });
      res.end(frame);
    });
    disk = FullDisk.mount(24 * MiB);
    server = await startTestServer({
      workers: true,
      // Longer than a test may take: a stalled upload is answered only by a server that stops reading it.
      env: { MEDIA_DIR: disk.dir, BODY_IDLE_TIMEOUT_MS: '120000' },
      overrides: {
        providers: { local: { image: instantImageProvider(image), video: instantVideoProvider(video) } },
        outboundFetch: { ca: TEST_CA, treatAsPublic: ['127.0.0.1'], resolve: async () => [{ address: '127.0.0.1', family: 4 }] },
      },
    });
    await seedCatalog(server.db);
  });
  afterEach(() => disk.release());
  afterAll(async () => {
    await server?.close();
    await receiver?.close();
    disk?.unmount();
  });

  const money = (c: { accountId: string; apiKeyId: string }) => accountState(server.db, c.accountId, c.apiKeyId);
  const filesOf = (accountId: string) => server.db.selectFrom('files').select(['id', 'purpose', 'taskId']).where('accountId', '=', accountId).execute();
  const imageTasksOf = (accountId: string) => server.db.selectFrom('imageTasks').select(['id', 'status']).where('accountId', '=', accountId).execute();
  const headers = (key: string, extra: Record<string, string> = {}) => ({ Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...extra });
  /** The contract lane's check of a response that went through Prism. */
  const conforms = (res: Response) => expect(res.headers.get('sl-violations')).toBeNull();

  /** A raw POST that sends `head` and then stalls; resolves with the answer, or 'closed'. */
  function stalledPost(key: string, path: string, contentType: string, length: number, head: Buffer) {
    const url = new URL(`${server.directUrl}${path}`);
    return new Promise<{ status: number; retryAfter: string | undefined; body: Json } | 'closed'>((resolve) => {
      const req = request({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': contentType, 'Content-Length': length } }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          resolve({ status: res.statusCode ?? 0, retryAfter: res.headers['retry-after'] as string | undefined, body: JSON.parse(Buffer.concat(chunks).toString() || '{}') as Json });
          req.destroy();
        });
      });
      req.on('error', () => resolve('closed'));
      req.write(head); // and nothing more: the client stalls
    });
  }

  it('POST /v1/files answers 507 storage_full at once without reading the rest, keeps no file and no row, and works once space returns', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = disk.files();
    disk.fill();
    const boundary = 'mediagate-full-disk';
    const head = Buffer.concat([
      Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ninput\r\n--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.png"\r\nContent-Type: image/png\r\n\r\n`),
      image.subarray(0, 512 * 1024),
    ]);
    // The client stalls after its first bytes: a server waiting for the rest would not answer within the test.
    const answer = await stalledPost(c.key, '/v1/files', `multipart/form-data; boundary=${boundary}`, head.length + image.length, head);
    expect(answer).not.toBe('closed');
    const { status, retryAfter, body } = answer as Exclude<typeof answer, 'closed'>;
    expect([status, body.error.code, body.error.type, retryAfter]).toEqual([507, 'storage_full', 'server_error', '60']);
    expect(await filesOf(c.accountId)).toEqual([]);
    expect(disk.files()).toEqual(before);
    expect(server.logs.some((l) => l.includes('"level":50') && l.includes('ENOSPC') && l.includes('upload/'))).toBe(true);

    // A complete upload while full (its 507 checked by the contract lane), then the same once space
    // returns (direct: Prism does not pass multipart image bytes through intact).
    const upload = (base: string) => {
      const form = new FormData();
      form.append('purpose', 'input');
      form.append('file', new Blob([frame], { type: 'image/png' }), 'frame.png');
      return fetch(`${base}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    };
    const full = await upload(server.baseUrl);
    conforms(full);
    expect([full.status, ((await full.json()) as Json).error.code]).toEqual([507, 'storage_full']);
    disk.release();
    const ok = await upload(server.directUrl);
    expect(ok.status).toBe(201);
    expect(await filesOf(c.accountId)).toEqual([{ id: ((await ok.json()) as Json).id, purpose: 'upload', taskId: null }]);
  });

  it('a 4K image with response_format=url answers 507 at once, fails its task and releases all 12 credits; the same request works once space returns', async () => {
    const c = await createCustomer(server.db, { balance: 20 });
    const before = disk.files();
    disk.fill();
    const body = { prompt: 'a lighthouse', model: 'local-image-1', n: 3, aspectRatio: '16:9', resolution: '4K', response_format: 'url' as const };
    const full = await server.client(c.key).POST('/v1/images/generations', { body });
    expect([full.response.status, full.error?.error.code, full.error?.error.type, full.response.headers.get('retry-after')]).toEqual([507, 'storage_full', 'server_error', '60']);
    const taskId = full.response.headers.get('x-task-id')!;
    expect(full.error?.error.message).toContain(`Task ${taskId} failed; nothing was charged.`);
    const task = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: taskId } } });
    expect(task.data).toMatchObject({ status: 'failed', error: { code: 'storage_full' } });
    expect(await holdOf(server.db, taskId)).toEqual({ amount: 12_000_000, status: 'released', captured: 0 });
    expect(await money(c)).toMatchObject({ balance: 20_000_000, creditsUsed: 0 });
    expect(await filesOf(c.accountId)).toEqual([]);
    expect(disk.files()).toEqual(before);

    disk.release();
    const ok = await server.client(c.key).POST('/v1/images/generations', { body });
    expect(ok.response.status).toBe(200);
    expect((ok.data as Json).data).toHaveLength(3);
    expect(await holdOf(server.db, ok.response.headers.get('x-task-id')!)).toEqual({ amount: 12_000_000, status: 'captured', captured: 12_000_000 });
    expect(await money(c)).toMatchObject({ balance: 8_000_000 });
  });

  it('a JSON answer with URLs whose second image does not fit delivers nothing: 507, everything released, the stored first copy removed', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = disk.files();
    disk.fill(image.length * 1.5);
    const full = await server.client(c.key).POST('/v1/images/generations', { body: { prompt: 'x', model: 'local-image-1', n: 2, response_format: 'url' } });
    expect([full.response.status, full.error?.error.code]).toEqual([507, 'storage_full']);
    expect(await holdOf(server.db, full.response.headers.get('x-task-id')!)).toEqual({ amount: 2_000_000, status: 'released', captured: 0 });
    expect(await filesOf(c.accountId)).toEqual([]);
    expect(disk.files()).toEqual(before);
    expect(await imageTasksOf(c.accountId)).toEqual([{ id: full.response.headers.get('x-task-id'), status: 'failed' }]);
  });

  it('a stream keeps charged the image it delivered and reports storage_full as its error event; one that delivered nothing fails and releases all', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const stream = async (body: Json) => {
      const res = await fetch(`${server.directUrl}/v1/images/generations`, { method: 'POST', headers: headers(c.key), body: JSON.stringify({ prompt: 'x', model: 'local-image-1', stream: true, ...body }) });
      const text = await res.text();
      const events = [...text.matchAll(/^event: (.+)$/gm)].map((m) => m[1]);
      const error = /event: error\ndata: (.+)/.exec(text);
      return { status: res.status, taskId: res.headers.get('x-task-id')!, events, error: error ? (JSON.parse(error[1]!) as Json).error : undefined };
    };
    disk.fill(image.length * 1.5);
    const one = await stream({ n: 2, response_format: 'url' });
    expect([one.status, one.events]).toEqual([200, ['image_generation.completed', 'error']]);
    expect(one.error).toMatchObject({ code: 'storage_full', type: 'server_error' });
    expect(await holdOf(server.db, one.taskId)).toEqual({ amount: 2_000_000, status: 'captured', captured: 1_000_000 });
    expect(await server.db.selectFrom('imageTasks').select(['status', 'delivered']).where('id', '=', one.taskId).executeTakeFirstOrThrow()).toEqual({ status: 'completed', delivered: 1 });
    expect((await filesOf(c.accountId)).map((f) => f.taskId)).toEqual([one.taskId]);
    disk.release();

    disk.fill();
    const none = await stream({ n: 1 });
    expect([none.status, none.events, none.error?.code]).toEqual([200, ['error'], 'storage_full']);
    expect(await holdOf(server.db, none.taskId)).toEqual({ amount: 1_000_000, status: 'released', captured: 0 });
    expect(await money(c)).toMatchObject({ balance: 9_000_000 });
    expect((await filesOf(c.accountId)).map((f) => f.taskId)).toEqual([one.taskId]);
  });

  it('a b64_json JSON answer still carries and charges its images; the copies that could not be stored are left out of the task', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = disk.files();
    disk.fill();
    const res = await server.client(c.key).POST('/v1/images/generations', { body: { prompt: 'x', model: 'local-image-1', n: 2 } });
    expect(res.response.status).toBe(200);
    expect(((res.data as Json).data as Json[]).map((d) => Buffer.from(d.b64_json as string, 'base64').equals(image))).toEqual([true, true]);
    const taskId = res.response.headers.get('x-task-id')!;
    expect(await holdOf(server.db, taskId)).toEqual({ amount: 2_000_000, status: 'captured', captured: 2_000_000 });
    const row = await server.db.selectFrom('imageTasks').select(['status', 'delivered', 'resultFileIds']).where('id', '=', taskId).executeTakeFirstOrThrow();
    expect(row).toEqual({ status: 'completed', delivered: 2, resultFileIds: [] });
    expect(await filesOf(c.accountId)).toEqual([]);
    expect(disk.files()).toEqual(before);
  });

  it('a respond-async image run by the engine fails with storage_full and releases its hold (never needs_attention)', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    disk.fill();
    const res = await fetch(`${server.directUrl}/v1/images/generations`, { method: 'POST', headers: headers(c.key, { Prefer: 'respond-async' }), body: JSON.stringify({ prompt: 'x', model: 'local-image-1', n: 2, response_format: 'url' }) });
    expect(res.status).toBe(202);
    const taskId = res.headers.get('x-task-id')!;
    const row = await waitImageTask(server.db, taskId, (r) => r.status !== 'processing');
    expect(row).toMatchObject({ status: 'failed', errorCode: 'storage_full', delivered: 0 });
    expect(await holdOf(server.db, taskId)).toEqual({ amount: 2_000_000, status: 'released', captured: 0 });
    expect(await filesOf(c.accountId)).toEqual([]);
  });

  it('a multipart edit whose second input does not fit answers 507: no task, no hold, no input kept', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = disk.files();
    disk.fill(frame.length * 1.5);
    const form = new FormData();
    form.append('prompt', 'x');
    form.append('model', 'local-image-1');
    for (let i = 0; i < 2; i++) form.append('image[]', new Blob([frame], { type: 'image/png' }), `in${i}.png`);
    const res = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    expect([res.status, ((await res.json()) as Json).error.code, res.headers.get('retry-after')]).toEqual([507, 'storage_full', '60']);
    expect(await imageTasksOf(c.accountId)).toEqual([]);
    expect((await money(c)).holds).toEqual([]);
    expect(await filesOf(c.accountId)).toEqual([]);
    expect(disk.files()).toEqual(before);
  });

  it('a video with a data URL input answers 507 at once without reading the rest, holds nothing, keeps nothing, and is created once space returns', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = disk.files();
    disk.fill();
    const body = (firstFrame: string) => ({ client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', firstFrame });
    const json = Buffer.from(JSON.stringify(body(`data:image/png;base64,${image.toString('base64')}`)));
    const answer = await stalledPost(c.key, '/v1/videos/generations', 'application/json', json.length, json.subarray(0, json.length - 100_000));
    expect(answer).not.toBe('closed');
    const { status, retryAfter, body: error } = answer as Exclude<typeof answer, 'closed'>;
    expect([status, error.error.code, retryAfter]).toEqual([507, 'storage_full', '60']);
    await until(async () => (await filesOf(c.accountId)).length === 0, 3000, 'staged inputs to be removed');
    expect(await money(c)).toMatchObject({ balance: 10_000_000, holds: [], tasks: 0 });
    expect(disk.files()).toEqual(before);

    // Through the contract lane: a data URL, and an https URL input (not the URL's fault: 507, not 400).
    const frameUrl = `data:image/png;base64,${frame.toString('base64')}`;
    for (const firstFrame of [frameUrl, `https://receiver.test:${receiver.port}/frame.png`]) {
      const full = await server.client(c.key).POST('/v1/videos/generations', { body: body(firstFrame) });
      expect([full.response.status, full.error?.error.code]).toEqual([507, 'storage_full']);
    }
    await until(async () => (await filesOf(c.accountId)).length === 0, 3000, 'staged inputs to be removed');
    expect(await money(c)).toMatchObject({ balance: 10_000_000, holds: [], tasks: 0 });

    disk.release();
    const created = await server.client(c.key).POST('/v1/videos/generations', { body: body(frameUrl) });
    expect(created.response.status).toBe(202);
  });

  it('a video whose output does not fit waits in_progress with its hold kept, is retried, and completes once space returns, charged once', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    disk.fill();
    const created = await server.client(c.key).POST('/v1/videos/generations', {
      body: { client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' },
    });
    expect(created.response.status).toBe(202);
    const id = created.data!.id;
    // Two finalize attempts failed on the full disk.
    await until(async () => ((await server.db.selectFrom('videoTasks').select('retries').where('id', '=', id).executeTakeFirstOrThrow()).retries >= 2 ? true : undefined), 15_000, 'two retries');
    const waiting = await server.client(c.key).GET('/v1/videos/{id}', { params: { path: { id } } });
    expect(waiting.data).toMatchObject({ status: 'in_progress' });
    expect(await holdOf(server.db, id)).toEqual({ amount: 100_000, status: 'held', captured: 0 });
    expect(await filesOf(c.accountId)).toEqual([]);
    expect(server.logs.some((l) => l.includes('"level":50') && l.includes(id) && l.includes('the video output could not be stored'))).toBe(true);

    disk.release();
    const { task } = await waitVideoFinished(server, c.key, id, 20_000);
    expect(task).toMatchObject({ status: 'completed', billing: { actualCredits: 0.1 } });
    expect(await holdOf(server.db, id)).toEqual({ amount: 100_000, status: 'captured', captured: 100_000 });
    const captures = await server.db.selectFrom('ledgerEntries').select('amount').where('taskId', '=', id).where('kind', '=', 'capture').execute();
    expect(captures).toEqual([{ amount: 100_000 }]);
    expect(await money(c)).toMatchObject({ balance: 9_900_000 });
    const download = await fetch(task.video_url!);
    expect(Buffer.from(await download.arrayBuffer()).equals(video)).toBe(true);
  });
});
