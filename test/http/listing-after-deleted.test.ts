/**
 * A listing's `after` that names a file deleted since its page was read: the file keeps its place
 * (file_tombstones, written by the deleting statement), so the OpenAI SDK's list-and-delete loop
 * and a walk that the media sweeper crosses go on from there; an unknown or foreign id, or one
 * deleted more than a week ago, is still 400 invalid_cursor. Task rows are never deleted (no
 * DELETE in the contract, no sweeper deletes them), so /v1/videos and /v1/images need no tombstones.
 */
import OpenAI, { toFile } from 'openai';
import { sql } from 'kysely';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

type Json = Record<string, any>;

let server: TestServer;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

let shade = 0;
async function upload(key: string): Promise<string> {
  shade = (shade + 41) % 256;
  const png = await sharp({ create: { width: 16, height: 16, channels: 3, background: { r: shade, g: 90, b: 255 - shade } } }).png().toBuffer();
  const form = new FormData();
  form.append('purpose', 'input');
  form.append('file', new Blob([png], { type: 'image/png' }), 'p.png');
  const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form });
  expect(res.status).toBe(201);
  return ((await res.json()) as Json).id as string;
}

async function uploads(key: string, n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) ids.push(await upload(key));
  return ids;
}

const list = async (key: string, query: Json = {}) => {
  const res = await server.client(key).GET('/v1/files', { params: { query } });
  return { status: res.response.status, body: (res.data ?? res.error) as Json };
};
const remove = async (key: string, id: string) => (await server.client(key).DELETE('/v1/files/{file_id}', { params: { path: { file_id: id } } })).response.status;
const ids = (body: Json) => (body.data as Json[]).map((f) => f.id as string);

describe('GET /v1/files?after=<a deleted file>', () => {
  it("the OpenAI SDK's auto-pagination deletes every file it lists (each page's last item deleted before the next page)", async () => {
    const c = await createCustomer(server.db);
    const created = await uploads(c.key, 5);
    const files = new OpenAI({ apiKey: c.key, baseURL: `${server.directUrl}/v1`, maxRetries: 0 }).files;
    const deleted: string[] = [];
    for await (const f of files.list({ limit: 2 })) {
      await files.delete(f.id);
      deleted.push(f.id);
    }
    expect(deleted).toEqual([...created].reverse());
    expect((await list(c.key)).body.data).toEqual([]);
  });

  it('continues right after the deleted item, newest or oldest first, and an empty page past the end', async () => {
    const c = await createCustomer(server.db);
    const [a, b, d, e] = await uploads(c.key, 4);
    expect(await remove(c.key, b!)).toBe(200);
    expect(await remove(c.key, e!)).toBe(200);
    expect(await list(c.key, { after: b })).toEqual({ status: 200, body: { object: 'list', data: [expect.objectContaining({ id: a })], first_id: a, last_id: a, has_more: false } });
    expect(ids((await list(c.key, { after: b, order: 'asc' })).body)).toEqual([d]);
    expect((await list(c.key, { after: e })).body.data.map((f: Json) => f.id)).toEqual([d, a]);
    expect(await list(c.key, { after: e, order: 'asc' })).toEqual({ status: 200, body: { object: 'list', data: [], first_id: null, last_id: null, has_more: false } });
  });

  it('goes on after a file the media sweeper deleted between two pages', async () => {
    const c = await createCustomer(server.db);
    const [a, b, d] = await uploads(c.key, 3);
    const first = await list(c.key, { limit: 2 });
    expect([ids(first.body), first.body.has_more]).toEqual([[d, b], true]);
    await server.db.updateTable('files').set({ expiresAt: new Date(Date.now() - 1000) }).where('id', '=', b!).execute();
    await server.ctx.mediaSweeper.sweepExpired();
    expect(await server.db.selectFrom('files').select('id').where('id', '=', b!).executeTakeFirst()).toBeUndefined();
    const next = await list(c.key, { limit: 2, after: first.body.last_id });
    expect([next.status, ids(next.body), next.body.has_more]).toEqual([200, [a], false]);
  });

  it("is 400 invalid_cursor for an unknown id, another account's deleted file, and a file deleted more than a week ago", async () => {
    const c = await createCustomer(server.db);
    const other = await createCustomer(server.db);
    const [kept, old] = await uploads(c.key, 2);
    const theirs = await upload(other.key);
    expect(await remove(other.key, theirs)).toBe(200);
    expect(await remove(c.key, old!)).toBe(200);
    // Deleted 8 days ago: the next deleting statement purges its tombstone (a 6-day-old one stays).
    await server.db.updateTable('fileTombstones').set({ deletedAt: sql<Date>`now() - interval '8 days'` }).where('id', '=', old!).execute();
    await server.db.updateTable('fileTombstones').set({ deletedAt: sql<Date>`now() - interval '6 days'` }).where('id', '=', theirs).execute();
    expect(await remove(c.key, await upload(c.key))).toBe(200);
    const left = await server.db.selectFrom('fileTombstones').select('id').where('id', 'in', [old!, theirs]).execute();
    expect(left.map((r) => r.id)).toEqual([theirs]);
    for (const after of ['file_doesnotexist', theirs, old!]) {
      const res = await list(c.key, { after });
      expect([res.status, res.body.error?.code, res.body.error?.param]).toEqual([400, 'invalid_cursor', 'after']);
    }
    expect(ids((await list(other.key, { after: theirs, order: 'asc' })).body)).toEqual([]);
    expect(ids((await list(c.key, { after: kept })).body)).toEqual([]);
  });

  it('records no tombstone for a request input (never listed, so never a last_id)', async () => {
    const c = await createCustomer(server.db);
    const id = await upload(c.key);
    await server.db.updateTable('files').set({ purpose: 'input' }).where('id', '=', id).execute();
    await server.db.deleteFrom('files').where('id', '=', id).execute();
    expect(await server.db.selectFrom('fileTombstones').select('id').where('id', '=', id).execute()).toEqual([]);
    const res = await list(c.key, { after: id });
    expect([res.status, res.body.error?.code]).toEqual([400, 'invalid_cursor']);
  });
});
