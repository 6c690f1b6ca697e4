/**
 * A task's outputs in the operator's view (issue 33): GET /admin/v1/tasks/{task_id} lists the media
 * a task made that are still stored, each with a fresh download URL of the same kind the client's
 * lookup carries. A local video rendered to completion has one (the URL downloads its MP4 bytes as
 * video/mp4, the file the client's `video_url` names); a synchronous image task of two images has
 * both, in order, with their sizes; a task whose only image was lost on its way to the store is
 * needs_attention and then, refunded by the operator, failed — with none; outputs past their
 * retention are left out as the client's lookup leaves them out. The admin CLI's `tasks show`
 * signs the same URLs from the same configuration and secret key. A store that cannot make the
 * links (presigned URLs whose credentials fail to load) answers the view and the settlement 503
 * storage_unavailable, not 500; the settlement then settles nothing, so the operator retries it.
 * Calls go through `admin()` (Prism in the contract lane), so `outputs` is checked against the contract.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FilesystemMediaStore } from '../../server/storage/media-store.ts';
import { BrokenOutputStore, PresignFailingStore } from '../fakes/media-stores.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';
import { adminCli } from '../support/admin-cli.ts';

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let server: TestServer;
let mediaDir: string;
let customer: Awaited<ReturnType<typeof createCustomer>>;

async function postJson(path: string, body: unknown) {
  const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${customer.key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Json, taskId: res.headers.get('x-task-id') };
}

async function getTask(id: string): Promise<Json> {
  const res = await server.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: id } } });
  expect(res.response.status, JSON.stringify(res.error)).toBe(200);
  return res.data as Json;
}

async function download(url: string): Promise<{ status: number; type: string | null; bytes: Buffer }> {
  const res = await fetch(url);
  return { status: res.status, type: res.headers.get('content-type'), bytes: Buffer.from(await res.arrayBuffer()) };
}

const fileIdOf = (url: string) => new URL(url).pathname.split('/').pop()!;

beforeAll(async () => {
  mediaDir = mkdtempSync(join(tmpdir(), 'mediagate-outputs-media-'));
  // The first image output written is lost (an error the store does not classify: outcome
  // unknown, so its task is left needs_attention); every later write succeeds.
  server = await startTestServer({ workers: true, env: { MEDIA_DIR: mediaDir }, overrides: { mediaStore: new BrokenOutputStore(new FilesystemMediaStore(mediaDir), 0, 1) } });
  await seedCatalog(server.db);
  customer = await createCustomer(server.db, { balance: 100 });
}, 60_000);

afterAll(async () => {
  await server?.close();
  if (mediaDir) rmSync(mediaDir, { recursive: true, force: true, maxRetries: 5 });
});

describe('GET /admin/v1/tasks/{task_id}: outputs', () => {
  let videoId = '';

  it('an image whose stored copy was lost: none while needs_attention, none once refunded and failed', async () => {
    const res = await postJson('/v1/images/generations', { model: 'local-image-1', prompt: 'a lost kite', response_format: 'url' });
    expect(res.status).toBe(500);
    const id = res.taskId!;
    const attention = await getTask(id);
    expect(attention).toMatchObject({ status: 'needs_attention', outputs: [] });

    const settled = await server.admin().POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: id } }, body: { outcome: 'refunded', reason: 'never delivered' } });
    expect(settled.response.status).toBe(200);
    expect(settled.data).toMatchObject({ status: 'failed', outputs: [] });
    expect(await getTask(id)).toMatchObject({ status: 'failed', outputs: [] });
    // Settled once: a second settlement is refused.
    const again = await server.admin().POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: id } }, body: { outcome: 'completed', reason: 'twice' } });
    expect([again.response.status, again.error?.error.code]).toEqual([409, 'task_not_settleable']);
  });

  it('a completed local video: one output whose URL downloads its MP4 as video/mp4, the file of the client’s video_url', async () => {
    const created = await postJson('/v1/videos/generations', { client_request_id: randomUUID(), prompt: 'a lighthouse', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' });
    expect(created.status, JSON.stringify(created.body)).toBe(202);
    videoId = created.body.id;
    expect((await getTask(videoId)).outputs).toEqual([]); // not finished yet
    const client = await until(
      async () => {
        const res = await fetch(`${server.directUrl}/v1/videos/${videoId}`, { headers: { Authorization: `Bearer ${customer.key}` } });
        const body = (await res.json()) as Json;
        return body.status === 'completed' ? body : undefined;
      },
      60_000,
      'the video to complete',
    );

    const task = await getTask(videoId);
    expect(task.status).toBe('completed');
    // A video task is settled by its engine, never by hand: 409, not 404 (the contract).
    const settle = await server.admin().POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: videoId } }, body: { outcome: 'refunded', reason: 'by hand' } });
    expect([settle.response.status, settle.error?.error.code]).toEqual([409, 'task_not_settleable']);
    expect(task.outputs).toHaveLength(1);
    const [out] = task.outputs as Json[];
    expect(out).toEqual({
      file_id: fileIdOf(client.video_url),
      url: expect.stringMatching(new RegExp(`^${server.directUrl}/v1/files/${out!.file_id}\\?expires=\\d+&signature=`)),
      content_type: 'video/mp4',
      bytes: expect.any(Number),
      width: null,
      height: null,
      expires_at: client.media_expires_at,
    });
    const file = await download(out!.url);
    expect(file.status).toBe(200);
    expect(file.type).toBe('video/mp4');
    expect(file.bytes.length).toBe(out!.bytes);
    expect(file.bytes.subarray(4, 8).toString('latin1')).toBe('ftyp'); // an MP4, not an error page
    // The same bytes as the client's own link.
    expect((await download(client.video_url)).bytes.equals(file.bytes)).toBe(true);
  }, 90_000);

  it('a completed image task: each image in order, with its size, type and bytes; none once retention expired them', async () => {
    const res = await postJson('/v1/images/generations', { model: 'local-image-1', prompt: 'two harbours', n: 2, size: '1024x1024', response_format: 'url' });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const id = res.taskId!;
    const task = await getTask(id);
    expect(task.status).toBe('completed');
    const outputs = task.outputs as Json[];
    expect(outputs.map((o) => o.file_id)).toEqual((res.body.data as Json[]).map((d) => fileIdOf(d.url)));
    for (const out of outputs) {
      expect(out).toMatchObject({ content_type: 'image/png', width: expect.any(Number), height: expect.any(Number), expires_at: expect.any(String) });
      const file = await download(out.url);
      expect(file.status).toBe(200);
      expect(file.type).toBe('image/png');
      expect(file.bytes.length).toBe(out.bytes);
      expect(file.bytes.subarray(1, 4).toString('latin1')).toBe('PNG');
      // The size recorded is the image's own (its PNG header), a square as asked.
      expect([file.bytes.readUInt32BE(16), file.bytes.readUInt32BE(20)]).toEqual([out.width, out.height]);
      expect(out.width).toBe(out.height);
    }

    // Past retention (the media sweeper removes such files within a minute): no output is shown,
    // as the client's lookup shows no media any more.
    await server.db
      .updateTable('files')
      .set({ expiresAt: new Date(Date.now() - 1000) })
      .where(
        'id',
        'in',
        outputs.map((o) => o.file_id as string),
      )
      .execute();
    expect(await getTask(id)).toMatchObject({ status: 'completed', outputs: [] });
  });

  it('the admin CLI’s tasks show signs the same kind of URL from the same configuration', async () => {
    const { code, stdout, stderr } = await adminCli(['tasks', 'show', videoId, '--json'], {
      DATABASE_URL: server.config.databaseUrl!,
      MEDIAGATE_SECRET_KEY: server.secretKey.toString('hex'),
      PUBLIC_BASE_URL: server.directUrl,
      MEDIA_DIR: mediaDir,
    });
    expect([code, stderr]).toEqual([0, '']);
    const shown = JSON.parse(stdout) as Json;
    const api = await getTask(videoId);
    const { outputs: cliOutputs, ...cliRest } = shown;
    const { outputs: apiOutputs, ...apiRest } = api;
    expect(cliRest).toEqual(apiRest);
    expect(cliOutputs.map(({ url: _, ...o }: Json) => o)).toEqual(apiOutputs.map(({ url: _, ...o }: Json) => o));
    const file = await download(cliOutputs[0].url);
    expect([file.status, file.type, file.bytes.length]).toEqual([200, 'video/mp4', apiOutputs[0].bytes]);
  }, 60_000);
});


describe('outputs whose links the media store cannot make', () => {
  let s: TestServer;
  const dir = mkdtempSync(join(tmpdir(), 'mediagate-outputs-presign-'));
  // The second image output written is lost (outcome unknown): a stream of two leaves its task
  // needs_attention with the first image, delivered, as its output.
  const store = new PresignFailingStore(new BrokenOutputStore(new FilesystemMediaStore(dir), 1, 2));
  beforeAll(async () => {
    s = await startTestServer({ env: { MEDIA_STORE: 's3', S3_BUCKET: 'b', S3_ENDPOINT: 'http://127.0.0.1:9', MEDIA_URLS: 'presigned' }, overrides: { mediaStore: store } });
    await seedCatalog(s.db);
  }, 60_000);
  afterAll(async () => {
    await s?.close();
    rmSync(dir, { recursive: true, force: true, maxRetries: 5 });
  });

  it('the view and the settlement answer 503 storage_unavailable; the settlement settles nothing until the links can be made', async () => {
    const c = await createCustomer(s.db, { balance: 10 });
    const res = await fetch(`${s.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'local-image-1', prompt: 'two kites', n: 2, stream: true }),
    });
    expect(res.status).toBe(200);
    await res.text();
    const id = res.headers.get('x-task-id')!;
    const row = await s.db.selectFrom('imageTasks').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'needs_attention', delivered: 1 });
    expect(row.resultFileIds).toHaveLength(1);
    const held = await holdOf(s.db, id);
    expect(held.status).toBe('held');

    const view = await s.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: id } } });
    expect([view.response.status, view.error?.error.code, view.response.headers.get('retry-after')]).toEqual([503, 'storage_unavailable', '30']);

    const settle = () => s.admin().POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: id } }, body: { outcome: 'completed', reason: 'the client got both' } });
    const refused = await settle();
    expect([refused.response.status, refused.error?.error.code, refused.response.headers.get('retry-after')]).toEqual([503, 'storage_unavailable', '30']);
    // Nothing was settled behind the error: the task still needs attention, its hold is untouched.
    expect(await s.db.selectFrom('imageTasks').select('status').where('id', '=', id).executeTakeFirstOrThrow()).toEqual({ status: 'needs_attention' });
    expect(await holdOf(s.db, id)).toEqual(held);

    // Once the store makes links again, the operator's retry settles it, with its output linked.
    store.failing = false;
    const settled = await settle();
    expect(settled.response.status, JSON.stringify(settled.error)).toBe(200);
    expect(settled.data).toMatchObject({ status: 'completed', outputs: [{ file_id: row.resultFileIds[0], url: expect.stringMatching(/^https:\/\/media\.example\.com\/image_output\//) }] });
    expect(await holdOf(s.db, id)).toEqual({ amount: held.amount, status: 'captured', captured: held.amount });
  });
});
