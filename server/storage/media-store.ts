/**
 * Media store (design §7). Generated outputs and decoded inputs are written here, because
 * upstream URLs expire or need credentials. Everything is streamed in and out; `put` enforces a
 * byte limit while it writes. The filesystem store is the default; every key is a relative path
 * under its root. The S3-compatible store (s3-media-store.ts) implements the same interface, so
 * that any instance reads what another wrote.
 *
 * A write, a read or a removal that fails on the store's side fails with a StorageError
 * (storage-error.ts: `StorageFull`, `StorageUnavailable`), never with the error of the data being
 * written (a client that went away, an upstream download that broke), so callers can tell whose
 * fault it was.
 */
import { close, createReadStream, createWriteStream, open, read, renameSync, rmSync, write, writeFileSync, writev } from 'node:fs';
import { mkdir, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { dirname, join, resolve, sep } from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { randomHex } from '../lib/ids.ts';
import { SpareFiles } from './spare-files.ts';
import { asStorageError, StorageError } from './storage-error.ts';

export { StorageError, StorageFull, StorageUnavailable } from './storage-error.ts';

/** Bytes `start` to `end` of an object, both included (an HTTP `Range`). */
export interface ByteRange {
  start: number;
  end: number;
}

/** What a store knows of a stored object. */
export interface StoredObject {
  key: string;
  bytes: number;
  modifiedAt: Date;
}

export interface PutOptions {
  /** A stream that grows past this fails with MediaTooLarge and nothing is kept. */
  maxBytes?: number;
  /** Kept with the object where the store can (S3: what presigned URLs serve it as). */
  contentType?: string;
  /** The name it is served under (S3: `Content-Disposition: inline; filename=…` of presigned URLs). */
  filename?: string;
}

export interface MediaStore {
  /**
   * Writes bytes (or a stream) under `key` atomically: readers never see a partial object. With
   * `maxBytes`, a stream that grows past it fails with MediaTooLarge and nothing is kept; a write
   * the store cannot do fails with a StorageError and nothing is kept either.
   */
  put(key: string, data: Buffer | Readable, opts?: PutOptions): Promise<{ bytes: number }>;
  /** The bytes (or `range` of them) as a stream; a missing or unreadable object fails the stream with a StorageError. */
  read(key: string, range?: ByteRange): Readable;
  /**
   * Size and last change of the object, or undefined when there is none. A store that cannot tell
   * (an I/O error, unreachable) fails with a StorageError: the object may well be there.
   */
  stat(key: string): Promise<StoredObject | undefined>;
  delete(key: string): Promise<void>;
  /**
   * Up to `limit` objects whose keys sort after `after` (all when undefined), in key order: the
   * orphan sweep walks the store in pages with it. Unfinished writes show too (the filesystem's
   * temporary files): a sweep leaves young objects alone.
   */
  list(after: string | undefined, limit: number): Promise<StoredObject[]>;
  /**
   * A URL at which anyone can GET the object for `ttlSeconds`, signed by the store itself (S3
   * presigned URLs), when the store serves objects directly.
   */
  presign?(key: string, ttlSeconds: number): Promise<string>;
  /** A path on this machine where the bytes can be read directly, when the store has one. */
  localPath?(key: string): string;
  /** Ends what the store keeps open (connections, spare files): the process is stopping. */
  close?(): void | Promise<void>;
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
 * The fs calls of a read or write stream, their failures turned into storage errors where they
 * happen: a pipeline that rejects then says by its error alone whether the store or the data failed.
 */
function storageFs(key: string) {
  type Callback = (err: unknown, ...rest: unknown[]) => void;
  const classified = (call: (...args: never[]) => void) => (...args: unknown[]) => {
    const done = args.pop() as Callback;
    const classify: Callback = (err, ...rest) => done(err ? asStorageError(err, key) : err, ...rest);
    (call as (...args: unknown[]) => void)(...args, classify);
  };
  return { open: classified(open), read: classified(read), write: classified(write), writev: classified(writev), close: classified(close) };
}

/** Where under the root the spare files live (spare-files.ts): no media key starts with a dot. */
export const SPARE_DIR = '.spare';

/**
 * Writes `data` into the spare file (empty, made ahead of time) and renames it to `path`: 'written',
 * or else the spare is dropped and the caller writes the ordinary way, which reports the store's
 * failure ('failed': the spare removed meanwhile, the disk full, `path`'s directory missing;
 * 'cross-device': `path` is on another filesystem than the spares).
 */
function writeSpare(spare: string, data: Buffer, path: string): 'written' | 'failed' | 'cross-device' {
  try {
    // `r+`: the spare must be there (never made here, where making it is what costs); it is empty.
    writeFileSync(spare, data, { flag: 'r+' });
    renameSync(spare, path);
    return 'written';
  } catch (err) {
    try {
      rmSync(spare, { force: true });
    } catch {
      // Left to the next pool's removal of old spares.
    }
    return (err as NodeJS.ErrnoException).code === 'EXDEV' ? 'cross-device' : 'failed';
  }
}

/**
 * Buffers up to this size are written with synchronous calls (open, write, close, rename; the
 * open of a spare file made ahead of time when one is ready, spare-files.ts) on the event loop's
 * thread instead of four hand-offs to libuv's thread pool. Each hand-off wakes a pool
 * thread and then the loop again; on the 2-core VM the proxy bench runs on that cost the loop about
 * 0.6 ms per image against 0.2–0.3 ms for the four calls themselves (docs/BENCHMARKS.md), while the
 * page-cache copy of 256 KiB takes a few tens of microseconds: the loop is held for less than the
 * hand-offs cost it. A larger image (a photo-like PNG, a 4K one) goes through the pool, so one
 * write never holds the loop for long. Neither path fsyncs (as before).
 */
export const SYNC_WRITE_MAX_BYTES = 256 * 1024;

export class FilesystemMediaStore implements MediaStore {
  /** Directories known to exist: a put into one of them needs no mkdir. */
  private readonly dirs = new Set<string>();
  /** Files made ahead of time for the synchronous writes (spare-files.ts). */
  private readonly spares: SpareFiles;

  constructor(private readonly root: string) {
    this.spares = new SpareFiles(join(resolve(root), SPARE_DIR));
  }

  private path(key: string): string {
    const path = resolve(this.root, key);
    if (!path.startsWith(resolve(this.root) + sep)) throw new Error(`media key escapes the store: ${key}`);
    return path;
  }

  async put(key: string, data: Buffer | Readable, opts: PutOptions = {}): Promise<{ bytes: number }> {
    const path = this.path(key);
    const dir = dirname(path);
    const tmp = `${path}.${randomHex(6)}.tmp`;
    if (Buffer.isBuffer(data)) return this.putBuffer(key, path, tmp, dir, data, opts.maxBytes);
    await this.makeDir(key, dir);
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
      // pipeline() settles as soon as it knows of the failure, before the file stream has closed,
      // even before its open(2) has run: removing the file now would race that open, which then
      // creates it again (an empty temporary file nobody removes). Wait for the stream to close
      // (a plain listener: its own 'error' comes just before).
      if (!file.closed) await new Promise<void>((closed) => file.destroy().once('close', () => closed()));
      await this.dropTemporary(tmp, dir);
      throw err;
    }
    return { bytes };
  }

  /**
   * Bytes already in memory (generated images): one write, no stream machinery. Up to
   * SYNC_WRITE_MAX_BYTES they are written on the calling thread (see there); larger ones through
   * libuv's thread pool.
   */
  private async putBuffer(key: string, path: string, tmp: string, dir: string, data: Buffer, maxBytes: number | undefined): Promise<{ bytes: number }> {
    if (maxBytes !== undefined && data.length > maxBytes) throw new MediaTooLarge(maxBytes);
    try {
      return await this.writeBuffer(key, path, tmp, dir, data);
    } catch (err) {
      // The write made no directory: a first write into it (or one removed meanwhile) makes it and
      // tries once more, so writes into directories that exist, nearly all of them, make none.
      if (!(err instanceof StorageError && err.code === 'ENOENT')) throw err;
      await this.makeDir(key, dir);
      return this.writeBuffer(key, path, tmp, dir, data);
    }
  }

  /** Makes `dir` (and its parents) unless this store made it already. */
  private async makeDir(key: string, dir: string): Promise<void> {
    if (this.dirs.has(dir)) return;
    await mkdir(dir, { recursive: true }).catch((err: unknown) => {
      throw asStorageError(err, key);
    });
    this.dirs.add(dir);
  }

  private async writeBuffer(key: string, path: string, tmp: string, dir: string, data: Buffer): Promise<{ bytes: number }> {
    if (data.length <= SYNC_WRITE_MAX_BYTES) {
      // Not for empty bytes: the object's time would be its spare's (the sweep of orphans goes by a write's time).
      const spare = data.length > 0 ? this.spares.take() : undefined;
      try {
        const spared = spare === undefined ? undefined : writeSpare(spare, data, path);
        if (spared === 'written') return { bytes: data.length };
        if (spared === 'cross-device') void this.spares.stop();
        writeFileSync(tmp, data, { flag: 'wx' });
        renameSync(tmp, path);
      } catch (err) {
        // As dropTemporary: a removal that fails too must not hide why the write failed.
        try {
          rmSync(tmp, { force: true });
        } catch {
          // Nothing was left to remove, or it cannot be: the sweep of orphans finds it.
        }
        this.dirs.delete(dir);
        throw asStorageError(err, key);
      } finally {
        // After the write, not before it (SpareFiles.replenish).
        if (data.length > 0) this.spares.replenish();
      }
      return { bytes: data.length };
    }
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

  read(key: string, range?: ByteRange): Readable {
    // A read that fails (the object gone, EIO, EISDIR) is the store's failure, as S3's: an upstream
    // submit streaming it must not blame the upstream, nor a download answer 500.
    return createReadStream(this.path(key), { ...(range && { start: range.start, end: range.end }), fs: storageFs(key) });
  }

  async stat(key: string): Promise<StoredObject | undefined> {
    const path = this.path(key);
    try {
      const s = await stat(path);
      return { key, bytes: s.size, modifiedAt: s.mtime };
    } catch (err) {
      // Only "no such file" is an object that is not there (ENOTDIR: a part of its path is a file).
      // Any other failure (EIO, ESTALE, EACCES, EMFILE) says nothing of the object: reported as
      // missing, the sweeper would delete the row of a stored output and a download would answer 404.
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' || code === 'ENOTDIR') return undefined;
      throw asStorageError(err, key);
    }
  }

  async list(after: string | undefined, limit: number): Promise<StoredObject[]> {
    const found: StoredObject[] = [];
    // Entries sorted as their keys sort (a directory as `name/`), so the walk yields keys in order
    // and skips every directory whose keys all sort before `after`.
    const walk = async (dir: string, prefix: string): Promise<void> => {
      let entries;
      try {
        entries = await readdir(dir, { withFileTypes: true });
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
        throw asStorageError(err, prefix);
      }
      const sorted = entries.map((e) => ({ e, name: e.isDirectory() ? `${e.name}/` : e.name })).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      for (const { e, name } of sorted) {
        if (found.length >= limit) return;
        const key = `${prefix}${name}`;
        if (e.isDirectory()) {
          if (after !== undefined && key < after && !after.startsWith(key)) continue;
          await walk(join(dir, e.name), key);
        } else if (e.isFile() && (after === undefined || key > after)) {
          const s = await stat(join(dir, e.name)).catch(() => undefined);
          if (s) found.push({ key, bytes: s.size, modifiedAt: s.mtime });
        }
      }
    };
    await walk(resolve(this.root), '');
    return found;
  }

  async delete(key: string): Promise<void> {
    await rm(this.path(key), { force: true }).catch((err: unknown) => {
      throw asStorageError(err, key);
    });
  }

  localPath(key: string): string {
    return this.path(key);
  }

  /** Removes the spare files (a graceful stop leaves none behind); a write after this makes none. */
  close(): Promise<void> {
    return this.spares.stop();
  }
}
