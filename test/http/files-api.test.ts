/**
 * The Files API in OpenAI's shape (issue 27, item 4): a key lists, reads, downloads and deletes its
 * account's uploads and generated media, owner-only; keyset pages stay exact while files are
 * added; a deleted output leaves its task's lookup without it; a file an unfinished task needs
 * cannot be deleted; signed URLs keep working without a key. Calls go through `client()` (Prism in
 * the contract lane) except uploads and raw downloads.
 */
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { sql } from 'kysely';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createWorkers } from '../../server/workers/index.ts';
import { createApiKey, createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until, waitVideoFinished } from '../support/tasks.ts';

type Json = Record<string, any>;
type Customer = Awaited<ReturnType<typeof createCustomer>>;

let server: TestServer;

beforeAll(async () => {
  // No workers: queued tasks stay queued until a test runs the engines (runWorkersUntil).
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

let shade = 0;
/** A small PNG, different every call. */
function png(width = 64, height = 48): Promise<Buffer> {
  shade = (shade + 37) % 256;
  return sharp({ create: { width, height, channels: 3, background: { r: shade, g: 255 - shade, b: 90 } } }).png().toBuffer();
}

/** A half-transparent PNG (a mask: its transparent area is the region to edit). */
function maskPng(width: number, height: number): Promise<Buffer> {
  return sharp({ create: { width, height, channels: 4, background: { r: 0, g: 0, b: 0, alpha: 0.5 } } }).png().toBuffer();
}

async function upload(key: string, bytes: Buffer, name = 'frame.png'): Promise<Json> {
  const form = new FormData();
  form.append('purpose', 'input');
  form.append('file', new Blob([bytes], { type: 'image/png' }), name);
  const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form });
  expect(res.status).toBe(201);
  return (await res.json()) as Json;
}

async function postJson(key: string, path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Json, taskId: res.headers.get('x-task-id') };
}

/** A synchronous image generation with URLs: its task id and the ids of its output files. */
async function generateImages(key: string, n = 1): Promise<{ taskId: string; fileIds: string[]; urls: string[] }> {
  const res = await postJson(key, '/v1/images/generations', { model: 'local-image-1', prompt: 'a harbour', n, response_format: 'url', size: '1024x1024' });
  expect(res.status).toBe(200);
  const urls = (res.body.data as { url: string }[]).map((d) => d.url);
  return { taskId: res.taskId!, urls, fileIds: urls.map((u) => new URL(u).pathname.split('/').pop()!) };
}

