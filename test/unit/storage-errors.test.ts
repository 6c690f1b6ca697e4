/**
 * Storage failures are the gateway's own: the filesystem store raises StorageFull (ENOSPC, EDQUOT)
 * or StorageUnavailable (any other system error of its own I/O), never for an error of the data it
 * was given; the API maps them to 507 storage_full / 503 storage_unavailable with Retry-After and
 * logs them at error level. On a real full tmpfs (root only) nothing is kept and the first write
 * after space returns succeeds.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable, Writable } from 'node:stream';
import express from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { apiErrorOfStorage } from '../../server/errors.ts';
import { errorMiddleware } from '../../server/http/error-middleware.ts';
import { createLogger } from '../../server/logger.ts';
import { FileService } from '../../server/services/file.service.ts';
import { FilesystemMediaStore, MediaTooLarge } from '../../server/storage/media-store.ts';
import { S3MediaStore } from '../../server/storage/s3-media-store.ts';
import { StorageError, StorageFull, StorageUnavailable, asStorageError } from '../../server/storage/storage-error.ts';
import { FailingDeletesStore, storageError, systemError } from '../fakes/media-stores.ts';
import { FullDisk, canMount } from '../support/full-disk.ts';

const scratch = mkdtempSync(join(tmpdir(), 'mg-storage-errors-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true, maxRetries: 5 }));

/** A stream that fails the way a client or an upstream connection does (a system error code of its own). */
const brokenSource = () =>
  new Readable({
    read() {
      this.destroy(Object.assign(new Error('aborted'), { code: 'ECONNRESET', syscall: 'read' }));
    },
  });

describe('asStorageError', () => {
  it('makes ENOSPC and EDQUOT StorageFull and every other system error StorageUnavailable, keeping code, call and path', () => {
    for (const code of ['ENOSPC', 'EDQUOT']) {
      const err = asStorageError(Object.assign(systemError(code, 'open'), { path: '/media/upload/ab/x.png.tmp' }), 'upload/ab/x.png');
      expect(err).toBeInstanceOf(StorageFull);
      expect(err).toMatchObject({ condition: 'full', code, syscall: 'open', path: '/media/upload/ab/x.png.tmp', key: 'upload/ab/x.png', name: 'StorageFull' });
    }
    for (const code of ['EIO', 'EROFS', 'EACCES', 'ENOTDIR']) {
      const err = asStorageError(systemError(code), 'input/cd/y.png');
      expect(err).toBeInstanceOf(StorageUnavailable);
      expect(err).toMatchObject({ condition: 'unavailable', code, key: 'input/cd/y.png' });
    }
  });

  it('returns anything that is not a system error unchanged (a bug, a limit, a stream error)', () => {
    const plain = new Error('a bug');
    const limit = new MediaTooLarge(10);
    const destroyed = Object.assign(new Error('Cannot call write after a stream was destroyed'), { code: 'ERR_STREAM_DESTROYED' });
    for (const err of [plain, limit, destroyed, 'a string']) expect(asStorageError(err, 'k')).toBe(err);
    const full = storageError('ENOSPC');
    expect(asStorageError(full, 'other')).toBe(full);
  });
});

