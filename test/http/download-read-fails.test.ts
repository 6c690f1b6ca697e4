/**
 * A store read that fails before its first byte is answered as the store's failure, 503
 * storage_unavailable with Retry-After and none of the file's header fields: a download (S3's
 * GetObject answering 503 after the HEAD of the download passed; a filesystem object removed
 * between its stat and its read) no longer leaves its client a closed connection with no answer,
 * and an edit naming a stored input the filesystem store cannot read is no longer a 500.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { PassThrough } from 'node:stream';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FilesystemMediaStore, type ByteRange } from '../../server/storage/media-store.ts';
import { FailingReadsStore } from '../fakes/media-stores.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

const scratch = mkdtempSync(join(tmpdir(), 'mg-download-read-fails-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true, maxRetries: 5 }));

const png = () => sharp({ create: { width: 64, height: 64, channels: 3, background: '#aa3366' } }).png().toBuffer();

async function upload(server: TestServer, key: string): Promise<string> {
  const form = new FormData();
  form.append('purpose', 'input');
  form.append('file', new Blob([await png()], { type: 'image/png' }), 'in.png');
  const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form });
  expect(res.status).toBe(201);
  return ((await res.json()) as { id: string }).id;
}

/** The answer a storage failure gets: 503 storage_unavailable, Retry-After, nothing of the file's. */
async function expectStorageUnavailable(res: Response): Promise<void> {
  expect(res.status).toBe(503);
  expect(res.headers.get('retry-after')).toBe('30');
  expect(res.headers.get('cache-control')).toBe('no-store');
  for (const name of ['etag', 'content-disposition', 'content-range', 'last-modified']) expect(res.headers.get(name)).toBeNull();
  expect(((await res.json()) as { error: { code: string } }).error.code).toBe('storage_unavailable');
}

describe('a download whose store read fails before its first byte', () => {
  const store = new FailingReadsStore(new FilesystemMediaStore(join(scratch, 'failing')));
  let server: TestServer;
  beforeAll(async () => {
    store.failing = false;
    server = await startTestServer({ overrides: { mediaStore: store } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('is answered 503 storage_unavailable with Retry-After, whole or ranged, by key or by signed URL; the same download works once the store does', async () => {
    const c = await createCustomer(server.db);
    const id = await upload(server, c.key);
    const content = `${server.directUrl}/v1/files/${id}/content`;
    const signed = server.ctx.services.files.signedUrl(id);
    const auth = { Authorization: `Bearer ${c.key}` };
    store.failing = true;
    await expectStorageUnavailable(await fetch(content, { headers: auth }));
    await expectStorageUnavailable(await fetch(content, { headers: { ...auth, Range: 'bytes=0-9' } }));
    await expectStorageUnavailable(await fetch(signed));
    expect(store.failedReads).toBe(3);
    // A HEAD reads nothing: it still answers from the stat.
    expect((await fetch(content, { method: 'HEAD', headers: auth })).status).toBe(200);
    // Each logged as the store's failure (an error for the operator), none as a client gone (499).
    const lines = server.logs.map((l) => JSON.parse(l) as { msg: string; code?: string; status?: number; path?: string });
    expect(lines.filter((l) => l.msg === 'request failed' && l.code === 'storage_unavailable' && l.path?.includes(id))).toHaveLength(3);
    expect(lines.filter((l) => l.msg === 'request' && l.status === 499)).toHaveLength(0);
    store.failing = false;
    const ok = await fetch(content, { headers: auth });
    expect(ok.status).toBe(200);
    expect(ok.headers.get('etag')).toBe(`"${id}"`);
    expect(Buffer.from(await ok.arrayBuffer()).equals(await png())).toBe(true);
    const ranged = await fetch(content, { headers: { ...auth, Range: 'bytes=0-9' } });
    expect(ranged.status).toBe(206);
    expect(Buffer.from(await ranged.arrayBuffer())).toHaveLength(10);
  });
});

/** A filesystem store whose objects named in `vanishing` are removed as their read begins (a delete racing it). */
class VanishingStore extends FilesystemMediaStore {
  readonly vanishing = new Set<string>();
  /** Keys whose read first runs a step of its own (another request deleting the file), then loses the object. */
  readonly racing = new Map<string, () => Promise<unknown>>();
  override read(key: string, range?: ByteRange) {
    if (this.vanishing.delete(key)) rmSync(this.localPath(key));
    const race = this.racing.get(key);
    if (!race) return super.read(key, range);
    this.racing.delete(key);
    const out = new PassThrough();
    race().then(
      () => {
        rmSync(this.localPath(key));
        super.read(key, range).on('error', (err) => out.destroy(err)).pipe(out);
      },
      (err: Error) => out.destroy(err),
    );
    return out;
  }
}

describe('filesystem objects that cannot be read', () => {
  const store = new VanishingStore(join(scratch, 'vanishing'));
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ overrides: { mediaStore: store } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  const keyOf = async (id: string) => (await server.db.selectFrom('files').select('storageKey').where('id', '=', id).executeTakeFirstOrThrow()).storageKey;

  it('a download of an object removed after its stat is answered 503 storage_unavailable', async () => {
    const c = await createCustomer(server.db);
    const id = await upload(server, c.key);
    store.vanishing.add(await keyOf(id));
    await expectStorageUnavailable(await fetch(`${server.directUrl}/v1/files/${id}/content`, { headers: { Authorization: `Bearer ${c.key}` } }));
  });

  it('a download racing the file\'s deletion (its row gone, then its bytes) is answered 404 file_not_found, not a store outage', async () => {
    const c = await createCustomer(server.db);
    const id = await upload(server, c.key);
    store.racing.set(await keyOf(id), () => server.db.deleteFrom('files').where('id', '=', id).execute());
    const res = await fetch(`${server.directUrl}/v1/files/${id}/content`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(res.status).toBe(404);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('file_not_found');
  });

  it('an edit whose stored input cannot be read once inspected is answered 503 storage_unavailable, not 500, and holds nothing', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const id = await upload(server, c.key);
    store.vanishing.add(await keyOf(id));
    const res = await fetch(`${server.directUrl}/v1/images/edits`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'local-image-1', prompt: 'edit it', images: [id] }),
    });
    await expectStorageUnavailable(res);
    expect(await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).execute()).toHaveLength(0);
  });
});
