/**
 * Media store (design §7). Generated outputs and decoded inputs are written here, because
 * upstream URLs expire or need credentials. The filesystem store is the default; every key is a
 * relative path under its root.
 */
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, rename, rm, stat } from 'node:fs/promises';
import { dirname, join, resolve, sep } from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { randomBytes } from 'node:crypto';

export interface MediaStore {
  /** Writes bytes (or a stream) under `key` atomically: readers never see a partial file. */
  put(key: string, data: Buffer | Readable): Promise<{ bytes: number }>;
  /** Moves a finished local file into the store. */
  putFile(key: string, path: string): Promise<{ bytes: number }>;
  read(key: string): Readable;
  size(key: string): Promise<number | undefined>;
  delete(key: string): Promise<void>;
}

export class FilesystemMediaStore implements MediaStore {
  constructor(private readonly root: string) {}

  private path(key: string): string {
    const path = resolve(this.root, key);
    if (!path.startsWith(resolve(this.root) + sep)) throw new Error(`media key escapes the store: ${key}`);
    return path;
  }

  async put(key: string, data: Buffer | Readable): Promise<{ bytes: number }> {
    const path = this.path(key);
    await mkdir(dirname(path), { recursive: true });
    const tmp = `${path}.${randomBytes(6).toString('hex')}.tmp`;
    try {
      if (Buffer.isBuffer(data)) await pipeline([data], createWriteStream(tmp));
      else await pipeline(data, createWriteStream(tmp));
      await rename(tmp, path);
    } catch (err) {
      await rm(tmp, { force: true });
      throw err;
    }
    return { bytes: (await stat(path)).size };
  }

  async putFile(key: string, source: string): Promise<{ bytes: number }> {
    const path = this.path(key);
    await mkdir(dirname(path), { recursive: true });
    try {
      await rename(source, path);
    } catch {
      // Different filesystem: copy, then remove the source.
      await this.put(key, createReadStream(source));
      await rm(source, { force: true });
    }
    return { bytes: (await stat(path)).size };
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
    await rm(this.path(key), { force: true });
  }
}

export function mediaRoot(dataDir: string): string {
  return join(dataDir, 'media');
}