describe('apiErrorOfStorage', () => {
  it('answers 507 storage_full and 503 storage_unavailable, server_error, with Retry-After and no system details', () => {
    const full = apiErrorOfStorage(storageError('ENOSPC') as StorageError);
    expect([full.status, full.code, full.headers]).toEqual([507, 'storage_full', { 'Retry-After': '60' }]);
    expect(full.body('req_1').error).toMatchObject({ type: 'server_error', code: 'storage_full', param: null, request_id: 'req_1' });
    const unavailable = apiErrorOfStorage(storageError('EIO') as StorageError);
    expect([unavailable.status, unavailable.code, unavailable.headers]).toEqual([503, 'storage_unavailable', { 'Retry-After': '30' }]);
    for (const err of [full, unavailable]) {
      expect(err.message).toMatch(/not a fault of the request/);
      expect(err.message).not.toMatch(/ENOSPC|EIO|image_output|\//);
    }
  });
});

describe('FilesystemMediaStore failures', () => {
  it('raises StorageUnavailable when its directory cannot be made, for bytes and streams, and recovers once it can', async () => {
    const root = join(scratch, 'blocked');
    writeFileSync(root, 'a file where the store root should be');
    const store = new FilesystemMediaStore(root);
    await expect(store.put('input/aa/one.png', Buffer.from('x'))).rejects.toMatchObject({ name: 'StorageUnavailable', code: 'ENOTDIR', key: 'input/aa/one.png' });
    await expect(store.put('input/aa/two.png', Readable.from([Buffer.from('y')]))).rejects.toBeInstanceOf(StorageUnavailable);
    rmSync(root);
    expect(await store.put('input/aa/three.png', Readable.from([Buffer.from('z')]))).toEqual({ bytes: 1 });
  });

  it("keeps the data's own failures and the byte limit as they are", async () => {
    const store = new FilesystemMediaStore(join(scratch, 'ok'));
    const err = await store.put('input/bb/one.png', brokenSource()).catch((e: unknown) => e);
    expect(err).toMatchObject({ message: 'aborted', code: 'ECONNRESET' });
    expect(err).not.toBeInstanceOf(StorageError);
    await expect(store.put('input/bb/two.png', Readable.from([Buffer.alloc(6), Buffer.alloc(6)]), { maxBytes: 10 })).rejects.toBeInstanceOf(MediaTooLarge);
    expect(readdirSync(join(scratch, 'ok/input/bb'))).toEqual([]);
  });
});

describe.skipIf(!canMount)('FilesystemMediaStore on a real full disk (tmpfs; needs root)', () => {
  let disk: FullDisk;
  beforeAll(() => {
    disk = FullDisk.mount(1024 * 1024);
  });
  afterAll(() => disk?.unmount());

  it('raises StorageFull for bytes and streams, keeps nothing, and writes again as soon as space returns', async () => {
    const store = new FilesystemMediaStore(disk.dir);
    await store.put('image_output/aa/warm.png', Buffer.from('directory exists now'));
    disk.fill(64 * 1024);
    const big = Buffer.alloc(256 * 1024, 7);
    await expect(store.put('image_output/aa/one.png', big)).rejects.toMatchObject({ name: 'StorageFull', code: 'ENOSPC', key: 'image_output/aa/one.png' });
    const streamed = store.put('input/bb/two.png', Readable.from([big.subarray(0, 100_000), big.subarray(100_000)]), { maxBytes: 1_000_000 });
    await expect(streamed).rejects.toMatchObject({ name: 'StorageFull', code: 'ENOSPC', syscall: 'write' });
    expect(disk.files()).toEqual(['image_output/aa/warm.png']);

    disk.release();
    expect(await store.put('image_output/aa/one.png', big)).toEqual({ bytes: big.length });
    expect(await store.put('input/bb/two.png', Readable.from([big]))).toEqual({ bytes: big.length });
    expect(disk.files()).toEqual(['image_output/aa/one.png', 'image_output/aa/warm.png', 'input/bb/two.png']);
  });

  it('raises StorageUnavailable on a read-only volume', async () => {
    const store = new FilesystemMediaStore(disk.dir);
    // A spare file being made (spare-files.ts: the last test's store makes its pool up after each
    // write) holds the volume busy for a moment.
    let remounted = spawnSync('mount', ['-o', 'remount,ro', disk.dir]).status;
    for (let i = 0; i < 50 && remounted !== 0; i++) {
      await new Promise((r) => setTimeout(r, 20));
      remounted = spawnSync('mount', ['-o', 'remount,ro', disk.dir]).status;
    }
    expect(remounted).toBe(0);
    try {
      // A new directory (Node's recursive mkdir reports what it met last) and an existing one.
      await expect(store.put('image_output/cc/one.png', Buffer.from('x'))).rejects.toBeInstanceOf(StorageUnavailable);
      await expect(store.put('image_output/aa/two.png', Readable.from([Buffer.from('y')]))).rejects.toMatchObject({ name: 'StorageUnavailable', code: 'EROFS' });
    } finally {
      spawnSync('mount', ['-o', 'remount,rw', disk.dir]);
    }
    expect(await store.put('image_output/aa/two.png', Buffer.from('y'))).toEqual({ bytes: 1 });
  });
});

describe('the error middleware and a storage error', () => {
  const logs: string[] = [];
  let server: Server;
  let url: string;
  beforeAll(async () => {
    const log = createLogger('info', new Writable({ write: (chunk: Buffer, _e, cb) => (logs.push(chunk.toString()), cb()) }));
    const app = express();
    app.get('/full', () => {
      throw storageError('ENOSPC', 'upload/ab/file_1.png');
    });
    app.get('/io', () => {
      throw storageError('EIO', 'input/cd/file_2.png');
    });
    app.use(errorMiddleware(log));
    server = app.listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it('answers 507 storage_full or 503 storage_unavailable with Retry-After, and logs an error naming the code and the key', async () => {
    for (const [path, status, code, retry, key] of [
      ['/full', 507, 'storage_full', '60', 'upload/ab/file_1.png'],
      ['/io', 503, 'storage_unavailable', '30', 'input/cd/file_2.png'],
    ] as const) {
      logs.length = 0;
      const res = await fetch(url + path);
      expect([res.status, res.headers.get('retry-after')]).toEqual([status, retry]);
      const body = (await res.json()) as { error: Record<string, unknown> };
      expect(body.error).toMatchObject({ type: 'server_error', code, param: null });
      const line = logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === 'request failed');
      expect(line).toMatchObject({ level: 50 });
      expect(JSON.stringify(line)).toContain(key);
      expect(JSON.stringify(line)).toContain(path === '/full' ? 'ENOSPC' : 'EIO');
    }
  });
});

describe('S3MediaStore failures', () => {
  // Answers every request with the status and error code its path names, /b/<status>/<code>/…,
  // except that it starts (and aborts) multipart uploads: only their parts get that answer.
  let s3: Server;
  let endpoint = '';
  beforeAll(async () => {
    s3 = createServer((req, res) => {
      const url = new URL(req.url!, 'http://x');
      const [, , status, code] = decodeURIComponent(url.pathname).split('/');
      req.resume();
      req.on('end', () => {
        if (url.searchParams.has('uploads')) {
          res.writeHead(200, { 'content-type': 'application/xml' });
          res.end(`<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>up1</UploadId></InitiateMultipartUploadResult>`);
          return;
        }
        if (req.method === 'DELETE' && url.searchParams.has('uploadId')) {
          res.writeHead(204).end();
          return;
        }
        res.writeHead(Number(status), { 'content-type': 'application/xml' });
        res.end(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>${code}</Code><Message>simulated</Message><RequestId>1</RequestId></Error>`);
      });
    });
    await new Promise<void>((resolve) => s3.listen(0, '127.0.0.1', resolve));
    endpoint = `http://127.0.0.1:${(s3.address() as AddressInfo).port}`;
  });
  afterAll(() => {
    s3.closeAllConnections();
    s3.close();
  });

  it("raises StorageFull for MinIO's full drives (507 XMinioStorageFull) and any 507, StorageUnavailable for a 503", async () => {
    const store = new S3MediaStore({ bucket: 'b', region: 'us-east-1', endpoint, forcePathStyle: true, credentials: { accessKeyId: 'a', secretAccessKey: 'b' }, timeouts: { connectMs: 1000, requestMs: 2000 } });
    try {
      for (const [key, condition, code, status] of [
        ['507/XMinioStorageFull/file_1', 'full', 'XMinioStorageFull', 507],
        ['507/SomeOtherFull/file_2', 'full', 'SomeOtherFull', 507],
        ['503/SlowDown/file_3', 'unavailable', 'SlowDown', 503],
      ] as const) {
        const err = await store.put(key, Buffer.from('x')).catch((e: unknown) => e);
        expect(err).toMatchObject({ condition, code, key });
        expect(apiErrorOfStorage(err as StorageError).status).toBe(status);
      }
    } finally {
      store.close();
    }
  });

  it("fails a streamed write the store refuses mid-way with the store's error, not the data's, and lets go of the data", async () => {
    const store = new S3MediaStore({ bucket: 'b', region: 'us-east-1', endpoint, forcePathStyle: true, credentials: { accessKeyId: 'a', secretAccessKey: 'b' }, timeouts: { connectMs: 1000, requestMs: 2000 } });
    try {
      // More than two parts (a multipart upload whose parts S3 refuses: the Upload stops reading
      // its body at the first failure, the second part's failure comes later), then nothing more:
      // a client still sending, whose request must not be left waiting.
      let pushed = 0;
      const data = new Readable({
        read() {
          if (pushed++ < 17) this.push(Buffer.alloc(1024 * 1024, 1));
        },
      });
      const err = await store.put('503/SlowDown/file_4', data).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(StorageUnavailable);
      expect(err).toMatchObject({ code: 'SlowDown', key: '503/SlowDown/file_4' });
      await expect.poll(() => data.destroyed).toBe(true);
    } finally {
      store.close();
    }
  });
});

describe('FileService.save', () => {
  it("rejects with the row's failure when the store also fails to remove the bytes it stored, which are left to the orphan sweep", async () => {
    const inner = new FilesystemMediaStore(join(scratch, 'save'));
    const store = new FailingDeletesStore(inner);
    const refused = Object.assign(new Error('insert or update on table "files" violates foreign key constraint "files_account_id_fkey"'), { code: '23503' });
    const repo = {
      insert: async () => {
        throw refused;
      },
    };
    const files = new FileService(repo as never, store, {} as never, Buffer.alloc(32, 1), 'http://gateway.invalid', 3600);
    const err = await files.save({ accountId: 'acct_gone', purpose: 'upload', contentType: 'image/png' }, Buffer.from('png')).catch((e: unknown) => e);
    expect(err).toBe(refused);
    expect(store.failedDeletes).toHaveLength(1);
    expect(await inner.stat(store.failedDeletes[0]!)).toMatchObject({ bytes: 3 });
  });
});
