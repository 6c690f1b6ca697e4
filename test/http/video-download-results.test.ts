/**
 * What a finished video's result link answers, and what the gateway makes of it: only an MP4 is
 * stored, charged and served; a page, an error or nothing served with 200, or a body cut short, is a
 * failed download counted in `download_retries` (never `retries`), retried until the link answers
 * the video. A task that fails keeps no output an earlier attempt stored. The real Kling adapter
 * runs against the Kling fake; only the finished job's output link points at this test's own
 * result host, which answers per `mode`.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { KlingTokens } from '../../server/providers/kling/kling-auth.ts';
import { KlingVideoProvider } from '../../server/providers/kling/kling-video.provider.ts';
import type { UpstreamAccount, VideoJob, VideoStatus } from '../../server/providers/types.ts';
import { startKlingFake, type KlingFake } from '../fakes/kling.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until, waitVideoFinished } from '../support/tasks.ts';

type Mode = 'mp4' | 'quicktime' | 'html' | 'json' | 'empty' | 'octet' | 'truncated' | 'gone';

/** An MP4's first box (`ftyp`, brand `brand`) and some bytes after it. */
const isoMedia = (brand: string) => Buffer.concat([Buffer.from([0, 0, 0, 0x18]), Buffer.from(`ftyp${brand}`, 'latin1'), Buffer.alloc(4000, 3)]);
const MP4 = isoMedia('isom');
const QUICKTIME = isoMedia('qt  ');

let mode: Mode = 'mp4';
let results: Server;
let resultsUrl = '';

function answer(res: ServerResponse, type: string, body: Buffer): void {
  res.writeHead(200, { 'content-type': type, 'content-length': String(body.length) });
  res.end(body);
}

/** Kling's adapter, with the output link of a finished job on this test's result host. */
class PointedKling extends KlingVideoProvider {
  override async poll(account: UpstreamAccount, jobId: string, job: VideoJob, signal: AbortSignal): Promise<VideoStatus> {
    const status = await super.poll(account, jobId, job, signal);
    return status.state === 'succeeded' ? { state: 'succeeded', output: { url: `${resultsUrl}/video.mp4?sig=abc` } } : status;
  }
}

let server: TestServer;
let fake: KlingFake;
let seq = 0;

beforeAll(async () => {
  results = createServer((_req, res) => {
    if (mode === 'mp4') answer(res, 'video/mp4', MP4);
    else if (mode === 'quicktime') answer(res, 'application/octet-stream', QUICKTIME);
    else if (mode === 'html') answer(res, 'text/html; charset=utf-8', Buffer.from('<html><body><h1>Link expired</h1><script>alert(document.domain)</script></body></html>'));
    else if (mode === 'json') answer(res, 'application/json', Buffer.from('{"error":"expired"}'));
    else if (mode === 'empty') answer(res, 'video/mp4', Buffer.alloc(0));
    else if (mode === 'octet') answer(res, 'application/octet-stream', Buffer.alloc(16, 7));
    else if (mode === 'gone') res.writeHead(403).end();
    else {
      // Content-Length 100000, half of it sent, then the connection is reset.
      res.writeHead(200, { 'content-type': 'video/mp4', 'content-length': '100000' });
      res.write(Buffer.concat([MP4, Buffer.alloc(50_000 - MP4.length, 1)]));
      setTimeout(() => res.socket?.destroy(), 50);
    }
  });
  await new Promise<void>((resolve) => results.listen(0, '127.0.0.1', resolve));
  resultsUrl = `http://127.0.0.1:${(results.address() as AddressInfo).port}`;

  fake = await startKlingFake({ accounts: [{ accessKey: 'ak-a', secretKey: 'sk-a-secret' }], jobDurationMs: 1000 });
  const tokens = new KlingTokens({ ttlSeconds: 60, renewBeforeSeconds: 5 });
  server = await startTestServer({
    workers: true,
    env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000' },
    overrides: { providers: { kling: { video: new PointedKling({ pollIntervalMs: 100, tokens }) } } },
  });
  const { response } = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition('kling/kling-v3-std')!.model });
  expect(response.status).toBe(201);
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
  results?.closeAllConnections();
  results?.close();
});

