/**
 * Downloads in progress do not starve the media store's other calls of sockets. A streamed read
 * holds its socket until its reader is done (a slow client, an adapter streaming an input
 * upstream); on one S3 client of 50 sockets, 50 of them made every stat, put and delete wait for a
 * socket with their connection timeout running, and fail as storage_unavailable while the store was
 * healthy. Reads have a client (and sockets) of their own.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { S3MediaStore } from '../../server/storage/s3-media-store.ts';

let server: Server;
let endpoint = '';
beforeAll(async () => {
  server = createServer((req, res) => {
    if (req.method === 'GET') {
      // A 100 KiB object sent over about 4 s: a download a slow reader paces.
      res.writeHead(200, { 'content-type': 'video/mp4', 'content-length': String(100 * 1024) });
      let sent = 0;
      const timer = setInterval(() => {
        res.write(Buffer.alloc(1024));
        if (++sent === 100) {
          clearInterval(timer);
          res.end();
        }
      }, 40);
      req.on('close', () => clearInterval(timer));
      return;
    }
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-length': '10', 'last-modified': new Date().toUTCString(), etag: '"x"' });
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

it('answers a stat while 60 downloads hold their sockets', async () => {
  const store = new S3MediaStore({
    bucket: 'b',
    region: 'us-east-1',
    endpoint,
    forcePathStyle: true,
    credentials: { accessKeyId: 'a', secretAccessKey: 's' },
    // Short limits: a stat queued behind the downloads would fail within about 2 s.
    timeouts: { connectMs: 500, requestMs: 2000 },
  });
  try {
    const reads = Array.from({ length: 60 }, (_, i) => {
      const body = store.read(`video_output/ab/file_ab${i}`);
      body.resume();
      return new Promise<void>((resolve) => body.once('close', () => resolve()));
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    await expect(store.stat('image_output/ab/file_abstat')).resolves.toMatchObject({ bytes: 10 });
    await Promise.all(reads);
  } finally {
    store.close();
  }
}, 30_000);