const video = (extra: Json = {}) => ({ client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', ...extra });

/** Runs the task engines on the test server until `done` holds. */
async function runWorkersUntil<T>(done: () => Promise<T | undefined | false>, timeoutMs = 30_000): Promise<T> {
  const workers = createWorkers(server.ctx);
  workers.start();
  try {
    return await until(done, timeoutMs, 'the tasks to finish');
  } finally {
    await workers.stop();
  }
}

const list = async (key: string, query: Json = {}) => {
  const res = await server.client(key).GET('/v1/files', { params: { query } });
  return { status: res.response.status, body: (res.data ?? res.error) as Json, headers: res.response.headers };
};
const retrieve = async (key: string | undefined, id: string, query: Json = {}) => {
  const res = await server.client(key).GET('/v1/files/{file_id}', { params: { path: { file_id: id }, query } });
  return { status: res.response.status, body: (res.data ?? res.error) as Json, headers: res.response.headers };
};
const remove = async (key: string, id: string) => {
  const res = await server.client(key).DELETE('/v1/files/{file_id}', { params: { path: { file_id: id } } });
  return { status: res.response.status, body: (res.data ?? res.error) as Json, headers: res.response.headers };
};
// Bytes straight from the server: Prism's proxy re-encodes binary bodies (as video-engine.test.ts does).
const content = (key: string, id: string) => fetch(`${server.directUrl}/v1/files/${id}/content`, { headers: { Authorization: `Bearer ${key}` } });
const storedPath = async (id: string) => {
  const row = await server.db.selectFrom('files').select('storageKey').where('id', '=', id).executeTakeFirstOrThrow();
  return join(server.config.mediaDir, row.storageKey);
};

/** Every page of the listing, following `after` = `last_id`; `between` runs before each next page. */
async function allPages(key: string, query: Json, between: (page: number) => Promise<void> = async () => {}): Promise<string[]> {
  const ids: string[] = [];
  let after: string | undefined;
  for (let page = 1; ; page++) {
    const res = await list(key, { ...query, ...(after && { after }) });
    expect(res.status).toBe(200);
    const data = res.body.data as Json[];
    expect(res.body.first_id).toBe(data[0]?.id ?? null);
    expect(res.body.last_id).toBe(data.at(-1)?.id ?? null);
    ids.push(...data.map((f) => f.id as string));
    if (!res.body.has_more) return ids;
    after = res.body.last_id;
    await between(page);
  }
}

describe('GET /v1/files', () => {
  it("lists the account's uploads and generated images, newest first; not its request inputs, expired uploads or other accounts' files", async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const other = await createCustomer(server.db, { balance: 100 });
    const a = await upload(c.key, await png(), 'a.png');
    const b = await upload(c.key, await png(), 'b.png');
    const generated = await generateImages(c.key);
    // An edit with an inline image: its input is a copy that belongs to the task, not a listed file.
    const edit = await postJson(c.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'x', images: [`data:image/png;base64,${(await png()).toString('base64')}`] });
    expect(edit.status).toBe(200);
    const expired = await upload(c.key, await png());
    await server.db.updateTable('files').set({ expiresAt: new Date(Date.now() - 1000) }).where('id', '=', expired.id).execute();
    const foreign = await upload(other.key, await png());
    // An upload whose body is still arriving: recorded, not yet inspected and confirmed.
    const arriving = `file_arriving${randomUUID().replace(/-/g, '')}`;
    await server.db
      .insertInto('files')
      .values({ id: arriving, accountId: c.accountId, purpose: 'upload', contentType: 'application/octet-stream', bytes: 0, storageKey: `upload/xx/${arriving}.bin`, expiresAt: new Date(Date.now() + 3_600_000), filename: 'big.png' })
      .execute();
    const editOutput = await server.db.selectFrom('files').select('id').where('taskId', '=', edit.taskId).where('purpose', '=', 'image_output').executeTakeFirstOrThrow();

    const res = await list(c.key);
    expect(res.status).toBe(200);
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect(res.body).toMatchObject({ object: 'list', has_more: false });
    expect(res.body.data.map((f: Json) => f.id)).toEqual([editOutput.id, generated.fileIds[0], b.id, a.id]);
    expect(res.body.data[1]).toEqual({
      id: generated.fileIds[0],
      object: 'file',
      purpose: 'image_output',
      filename: '',
      bytes: expect.any(Number),
      content_type: 'image/png',
      width: 1024,
      height: 1024,
      created_at: expect.stringMatching(/^\d{4}-/),
      expires_at: expect.stringMatching(/^\d{4}-/),
      task_id: generated.taskId,
    });
    expect(res.body.data[3]).toEqual({ ...a, task_id: null });

    expect((await list(c.key, { purpose: 'input' })).body.data.map((f: Json) => f.id)).toEqual([b.id, a.id]);
    expect((await list(c.key, { purpose: 'image_output' })).body.data.map((f: Json) => f.id)).toEqual([editOutput.id, generated.fileIds[0]]);
    expect((await list(c.key, { order: 'asc' })).body.data.map((f: Json) => f.id)).toEqual([a.id, b.id, generated.fileIds[0], editOutput.id]);
    expect((await list(other.key)).body.data.map((f: Json) => f.id)).toEqual([foreign.id]);
    expect((await retrieve(c.key, arriving)).status).toBe(404);
  });

  it('pages with after = last_id: files uploaded between pages are never listed twice and make none go missing, newest or oldest first', async () => {
    const c = await createCustomer(server.db);
    const originals: string[] = [];
    for (let i = 0; i < 5; i++) originals.push((await upload(c.key, await png())).id);
    const added: string[] = [];
    const addOne = async () => void added.push((await upload(c.key, await png())).id);

    const newestFirst = await allPages(c.key, { limit: 2 }, addOne);
    // Files added while paging newest first are newer than the position: they are not reached.
    expect(newestFirst).toEqual([...originals].reverse());
    expect(added).toHaveLength(2);

    const before = [...originals, ...added];
    added.length = 0;
    const oldestFirst = await allPages(c.key, { limit: 3, order: 'asc' }, addOne);
    // Oldest first, the files added meanwhile come after every earlier one, each once.
    expect(oldestFirst).toEqual([...before, ...added]);
    expect(new Set(oldestFirst).size).toBe(oldestFirst.length);
  });

  it('places an upload when its bytes are in: one whose inspection ends after a later upload is listed after it, not missed oldest first', async () => {
    const c = await createCustomer(server.db);
    const files = server.ctx.repositories.files;
    // Upload U's row is written once its bytes are stored (not listed yet: no type until inspected)…
    const id = `file_slow${randomUUID().replace(/-/g, '').slice(0, 12)}`;
    await files.insert({ id, accountId: c.accountId, purpose: 'upload', contentType: 'application/octet-stream', bytes: 10, storageKey: `upload/xx/${id}`, width: null, height: null, taskId: null, expiresAt: new Date(Date.now() + 3_600_000), filename: 'slow.png' });
    // …a later upload is inspected first and a client walking oldest first passes it…
    const quick = (await upload(c.key, await png())).id as string;
    const first = (await list(c.key, { order: 'asc' })).body.data.map((f: Json) => f.id);
    expect(first).toEqual([quick]);
    // …then U's inspection ends: the walk's next page lists it.
    await files.confirmUpload(id, { contentType: 'image/png', width: 1, height: 1, expiresAt: new Date(Date.now() + 3_600_000) });
    const next = (await list(c.key, { order: 'asc', after: quick })).body.data.map((f: Json) => f.id);
    expect(next).toEqual([id]);
  });

  it('orders files of the same instant by id and pages through them without losing one', async () => {
    const c = await createCustomer(server.db);
    const at = new Date('2026-03-01T12:00:00.123456Z');
    const ids = Array.from({ length: 5 }, (_, i) => `file_sameinstant${i}${randomUUID().replace(/-/g, '').slice(0, 8)}`);
    await server.db
      .insertInto('files')
      .values(ids.map((id) => ({ id, accountId: c.accountId, purpose: 'upload', contentType: 'image/png', bytes: 10, storageKey: `upload/xx/${id}.png`, width: 1, height: 1, expiresAt: new Date(Date.now() + 3_600_000), filename: '', createdAt: at })))
      .execute();
    expect(await allPages(c.key, { limit: 2 })).toEqual([...ids].sort().reverse());
    expect(await allPages(c.key, { limit: 2, order: 'asc' })).toEqual([...ids].sort());
  });

  it("answers 400 invalid_cursor for an after that names no file of the account (unknown, another account's)", async () => {
    const c = await createCustomer(server.db);
    const other = await createCustomer(server.db);
    const mine = await upload(c.key, await png());
    const theirs = await upload(other.key, await png());
    // A deleted file keeps its place for a week: listing-after-deleted.test.ts.
    for (const after of ['file_doesnotexist', theirs.id]) {
      const res = await list(c.key, { after });
      expect([res.status, res.body.error.code, res.body.error.param]).toEqual([400, 'invalid_cursor', 'after']);
    }
    // The last item of the last page is a valid position: an empty page, not an error.
    expect((await list(c.key, { after: mine.id })).body).toEqual({ object: 'list', data: [], first_id: null, last_id: null, has_more: false });
    // Invalid on purpose: straight to the server (Prism would refuse it first).
    const bad = await server.direct(c.key).GET('/v1/files', { params: { query: { limit: 201 } } });
    expect([bad.response.status, bad.error?.error.code, bad.error?.error.param]).toEqual([400, 'invalid_request', 'limit']);
  });
});