async function customer() {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const { response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
    params: { path: { group_id: group.id } },
    body: { name: 'a', provider: 'kling', base_url: fake.url, credentials: { access_key: 'ak-a', secret_key: 'sk-a-secret' }, models: ['kling-v3-std'] },
  });
  expect(response.status).toBe(201);
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, key: key.key };
}

async function createVideo(key: string): Promise<string> {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `vdr-${Date.now()}-${++seq}`, prompt: 'a paper boat', model: 'kling-v3-std', seconds: 5, aspectRatio: '16:9', resolution: '720p' }),
  });
  expect(res.status).toBe(202);
  return ((await res.json()) as { id: string }).id;
}

const taskRow = (id: string) => server.db.selectFrom('videoTasks').select(['status', 'retries', 'downloadRetries', 'lastError']).where('id', '=', id).executeTakeFirstOrThrow();
const filesOf = (id: string) => server.db.selectFrom('files').select(['id', 'contentType', 'bytes']).where('taskId', '=', id).execute();

/**
 * The task's row once its first attempt to store the output ended: a retry of either kind counted
 * and its reason recorded (the step's reschedule, just after the count), or the task's end.
 */
function afterFirstDownload(id: string) {
  return until(async () => {
    const row = await taskRow(id);
    return ((row.downloadRetries > 0 && row.lastError !== null) || row.retries > 0 || row.status === 'completed' || row.status === 'failed') && row;
  }, 20_000, 'the first download of the output');
}

/** Serves the video from now on and waits for the task to complete with it, stored and charged as an MP4. */
async function completesOnceTheVideoIsServed(key: string, id: string) {
  mode = 'mp4';
  const { task } = await waitVideoFinished(server, key, id);
  expect(task.status).toBe('completed');
  expect(await filesOf(id)).toEqual([{ id: expect.any(String), contentType: 'video/mp4', bytes: MP4.length }]);
  expect(await holdOf(server.db, id)).toMatchObject({ status: 'captured' });
}

