/**
 * An S3 GET whose body goes silent mid-way (a connection dead without a reset) is ended by the
 * store once it has sent nothing for `requestMs` while its reader waits for bytes: the reader hears
 * StorageUnavailable and the connection is closed. The SDK's requestTimeout ends with the headers
 * and no socket timeout is set, so such a read waited until TCP gave up, holding its reader (a
 * download, an input copied for inspection or conversion under FileService's one conversion turn).
 * A reader that applies backpressure for longer (a slow download client) and a body that keeps
 * sending, however slowly, are never cut.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { S3MediaStore } from '../../server/storage/s3-media-store.ts';
import { StorageUnavailable } from '../../server/storage/storage-error.ts';

const REQUEST_MS = 400;
const BIG = 4 * 1024 * 1024;
let server: Server;
let store: S3MediaStore;
/** Connections the server saw closed, by the object they served. */
const closed: string[] = [];
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** What each object's GET does with its response, after its headers. */
const objects: Record<string, (res: ServerResponse) => void> = {
  // 10 bytes, then silence with the connection left open.
  'input/ab/file_abStalled': (res) => res.write(Buffer.alloc(10, 1)),
  // All of it at once.
  'input/ab/file_abBig': (res) => res.end(Buffer.alloc(BIG, 2)),
  // A chunk every REQUEST_MS / 2, for 3 × REQUEST_MS.
  'input/ab/file_abSlow': (res) => {
    let sent = 0;
    const timer = setInterval(() => {
      res.write(Buffer.alloc(10, 3));
      if (++sent === 6) {
        clearInterval(timer);
        res.end();
      }
    }, REQUEST_MS / 2);
  },
};
const sizes: Record<string, number> = { 'input/ab/file_abStalled': 100_000, 'input/ab/file_abBig': BIG, 'input/ab/file_abSlow': 60 };

beforeAll(async () => {
  server = createServer((req, res) => {
    const key = decodeURIComponent(new URL(req.url!, 'http://x').pathname).replace(/^\/b\//, '');
    req.socket.once('close', () => closed.push(key));
    const serve = objects[key];
    if (!serve) {
      res.writeHead(404, { 'content-type': 'application/xml' }).end('<Error><Code>NoSuchKey</Code></Error>');
      return;
    }
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(sizes[key]), etag: '"x"', 'last-modified': new Date().toUTCString() });
    serve(res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  store = new S3MediaStore({ bucket: 'b', region: 'us-east-1', endpoint, forcePathStyle: true, credentials: { accessKeyId: 'a', secretAccessKey: 'b' }, timeouts: { connectMs: 300, requestMs: REQUEST_MS } });
});
afterAll(() => {
  store?.close();
  server.closeAllConnections();
  server.close();
});

describe('S3MediaStore.read of a body', () => {
  it('that goes silent while its reader waits fails with StorageUnavailable after requestMs, and its connection is closed', async () => {
    const started = Date.now();
    const stream = store.read('input/ab/file_abStalled');
    const err = await Promise.race([
      buffer(stream).then(
        () => 'ended',
        (e: unknown) => e,
      ),
      sleep(REQUEST_MS * 5).then(() => 'still pending'),
    ]);
    const took = Date.now() - started;
    stream.destroy();
    expect(err).toBeInstanceOf(StorageUnavailable);
    expect(err).toMatchObject({ code: 'ReadStalled', key: 'input/ab/file_abStalled' });
    expect(took).toBeGreaterThanOrEqual(REQUEST_MS - 20);
    expect(took).toBeLessThan(REQUEST_MS * 5);
    await expect.poll(() => closed.includes('input/ab/file_abStalled'), { timeout: 5_000 }).toBe(true);
  });

  it('whose reader takes nothing for several times requestMs (backpressure) is not cut: it gets every byte', async () => {
    const stream: Readable = store.read('input/ab/file_abBig');
    let failed: unknown;
    stream.on('error', (e) => (failed = e));
    // The first bytes, then nothing taken while the buffers fill and the body is paused.
    await new Promise((resolve) => stream.once('readable', resolve));
    await sleep(REQUEST_MS * 4);
    expect(failed).toBeUndefined();
    const bytes = await buffer(stream);
    expect(bytes.length).toBe(BIG);
  });

  it('that keeps sending, however slowly, is not cut', async () => {
    const bytes = await buffer(store.read('input/ab/file_abSlow'));
    expect(bytes.length).toBe(60);
  });
});