describe('GET /v1/files/{file_id}', () => {
  it('answers the file object to its owner only: another account, an unknown id and a request input are 404 file_not_found', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const other = await createCustomer(server.db);
    const up = await upload(c.key, await png(), 'mine.png');
    const res = await retrieve(c.key, up.id);
    expect(res.status).toBe(200);
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect(res.body).toEqual({ ...up, task_id: null });

    const created = await postJson(c.key, '/v1/videos/generations', video({ firstFrame: `data:image/png;base64,${(await png()).toString('base64')}` }));
    expect(created.status).toBe(202);
    const [input] = (await server.db.selectFrom('videoTasks').select('inputFileIds').where('id', '=', created.body.id).executeTakeFirstOrThrow()).inputFileIds;
    for (const [key, id] of [[other.key, up.id], [c.key, 'file_unknown'], [c.key, input!]] as const) {
      const miss = await retrieve(key, id);
      expect([miss.status, miss.body.error.code]).toEqual([404, 'file_not_found']);
    }
  });

  it('needs the key when no signature is sent (401), and both signature parameters or neither (400)', async () => {
    const c = await createCustomer(server.db);
    const up = await upload(c.key, await png());
    const anonymous = await retrieve(undefined, up.id);
    expect([anonymous.status, anonymous.body.error.code]).toEqual([401, 'invalid_api_key']);
    const wrong = await retrieve('mg_0000000000000000000000000000000000', up.id);
    expect([wrong.status, wrong.body.error.code]).toEqual([401, 'invalid_api_key']);
    const off = await createApiKey(server.db, { accountId: c.accountId, groupId: c.groupId, isActive: false });
    const inactive = await fetch(`${server.directUrl}/v1/files/${up.id}`, { headers: { Authorization: `Bearer ${off.key}` } });
    expect([inactive.status, ((await inactive.json()) as Json).error.code]).toEqual([403, 'api_key_inactive']);
    for (const [query, param] of [[{ expires: 1 }, 'signature'], [{ signature: 'abc' }, 'expires']] as const) {
      const half = await retrieve(undefined, up.id, query);
      expect([half.status, half.body.error.code, half.body.error.param]).toEqual([400, 'invalid_request', param]);
    }
  });

  it('does not serve an expired file by its signed URL, even before the sweeper removed it', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const { urls, fileIds } = await generateImages(c.key);
    const signed = new URL(urls[0]!);
    const live = await fetch(`${server.directUrl}${signed.pathname}${signed.search}`);
    expect(live.status).toBe(200);
    await live.arrayBuffer();
    await server.db.updateTable('files').set({ expiresAt: new Date(Date.now() - 3_600_000) }).where('id', '=', fileIds[0]!).execute();
    const expired = await fetch(`${server.directUrl}${signed.pathname}${signed.search}`);
    expect([expired.status, ((await expired.json()) as Json).error.code]).toEqual([404, 'file_not_found']);
  });

  it('still serves a signed URL without a key, ignoring a key sent along (even another account’s)', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const other = await createCustomer(server.db);
    const { urls } = await generateImages(c.key);
    const signed = new URL(urls[0]!);
    for (const headers of [{}, { Authorization: `Bearer ${other.key}` }] as Record<string, string>[]) {
      const res = await fetch(`${server.directUrl}${signed.pathname}${signed.search}`, { headers });
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toBe('image/png');
      expect(res.headers.get('cache-control')).toMatch(/^private, max-age=\d+$/);
      expect((await sharp(Buffer.from(await res.arrayBuffer())).metadata()).width).toBe(1024);
    }
  });
});

