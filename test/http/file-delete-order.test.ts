/**
 * DELETE /v1/files/{id} deletes the rows (the file's and its sendable copies') and commits first,
 * then the bytes: a store that fails to delete some of them no longer rolls back a row whose bytes
 * are already gone (a file still listed, with no bytes behind it). What it could not delete is
 * logged and left to the media sweep, whose orphan phase removes it (no row names it any more).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createTransactor } from '../../server/db/transaction.ts';
import { SweeperRepository } from '../../server/repositories/sweeper.repository.ts';
import { MediaSweeper } from '../../server/services/media/media-sweeper.ts';
import { FilesystemMediaStore } from '../../server/storage/media-store.ts';
import { FailingDeletesStore } from '../fakes/media-stores.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

const root = mkdtempSync(join(tmpdir(), 'mg-file-delete-order-'));
/** A sendable copy's key (`<key>.<8 hex>`). */
const isCopy = (key: string) => /\.[0-9a-f]{8}$/.test(key);
/** Which deletes fail (as S3 answering 503 SlowDown to them) while the store is failing. */
let refused = isCopy;
const store = new FailingDeletesStore(new FilesystemMediaStore(root), (key) => refused(key));
let server: TestServer;
beforeAll(async () => {
  store.failing = false;
  server = await startTestServer({ overrides: { mediaStore: store } });
  await seedCatalog(server.db);
});
afterAll(async () => {
  await server?.close();
  rmSync(root, { recursive: true, force: true });
});

/** An uploaded GIF and the PNG copy it is sent upstream as (made as an adapter's input would make it). */
async function gifWithCopy(key: string): Promise<{ id: string; fileKey: string; copyKey: string }> {
  const gif = await sharp({ create: { width: 64, height: 64, channels: 3, background: '#aa3366' } }).gif().toBuffer();
  const form = new FormData();
  form.append('purpose', 'input');
  form.append('file', new Blob([gif], { type: 'image/gif' }), 'in.gif');
  const up = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form });
  expect(up.status).toBe(201);
  const { id } = (await up.json()) as { id: string };
  const [input] = await server.ctx.services.files.mediaInputs([id]);
  expect(input?.contentType).toBe('image/png');
  const rows = await server.db.selectFrom('files').select(['id', 'storageKey']).where('id', 'like', `${id}%`).orderBy('id').execute();
  expect(rows.map((r) => r.id)).toEqual([id, expect.stringMatching(new RegExp(`^${id}png`))]);
  return { id, fileKey: rows[0]!.storageKey, copyKey: rows[1]!.storageKey };
}

it("deletes the rows and answers 200 when a copy's bytes cannot be deleted; the orphan sweep removes them later", async () => {
  const c = await createCustomer(server.db);
  const { id, fileKey, copyKey } = await gifWithCopy(c.key);
  expect(isCopy(copyKey)).toBe(true);
  store.failing = true;
  const del = await fetch(`${server.directUrl}/v1/files/${id}`, { method: 'DELETE', headers: { Authorization: `Bearer ${c.key}` } });
  expect(del.status).toBe(200);
  expect(await del.json()).toEqual({ id, object: 'file', deleted: true });
  expect(store.failedDeletes).toEqual([copyKey]);
  // No row names either object; the file's own bytes are gone, the copy's are left.
  expect(await server.db.selectFrom('files').select('id').where('id', 'like', `${id}%`).execute()).toEqual([]);
  expect((await fetch(`${server.directUrl}/v1/files/${id}`, { headers: { Authorization: `Bearer ${c.key}` } })).status).toBe(404);
  expect(await store.stat(fileKey)).toBeUndefined();
  expect(await store.stat(copyKey)).toBeDefined();
  const warned = server.logs.map((l) => JSON.parse(l) as { msg: string; fileId?: string; objects?: { key: string }[] }).filter((l) => l.fileId === id && l.objects);
  expect(warned).toMatchObject([{ msg: "could not delete a deleted file's bytes; the media sweep removes them as orphans", objects: [{ key: copyKey }] }]);

  // The store works again: a sweep run an hour later removes the copy as an orphan.
  store.failing = false;
  const sweeper = new MediaSweeper({
    files: server.ctx.repositories.files,
    sweepers: new SweeperRepository(server.db),
    store,
    tx: createTransactor(server.db, server.ctx.log),
    log: server.ctx.log,
    now: () => Date.now() + 2 * 60 * 60_000,
  });
  expect(await sweeper.run()).toMatchObject({ orphans: 1 });
  expect(await store.stat(copyKey)).toBeUndefined();
});

it('deletes the rows and answers 200 when the store fails every delete; both objects are left to the sweep', async () => {
  const c = await createCustomer(server.db);
  const { id, fileKey, copyKey } = await gifWithCopy(c.key);
  refused = () => true;
  store.failing = true;
  try {
    const del = await fetch(`${server.directUrl}/v1/files/${id}`, { method: 'DELETE', headers: { Authorization: `Bearer ${c.key}` } });
    expect(del.status).toBe(200);
  } finally {
    store.failing = false;
    refused = isCopy;
  }
  const warned = server.logs.map((l) => JSON.parse(l) as { fileId?: string; objects?: { key: string; err: string }[] }).find((l) => l.fileId === id && l.objects);
  expect(warned?.objects).toEqual([
    { key: fileKey, err: expect.stringMatching(/SlowDown/) },
    { key: copyKey, err: expect.stringMatching(/SlowDown/) },
  ]);
  expect(await server.db.selectFrom('files').select('id').where('id', 'like', `${id}%`).execute()).toEqual([]);
  expect(await store.stat(fileKey)).toBeDefined();
  expect(await store.stat(copyKey)).toBeDefined();
});
