/**
 * A read the filesystem store cannot do (the object gone, a directory where it should be, EIO) is
 * the store's failure, a StorageError as the S3 store's: an upstream submit streaming a stored input
 * then throws it as it is (the gateway's fault, not the upstream's, counted against no member), and
 * the error middleware answers 503 storage_unavailable instead of 500.
 */
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buffer } from 'node:stream/consumers';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Base64Source, jsonStream } from '../../server/lib/base64-json.ts';
import { upstreamFetch } from '../../server/providers/upstream-http.ts';
import { FilesystemMediaStore, StorageUnavailable } from '../../server/storage/media-store.ts';

const root = mkdtempSync(join(tmpdir(), 'mg-read-errors-'));
const store = new FilesystemMediaStore(root);
// A directory where an object should be: open(2) works, read(2) fails with EISDIR (as EIO would).
mkdirSync(join(root, 'input/ab/file_abDir'), { recursive: true });
afterAll(() => rmSync(root, { recursive: true, force: true, maxRetries: 5 }));

describe('FilesystemMediaStore.read', () => {
  it.each([
    ['a missing object', 'input/ab/file_abMissing', 'ENOENT'],
    ['an unreadable object', 'input/ab/file_abDir', 'EISDIR'],
  ])('fails the stream of %s with StorageUnavailable, keeping the system code and the key', async (_what, key, code) => {
    const err = await buffer(store.read(key)).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(StorageUnavailable);
    expect(err).toMatchObject({ condition: 'unavailable', code, key });
    // A range read goes through the same calls.
    await expect(buffer(store.read(key, { start: 0, end: 9 }))).rejects.toBeInstanceOf(StorageUnavailable);
  });

  it('still reads a stored object and a range of it', async () => {
    await store.put('input/cd/file_cdOk', Buffer.from('0123456789'));
    expect((await buffer(store.read('input/cd/file_cdOk'))).toString()).toBe('0123456789');
    expect((await buffer(store.read('input/cd/file_cdOk', { start: 2, end: 4 }))).toString()).toBe('234');
  });
});

describe('an upstream submit streaming a stored input the filesystem store cannot read', () => {
  let server: Server;
  let base = '';
  beforeAll(async () => {
    server = createServer((req, res) => {
      req.resume();
      req.on('end', () => res.end('{}'));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => {
    server.closeAllConnections();
    server.close();
  });

  it("throws the store's StorageUnavailable as it is, not a ProviderError blaming the upstream", async () => {
    const { body, length } = jsonStream({ image: new Base64Source(() => store.read('input/ab/file_abDir'), 5000) });
    const err = await upstreamFetch(`${base}/submit`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': String(length) }, body, timeoutMs: 3000 }, new AbortController().signal, 'video submit').then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(StorageUnavailable);
    expect(err).toMatchObject({ code: 'EISDIR', key: 'input/ab/file_abDir' });
  });
});