describe('POST /v1/files: names and encodings', () => {
  it('keeps a UTF-8 file name as sent, and downloads it under that name (RFC 6266 filename*)', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const up = await upload(c.key, await png(64, 64), 'фото кадр.png');
    expect(up.filename).toBe('фото кадр.png');
    const res = await content(c.key, up.id);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-disposition')).toBe(`inline; filename="____ ____.png"; filename*=UTF-8''${encodeURIComponent('фото кадр.png')}`);
    await res.arrayBuffer();
  });

  it('refuses a compressed multipart upload with 415, before reading it, and stores nothing', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const form = new FormData();
    form.append('purpose', 'input');
    form.append('file', new Blob([await png(64, 64)], { type: 'image/png' }), 'a.png');
    const encoded = new Response(form);
    const body = gzipSync(Buffer.from(await encoded.arrayBuffer()));
    const before = await server.db.selectFrom('files').select(sql<number>`count(*)::int`.as('n')).where('accountId', '=', c.accountId).executeTakeFirstOrThrow();
    const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': encoded.headers.get('content-type')!, 'Content-Encoding': 'gzip' }, body });
    expect(res.status).toBe(415);
    expect(((await res.json()) as Json).error.code).toBe('unsupported_media_type');
    expect(await server.db.selectFrom('files').select(sql<number>`count(*)::int`.as('n')).where('accountId', '=', c.accountId).executeTakeFirstOrThrow()).toEqual(before);
  });
});

