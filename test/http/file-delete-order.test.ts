/**
 * DELETE /v1/files/{id} deletes the rows (the file's and its sendable copies') and commits first,
 * with their storage keys recorded as pending deletes in the same statement, then the bytes: a
 * store that fails to delete some of them no longer rolls back a row whose bytes are already gone
 * (a file still listed, with no bytes behind it). What it could not delete is logged and stays
 * pending: the media sweep tries it again at its next run (not an orphan walk that reaches a key
 * once per walk of the whole store), backing off for an object the store keeps refusing.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import sharp from 'sharp';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createTransactor } from '../../server/db/transaction.ts';
import { SweeperRepository } from '../../server/repositories/sweeper.repository.ts';
import { MediaSweeper } from '../../server/services/media/media-sweeper.ts';
import { FilesystemMediaStore, StorageUnavailable } from '../../server/storage/media-store.ts';
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
  rmSync(root, { recursive: true, force: true, maxRetries: 5 });
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

function sweeperAt(offsetMs = 0): MediaSweeper {
  return new MediaSweeper({
    files: server.ctx.repositories.files,
    sweepers: new SweeperRepository(server.db),
    store,
    tx: createTransactor(server.db, server.ctx.log),
    log: server.ctx.log,
    now: () => Date.now() + offsetMs,
  });
}

const pendingOf = (keys: string[]) =>
  server.db.selectFrom('pendingDeletes').select(['storageKey', 'attempts', 'lastError']).where('storageKey', 'in', keys).orderBy('storageKey').execute();

it("deletes the rows and answers 200 when a copy's bytes cannot be deleted; the next sweep deletes them", async () => {
  const c = await createCustomer(server.db);
  const { id, fileKey, copyKey } = await gifWithCopy(c.key);
  expect(isCopy(copyKey)).toBe(true);
  store.failing = true;
  const del = await fetch(`${server.directUrl}/v1/files/${id}`, { method: 'DELETE', headers: { Authorization: `Bearer ${c.key}` } });
  expect(del.status).toBe(200);
  expect(await del.json()).toEqual({ id, object: 'file', deleted: true });
  expect(store.failedDeletes).toEqual([copyKey]);
  // No row names either object; the file's own bytes are gone (and no longer pending), the copy's are left, pending.
  expect(await server.db.selectFrom('files').select('id').where('id', 'like', `${id}%`).execute()).toEqual([]);
  expect((await fetch(`${server.directUrl}/v1/files/${id}`, { headers: { Authorization: `Bearer ${c.key}` } })).status).toBe(404);
  expect(await store.stat(fileKey)).toBeUndefined();
  expect(await store.stat(copyKey)).toBeDefined();
  expect(await pendingOf([fileKey, copyKey])).toEqual([{ storageKey: copyKey, attempts: 0, lastError: null }]);
  const warned = server.logs.map((l) => JSON.parse(l) as { msg: string; fileId?: string; objects?: { key: string }[] }).filter((l) => l.fileId === id && l.objects);
  expect(warned).toMatchObject([{ msg: "could not delete a deleted file's bytes; the media sweep tries them again every minute", objects: [{ key: copyKey }] }]);

  // The store works again: the next sweep run (not an hour later, as the orphan walk would) deletes the copy.
  store.failing = false;
  expect(await sweeperAt().run()).toMatchObject({ pending: 1 });
  expect(await store.stat(copyKey)).toBeUndefined();
  expect(await pendingOf([copyKey])).toEqual([]);
});

it('deletes the rows and answers 200 when the store fails every delete; both objects stay pending until the store is back', async () => {
  const c = await createCustomer(server.db);
  const { id, fileKey, copyKey } = await gifWithCopy(c.key);
  refused = () => true;
  store.failing = true;
  try {
    const del = await fetch(`${server.directUrl}/v1/files/${id}`, { method: 'DELETE', headers: { Authorization: `Bearer ${c.key}` } });
    expect(del.status).toBe(200);
    const warned = server.logs.map((l) => JSON.parse(l) as { fileId?: string; objects?: { key: string; err: string }[] }).find((l) => l.fileId === id && l.objects);
    expect(warned?.objects).toEqual([
      { key: fileKey, err: expect.stringMatching(/SlowDown/) },
      { key: copyKey, err: expect.stringMatching(/SlowDown/) },
    ]);
    expect(await server.db.selectFrom('files').select('id').where('id', 'like', `${id}%`).execute()).toEqual([]);
    expect(await store.stat(fileKey)).toBeDefined();
    expect(await store.stat(copyKey)).toBeDefined();
    // A sweep while the store is still out (a 503 is about the store, not the object) ends its
    // phase at the first failure and leaves both due, unchanged.
    await sweeperAt().run();
    expect(await pendingOf([fileKey, copyKey])).toEqual([
      { storageKey: fileKey, attempts: 0, lastError: null },
      { storageKey: copyKey, attempts: 0, lastError: null },
    ].sort((a, b) => (a.storageKey < b.storageKey ? -1 : 1)));
  } finally {
    store.failing = false;
    refused = isCopy;
  }
  expect(await sweeperAt().run()).toMatchObject({ pending: 2 });
  expect(await store.stat(fileKey)).toBeUndefined();
  expect(await store.stat(copyKey)).toBeUndefined();
  expect(await pendingOf([fileKey, copyKey])).toEqual([]);
});

it('records the pending deletes in the commit that deletes the rows, before any byte is deleted (a crash in between loses nothing)', async () => {
  const c = await createCustomer(server.db);
  const { id, fileKey, copyKey } = await gifWithCopy(c.key);
  const seen: string[][] = [];
  const original = store.delete.bind(store);
  store.delete = async (key: string) => {
    // What another connection sees when the store is called: committed pending deletes.
    seen.push((await pendingOf([fileKey, copyKey])).map((p) => p.storageKey));
    return original(key);
  };
  try {
    const del = await fetch(`${server.directUrl}/v1/files/${id}`, { method: 'DELETE', headers: { Authorization: `Bearer ${c.key}` } });
    expect(del.status).toBe(200);
  } finally {
    store.delete = original;
  }
  expect(seen[0]).toEqual([fileKey, copyKey].sort());
  expect(await pendingOf([fileKey, copyKey])).toEqual([]);
});

it('puts off an object the store refuses (AccessDenied) with a growing delay, its error kept; other pending deletes go on', async () => {
  const c = await createCustomer(server.db);
  const a = await gifWithCopy(c.key);
  const b = await gifWithCopy(c.key);
  const locked = a.fileKey;
  // An object lock on one object: S3 answers AccessDenied for it alone.
  const denying = new (class extends FailingDeletesStore {
    override delete(key: string) {
      if (key !== locked) return this.inner.delete(key);
      return Promise.reject(new StorageUnavailable(key, Object.assign(new Error('Access Denied (object lock)'), { code: 'AccessDenied', syscall: 's3' })));
    }
  })(store);
  // Both files deleted while the store was out: all four objects pending.
  refused = () => true;
  store.failing = true;
  try {
    for (const f of [a, b]) expect((await fetch(`${server.directUrl}/v1/files/${f.id}`, { method: 'DELETE', headers: { Authorization: `Bearer ${c.key}` } })).status).toBe(200);
  } finally {
    store.failing = false;
    refused = isCopy;
  }
  const keys = [a.fileKey, a.copyKey, b.fileKey, b.copyKey];
  expect(await pendingOf(keys)).toHaveLength(4);
  const sweeper = new MediaSweeper({ files: server.ctx.repositories.files, sweepers: new SweeperRepository(server.db), store: denying, tx: createTransactor(server.db, server.ctx.log), log: server.ctx.log });
  expect(await sweeper.run()).toMatchObject({ pending: 3 });
  expect(await pendingOf(keys)).toEqual([{ storageKey: locked, attempts: 1, lastError: expect.stringMatching(/Access Denied/) }]);
  const [row] = await server.db.selectFrom('pendingDeletes').select(sql<number>`extract(epoch from next_attempt_at - now())`.as('wait')).where('storageKey', '=', locked).execute();
  expect(Number(row!.wait)).toBeGreaterThan(50);
  // Not due yet: the next run does not call the store for it.
  expect(await sweeper.run()).toMatchObject({ pending: 0 });
  expect(await pendingOf([locked])).toMatchObject([{ attempts: 1 }]);
  // Due again after its delay: refused again, the delay doubles.
  await server.db.updateTable('pendingDeletes').set({ nextAttemptAt: sql`now()` }).where('storageKey', '=', locked).execute();
  await sweeper.run();
  const [again] = await server.db.selectFrom('pendingDeletes').select(['attempts', sql<number>`extract(epoch from next_attempt_at - now())`.as('wait')]).where('storageKey', '=', locked).execute();
  expect(again!.attempts).toBe(2);
  expect(Number(again!.wait)).toBeGreaterThan(110);
  await server.db.deleteFrom('pendingDeletes').where('storageKey', '=', locked).execute();
});
