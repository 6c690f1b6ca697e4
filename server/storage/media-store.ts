/**
 * Media store (design §7). Generated outputs and decoded inputs are written here, because
 * upstream URLs expire or need credentials. Everything is streamed in and out; `put` enforces a
 * byte limit while it writes. The filesystem store is the default; every key is a relative path
 * under its root. An S3-compatible store implements the same interface.
 *
 * A write or a removal that fails on the store's side rejects with a StorageError (storage-error.ts:
 * `StorageFull`, `StorageUnavailable`), never with the error of the data being written (a client
 * that went away, an upstream download that broke), so callers can tell whose fault it was.
 */
import { close, createReadStream, createWriteStream, open, write, writev } from 'node:fs';
import { mkdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { dirname, resolve, sep } from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { randomHex } from '../lib/ids.ts';
import { asStorageError } from './storage-error.ts';

export { StorageError, StorageFull, StorageUnavailable } from './storage-error.ts';

export interface MediaStore {
  /**
   * Writes bytes (or a stream) under `key` atomically: readers never see a partial file. With
   * `maxBytes`, a stream that grows past it fails with MediaTooLarge and nothing is kept; a write
   * the store cannot do fails with a StorageError and nothing is kept either.
   */
  put(key: string, data: Buffer | Readable, opts?: { maxBytes?: number }): Promise<{ bytes: number }>;
  read(key: string): Readable;
  size(key: string): Promise<number | undefined>;
  delete(key: string): Promise<void>;
  /** A path on this machine where the bytes can be read directly, when the store has one. */
  localPath?(key: string): string;
}

/** A stream passed the byte limit it was stored under. */
export class MediaTooLarge extends Error {
  constructor(readonly maxBytes: number) {
    super(`the media is larger than ${maxBytes} bytes`);
    this.name = 'MediaTooLarge';
  }
}

/** Passes bytes through and fails with MediaTooLarge once more than `maxBytes` went by. */
export function byteLimit(maxBytes: number): Transform {
  let seen = 0;
  return new Transform({
    transform(chunk: Buffer, _enc, done) {
      seen += chunk.length;
      if (seen > maxBytes) done(new MediaTooLarge(maxBytes));
      else done(null, chunk);
    },
  });
}

/**
 * The fs calls of a write stream, their failures turned into storage errors where they happen: a
 * pipeline that rejects then says by its error alone whether the store or the data failed.
 */
function storageFs(key: string) {
  type Callback = (err: unknown, ...rest: unknown[]) => void;
  const classified = (call: (...args: never[]) => void) => (...args: unknown[]) => {
    const done = args.pop() as Callback;
    const classify: Callback = (err, ...rest) => done(err ? asStorageError(err, key) : err, ...rest);
    (call as (...args: unknown[]) => void)(...args, classify);
  };
  return { open: classified(open), write: classified(write), writev: classified(writev), close: classified(close) };
}

export class FilesystemMediaStore implements MediaStore {
  /** Directories known to exist: a put into one of them needs no mkdir. */
  private readonly dirs = new Set<string>();

  constructor(private readonly root: string) {}

  private path(key: string): string {
    const path = resolve(this.root, key);
    if (!path.startsWith(resolve(this.root) + sep)) throw new Error(`media key escapes the store: ${key}`);
    return path;
  }

  async put(key: string, data: Buffer | Readable, opts: { maxBytes?: number } = {}): Promise<{ bytes: number }> {
    const path = this.path(key);
    const dir = dirname(path);
    if (!this.dirs.has(dir)) {
      await mkdir(dir, { recursive: true }).catch((err: unknown) => {
        throw asStorageError(err, key);
      });
      this.dirs.add(dir);
    }
    const tmp = `${path}.${randomHex(6)}.tmp`;
    if (Buffer.isBuffer(data)) return this.putBuffer(key, path, tmp, dir, data, opts.maxBytes);
    let bytes = 0;
    const counter = new Transform({
      transform(chunk: Buffer, _enc, done) {
        bytes += chunk.length;
        done(null, chunk);
      },
    });
    const file = createWriteStream(tmp, { fs: storageFs(key) });
    try {
      if (opts.maxBytes !== undefined) await pipeline(data, byteLimit(opts.maxBytes), counter, file);
      else await pipeline(data, counter, file);
      await rename(tmp, path).catch((err: unknown) => {
        throw asStorageError(err, key);
      });
    } catch (err) {
      await this.dropTemporary(tmp, dir);
      throw err;
    }
    return { bytes };
  }

  /** Bytes already in memory (generated images): one write, no stream machinery. */
  private async putBuffer(key: string, path: string, tmp: string, dir: string, data: Buffer, maxBytes: number | undefined): Promise<{ bytes: number }> {
    if (maxBytes !== undefined && data.length > maxBytes) throw new MediaTooLarge(maxBytes);
    try {
      await writeFile(tmp, data, { flag: 'wx' });
      await rename(tmp, path);
    } catch (err) {
      await this.dropTemporary(tmp, dir);
      throw asStorageError(err, key);
    }
    return { bytes: data.length };
  }

  /**
   * After a failed write: removes what it wrote (a removal that fails too must not hide why the
   * write failed), and forgets the directory, which may have been removed meanwhile (an operator
   * cleaning up): it is checked again next time.
   */
  private async dropTemporary(tmp: string, dir: string): Promise<void> {
    await rm(tmp, { force: true }).catch(() => undefined);
    this.dirs.delete(dir);
  }

  read(key: string): Readable {
    return createReadStream(this.path(key));
  }

  async size(key: string): Promise<number | undefined> {
    try {
      return (await stat(this.path(key))).size;
    } catch {
      return undefined;
    }
  }

  async delete(key: string): Promise<void> {
    await rm(this.path(key), { force: true }).catch((err: unknown) => {
      throw asStorageError(err, key);
    });
  }

  localPath(key: string): string {
    return this.path(key);
  }
}