describe('GET /v1/files/{file_id}/content', () => {
  it("streams the owner's bytes with their type and length, and is 404 file_not_found for another account", async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const other = await createCustomer(server.db);
    const bytes = await png(200, 100);
    const up = await upload(c.key, bytes);
    const res = await content(c.key, up.id);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('image/png');
    expect(res.headers.get('content-length')).toBe(String(bytes.length));
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect(Buffer.from(await res.arrayBuffer()).equals(bytes)).toBe(true);

    const { fileIds, urls } = await generateImages(c.key);
    const signed = await fetch(urls[0]!.replace(/^http:\/\/[^/]+/, server.directUrl));
    const output = await content(c.key, fileIds[0]!);
    expect(Buffer.from(await output.arrayBuffer()).equals(Buffer.from(await signed.arrayBuffer()))).toBe(true);

    const foreign = await content(other.key, up.id);
    expect([foreign.status, ((await foreign.json()) as Json).error.code]).toEqual([404, 'file_not_found']);
  });
});

describe('a GIF upload', () => {
  it('stays the GIF it was in the Files API, while a video task that uses it is sent the PNG of its first frame, made once', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const frame = await sharp({ create: { width: 320, height: 180, channels: 3, background: { r: 200, g: 40, b: 40 } } }).gif().toBuffer();
    const up = await upload(c.key, frame, 'frame.gif');
    expect([up.content_type, up.bytes]).toEqual(['image/gif', frame.length]);
    const created = await postJson(c.key, '/v1/videos/generations', video({ firstFrame: up.id }));
    expect(created.status).toBe(202);
    await runWorkersUntil(async () => {
      const v = await server.db.selectFrom('videoTasks').select('status').where('id', '=', created.body.id).executeTakeFirstOrThrow();
      return v.status === 'completed' || v.status === 'failed';
    });
    const task = await server.db.selectFrom('videoTasks').select(['status', 'inputFileIds']).where('id', '=', created.body.id).executeTakeFirstOrThrow();
    expect([task.status, task.inputFileIds]).toEqual(['completed', [up.id]]);
    // One PNG copy, kept for every step that sends the frame (submit, the local renderer's download).
    const copies = await server.db.selectFrom('files').select(['id', 'contentType', 'width', 'height', 'purpose']).where('accountId', '=', c.accountId).where('id', 'like', `${up.id}png%`).execute();
    expect(copies).toEqual([{ id: expect.any(String), contentType: 'image/png', width: 320, height: 180, purpose: 'input' }]);

    // The client's file is what it uploaded; the copy is not one of its Files API files.
    const res = await content(c.key, up.id);
    expect(res.headers.get('content-type')).toBe('image/gif');
    expect(Buffer.from(await res.arrayBuffer()).equals(frame)).toBe(true);
    expect((await list(c.key, { purpose: 'input' })).body.data.map((f: Json) => f.id)).toEqual([up.id]);

    // Deleting the upload deletes its copy too: its row, its bytes and every signed URL of it.
    const copyPath = await storedPath(copies[0]!.id);
    expect(existsSync(copyPath)).toBe(true);
    const copyUrl = await server.ctx.services.files.downloadUrl(copies[0]!.id, 'input');
    expect((await fetch(copyUrl.replace(/^http:\/\/[^/]+/, server.directUrl))).status).toBe(200);
    expect((await remove(c.key, up.id)).status).toBe(200);
    expect(await server.db.selectFrom('files').select('id').where('id', 'like', `${up.id}%`).execute()).toEqual([]);
    expect(existsSync(copyPath)).toBe(false);
    expect((await fetch(copyUrl.replace(/^http:\/\/[^/]+/, server.directUrl))).status).toBe(404);
  });
});

