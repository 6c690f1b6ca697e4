/**
 * The filesystem media store on real files: bytes in memory and streams are stored whole under
 * their key, nothing is kept past a byte limit, and no temporary file is left behind.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, describe, expect, it } from 'vitest';
import { FilesystemMediaStore, MediaTooLarge } from '../../server/storage/media-store.ts';

const root = mkdtempSync(join(tmpdir(), 'mg-store-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const store = new FilesystemMediaStore(root);
const filesIn = (dir: string) => readdirSync(join(root, dir));

describe('FilesystemMediaStore', () => {
  it('stores a buffer and a stream whole, leaving only the final files', async () => {
    const bytes = Buffer.from('a'.repeat(70_000));
    expect(await store.put('out/aa/one.png', bytes)).toEqual({ bytes: 70_000 });
    expect(await store.put('out/aa/two.png', Readable.from([bytes.subarray(0, 100), bytes.subarray(100)]))).toEqual({ bytes: 70_000 });
    expect(readFileSync(join(root, 'out/aa/one.png')).equals(bytes)).toBe(true);
    expect(readFileSync(join(root, 'out/aa/two.png')).equals(bytes)).toBe(true);
    expect(filesIn('out/aa').sort()).toEqual(['one.png', 'two.png']);
  });

  it('keeps nothing of a buffer or a stream over the byte limit', async () => {
    await expect(store.put('big/bb/one.bin', Buffer.alloc(11), { maxBytes: 10 })).rejects.toBeInstanceOf(MediaTooLarge);
    await expect(store.put('big/bb/two.bin', Readable.from([Buffer.alloc(6), Buffer.alloc(6)]), { maxBytes: 10 })).rejects.toBeInstanceOf(MediaTooLarge);
    expect(await store.put('big/bb/three.bin', Buffer.alloc(10), { maxBytes: 10 })).toEqual({ bytes: 10 });
    expect(filesIn('big/bb')).toEqual(['three.bin']);
  });

  it('recreates a directory removed after it was first used', async () => {
    await store.put('gone/cc/one.png', Buffer.from('x'));
    rmSync(join(root, 'gone'), { recursive: true });
    await expect(store.put('gone/cc/two.png', Buffer.from('y'))).rejects.toThrow();
    await store.put('gone/cc/two.png', Buffer.from('y'));
    expect(await store.size('gone/cc/two.png')).toBe(1);
  });
});