describe('a result link that answers 200 with something other than the video', () => {
  it.each([
    ['an HTML page', 'html', 'the upstream video download answered text/html, not a video'],
    ['a JSON error', 'json', 'the upstream video download answered application/json, not a video'],
    ['no bytes', 'empty', 'the upstream video download answered no bytes'],
    ['bytes that are not an MP4 (application/octet-stream)', 'octet', 'the upstream video download answered something other than an MP4 video'],
  ] as const)('%s is a failed download, retried on its own budget; nothing is stored or charged until the video comes', async (_what, answered, reason) => {
    mode = answered;
    const c = await customer();
    const id = await createVideo(c.key);
    const row = await afterFirstDownload(id);
    expect(row).toMatchObject({ status: 'in_progress', retries: 0, downloadRetries: 1 });
    expect(row.lastError).toContain(reason);
    expect(await filesOf(id)).toEqual([]);
    expect(await holdOf(server.db, id)).toMatchObject({ status: 'held', captured: 0 });
    await completesOnceTheVideoIsServed(c.key, id);
  });

  it('stores an ISO media file of another brand sent as application/octet-stream as video/mp4, listed and served as one', async () => {
    mode = 'quicktime';
    const c = await customer();
    const id = await createVideo(c.key);
    const { task } = await waitVideoFinished(server, c.key, id);
    expect(task.status).toBe('completed');
    const [file] = await filesOf(id);
    expect(file).toEqual({ id: expect.any(String), contentType: 'video/mp4', bytes: QUICKTIME.length });
    const list = await fetch(`${server.directUrl}/v1/files?purpose=video_output`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(((await list.json()) as { data: { id: string; content_type: string }[] }).data).toEqual([expect.objectContaining({ id: file!.id, content_type: 'video/mp4' })]);
    const content = await fetch(`${server.directUrl}/v1/files/${file!.id}/content`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(content.status).toBe(200);
    expect([content.headers.get('content-type'), content.headers.get('x-content-type-options'), content.headers.get('content-disposition')]).toEqual([
      'video/mp4',
      'nosniff',
      `inline; filename="${file!.id}.mp4"`,
    ]);
    expect(Buffer.from(await content.arrayBuffer()).equals(QUICKTIME)).toBe(true);
  });
});

describe('a result body cut off mid-stream', () => {
  it('is a failed download counted in download_retries (not an internal error retried until the deadline), then completes', async () => {
    mode = 'truncated';
    const c = await customer();
    const id = await createVideo(c.key);
    const row = await afterFirstDownload(id);
    expect(row).toMatchObject({ status: 'in_progress', retries: 0, downloadRetries: 1 });
    expect(row.lastError).toContain('the upstream video download broke off before the video was complete');
    expect(await filesOf(id)).toEqual([]);
    await completesOnceTheVideoIsServed(c.key, id);
  });
});

describe('the output an attempt stored before it died', () => {
  it('is gone when the next attempt fails the task for good: a refunded task lists and serves no video', async () => {
    mode = 'gone';
    const c = await customer();
    const id = await createVideo(c.key);
    // What a crash between storing the output and completing the task leaves: the file, named by its task.
    const left = await server.ctx.services.files.save({ accountId: c.accountId, purpose: 'video_output', contentType: 'video/mp4', taskId: id }, MP4);
    const { task } = await waitVideoFinished(server, c.key, id);
    expect(task.status).toBe('failed');
    expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
    expect(await filesOf(id)).toEqual([]);
    const content = await fetch(`${server.directUrl}/v1/files/${left.id}/content`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(content.status).toBe(404);
  });
});

describe("deleting an earlier attempt's unpublished output (VideoTaskRepository.deleteUnpublishedOutputs)", () => {
  it('holds only while the attempt is the task’s and the task unfinished: an attempt that was taken over deletes nothing', async () => {
    mode = 'html';
    const c = await customer();
    const id = await createVideo(c.key);
    await afterFirstDownload(id);
    const repo = server.ctx.repositories.videoTasks;
    // Parked between attempts (unleased, not due): the engine leaves it alone while this test acts as its workers.
    const { attempt } = await until(
      () => server.db.updateTable('videoTasks').set({ nextRunAt: sql`now() + interval '1 hour'` }).where('id', '=', id).where('leaseOwner', 'is', null).where('status', '=', 'in_progress').returning('attempt').executeTakeFirst(),
      10_000,
      'the task between two attempts',
    );
    // What a crash between storing the output and completing the task leaves.
    const stored = await server.ctx.services.files.save({ accountId: c.accountId, purpose: 'video_output', contentType: 'video/mp4', taskId: id }, MP4);
    // The attempt before this one (a worker whose lease another worker took over) deletes nothing.
    expect(await repo.deleteUnpublishedOutputs({ id, attempt: attempt - 1 })).toBeUndefined();
    expect(await filesOf(id)).toHaveLength(1);
    // The current attempt deletes it, and gets its storage key to remove the bytes.
    expect(await repo.deleteUnpublishedOutputs({ id, attempt })).toEqual([stored.storageKey]);
    expect(await filesOf(id)).toEqual([]);
    expect(await repo.deleteUnpublishedOutputs({ id, attempt })).toEqual([]);

    // A completed task's output is its own: no attempt deletes it, not even the one that completed it.
    mode = 'mp4';
    await server.db.updateTable('videoTasks').set({ nextRunAt: sql`now()` }).where('id', '=', id).execute();
    expect((await waitVideoFinished(server, c.key, id)).task.status).toBe('completed');
    const done = await server.db.selectFrom('videoTasks').select('attempt').where('id', '=', id).executeTakeFirstOrThrow();
    expect(await repo.deleteUnpublishedOutputs({ id, attempt: done.attempt })).toBeUndefined();
    expect(await filesOf(id)).toHaveLength(1);
  });
});

describe('serving a stored file', () => {
  it('sends a type outside the contract (stored before downloads were checked) as bytes to save, never inline on this origin', async () => {
    const c = await customer();
    const page = await server.ctx.services.files.save({ accountId: c.accountId, purpose: 'video_output', contentType: 'text/html' }, Buffer.from('<script>alert(document.domain)</script>'));
    const res = await fetch(`${server.directUrl}/v1/files/${page.id}/content`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(res.status).toBe(200);
    expect([res.headers.get('content-type'), res.headers.get('x-content-type-options'), res.headers.get('content-disposition')]).toEqual([
      'application/octet-stream',
      'nosniff',
      `attachment; filename="${page.id}.bin"`,
    ]);
    await res.arrayBuffer();
  });
});