describe('DELETE /v1/files/{file_id}', () => {
  it('deletes an upload: its row and bytes go, and it can no longer be read, downloaded, used or deleted again', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const up = await upload(c.key, await png());
    const path = await storedPath(up.id);
    expect(existsSync(path)).toBe(true);
    const res = await remove(c.key, up.id);
    expect([res.status, res.body, res.headers.get('cache-control')]).toEqual([200, { id: up.id, object: 'file', deleted: true }, 'no-store']);
    expect(await server.db.selectFrom('files').select('id').where('id', '=', up.id).executeTakeFirst()).toBeUndefined();
    expect(existsSync(path)).toBe(false);
    expect((await retrieve(c.key, up.id)).status).toBe(404);
    expect((await content(c.key, up.id)).status).toBe(404);
    expect((await list(c.key)).body.data).toEqual([]);
    const use = await postJson(c.key, '/v1/videos/generations', video({ firstFrame: up.id }));
    expect([use.status, use.body.error.code]).toEqual([404, 'file_not_found']);
    const again = await remove(c.key, up.id);
    expect([again.status, again.body.error.code]).toEqual([404, 'file_not_found']);
  });

  it("is the owner's only: another account's delete is 404 file_not_found and changes nothing", async () => {
    const c = await createCustomer(server.db);
    const other = await createCustomer(server.db);
    const up = await upload(c.key, await png());
    const res = await remove(other.key, up.id);
    expect([res.status, res.body.error.code]).toEqual([404, 'file_not_found']);
    expect((await retrieve(c.key, up.id)).status).toBe(200);
    expect(existsSync(await storedPath(up.id))).toBe(true);
  });

  it("deletes a generated image: its task's lookup leaves it out of data, and its signed URL is 404", async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const { taskId, fileIds, urls } = await generateImages(c.key, 2);
    expect((await remove(c.key, fileIds[0]!)).status).toBe(200);
    const task = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: taskId } } });
    expect(task.data?.status).toBe('completed');
    expect(task.data?.data?.map((d) => new URL(d.url!).pathname)).toEqual([`/v1/files/${fileIds[1]}`]);
    const listed = await server.client(c.key).GET('/v1/images', { params: { query: {} } });
    expect(listed.data?.data.find((t) => t.id === taskId)?.data?.map((d) => new URL(d.url!).pathname)).toEqual([`/v1/files/${fileIds[1]}`]);
    const signed = new URL(urls[0]!);
    expect((await fetch(`${server.directUrl}${signed.pathname}${signed.search}`)).status).toBe(404);
  });

  it('deletes the video of a finished task: the task stays completed and charged, answered without video_url', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const created = await postJson(c.key, '/v1/videos/generations', video());
    expect(created.status).toBe(202);
    const { task } = await runWorkersUntil(async () => {
      const row = await server.db.selectFrom('videoTasks').select('status').where('id', '=', created.body.id).executeTakeFirstOrThrow();
      return row.status === 'completed' && (await waitVideoFinished(server, c.key, created.body.id));
    });
    const fileId = new URL(task.video_url!).pathname.split('/').pop()!;
    const listed = await list(c.key, { purpose: 'video_output' });
    expect(listed.body.data).toEqual([expect.objectContaining({ id: fileId, purpose: 'video_output', content_type: 'video/mp4', width: null, height: null, expires_at: expect.stringMatching(/^\d{4}-/), task_id: created.body.id })]);
    expect((await remove(c.key, fileId)).status).toBe(200);

    const after = await server.client(c.key).GET('/v1/videos/{id}', { params: { path: { id: created.body.id } } });
    expect(after.data).toMatchObject({ status: 'completed', billing: { actualCredits: task.billing.actualCredits } });
    expect(after.data?.video_url).toBeUndefined();
    expect(after.data?.data).toBeUndefined();
    const url = new URL(task.video_url!);
    expect((await fetch(`${server.directUrl}${url.pathname}${url.search}`)).status).toBe(404);
  });

  it('refuses (409 file_in_use) an upload that a queued video task or a processing image task uses, and deletes it once they finished', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const frame = await upload(c.key, await png(320, 180));
    const queued = await postJson(c.key, '/v1/videos/generations', video({ firstFrame: frame.id }));
    expect(queued.status).toBe(202);
    const refused = await remove(c.key, frame.id);
    expect([refused.status, refused.body.error.code]).toEqual([409, 'file_in_use']);
    expect(refused.body.error.message).toContain(queued.body.id);

    const image = await upload(c.key, await maskPng(320, 180));
    const editing = await postJson(c.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'x', images: [frame.id], mask: image.id }, { Prefer: 'respond-async' });
    expect(editing.status).toBe(202);
    const mask = await remove(c.key, image.id);
    expect([mask.status, mask.body.error.code]).toEqual([409, 'file_in_use']);
    expect(mask.body.error.message).toContain(editing.body.id);
    expect((await retrieve(c.key, frame.id)).status).toBe(200);
    expect(existsSync(await storedPath(frame.id))).toBe(true);

    await runWorkersUntil(async () => {
      const v = await server.db.selectFrom('videoTasks').select('status').where('id', '=', queued.body.id).executeTakeFirstOrThrow();
      const i = await server.db.selectFrom('imageTasks').select('status').where('id', '=', editing.body.id).executeTakeFirstOrThrow();
      return v.status === 'completed' && i.status !== 'processing';
    });
    expect((await remove(c.key, frame.id)).status).toBe(200);
    expect((await remove(c.key, image.id)).status).toBe(200);
  });

  it('refuses the output of a task that has not finished (409 file_in_use)', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const queued = await postJson(c.key, '/v1/videos/generations', video());
    // The runner stores a video before it completes the task: that file exists, unfinished.
    const fileId = `file_unfinished${randomUUID().replace(/-/g, '')}`;
    await server.db.insertInto('files').values({ id: fileId, accountId: c.accountId, purpose: 'video_output', contentType: 'video/mp4', bytes: 10, storageKey: `video_output/xx/${fileId}.mp4`, taskId: queued.body.id }).execute();
    const res = await remove(c.key, fileId);
    expect([res.status, res.body.error.code]).toEqual([409, 'file_in_use']);
    expect(res.body.error.message).toContain(`output of video task '${queued.body.id}'`);
  });

  it('waits for a task being created with the file, and then refuses: the task keeps its input', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const frame = await upload(c.key, await png(320, 180));
    const other = await postJson(c.key, '/v1/videos/generations', video());
    expect(other.status).toBe(202);
    // As the hold statement of a new task naming the file does: it locks the file's row (adoption)
    // and commits the task with it. The delete arrives in between.
    let deleting: Promise<Awaited<ReturnType<typeof remove>>> | undefined;
    await server.db.transaction().execute(async (trx) => {
      await trx.updateTable('files').set({ expiresAt: new Date(Date.now() + 86_400_000) }).where('id', '=', frame.id).execute();
      await trx.updateTable('videoTasks').set({ inputFileIds: [frame.id], inputMode: 'first_frame' }).where('id', '=', other.body.id).execute();
      deleting = remove(c.key, frame.id);
      // The delete must be waiting on the row lock, not answered.
      await until(async () => {
        const { rows } = await sql<{ n: number }>`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock'`.execute(server.db);
        return rows[0]!.n > 0;
      }, 5000, 'the delete to wait for the lock');
    });
    const res = await deleting!;
    expect([res.status, res.body.error.code]).toEqual([409, 'file_in_use']);
    expect(existsSync(await storedPath(frame.id))).toBe(true);
  });
});
