/**
 * Input image inspection decodes every image to its end (cheaply: down to the last row), so a
 * truncated or corrupted image is the client's 400 invalid_image, from bytes or from a file path.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { beforeAll, describe, expect, it } from 'vitest';
import { ApiError } from '../../server/errors.ts';
import { inspectImage } from '../../server/lib/image-inspect.ts';

let png: Buffer;
let jpeg: Buffer;
beforeAll(async () => {
  const raw = Buffer.alloc(300 * 200 * 3);
  for (let i = 0; i < raw.length; i++) raw[i] = (i * 7919) % 251;
  png = await sharp(raw, { raw: { width: 300, height: 200, channels: 3 } }).png().toBuffer();
  jpeg = await sharp(raw, { raw: { width: 300, height: 200, channels: 3 } }).jpeg().toBuffer();
});

async function codeOf(source: Buffer | string): Promise<string> {
  try {
    await inspectImage(source, 'firstFrame');
    return 'ok';
  } catch (err) {
    if (err instanceof ApiError) return err.code;
    throw err;
  }
}

describe('inspectImage', () => {
  it('reads type, size and alpha of a complete image, from bytes or a file', async () => {
    expect(await inspectImage(png, 'x')).toEqual({ format: 'png', mimeType: 'image/png', width: 300, height: 200, hasAlpha: false });
    const path = join(mkdtempSync(join(tmpdir(), 'mediagate-inspect-')), 'a.jpg');
    writeFileSync(path, jpeg);
    expect(await inspectImage(path, 'x')).toMatchObject({ mimeType: 'image/jpeg', width: 300, height: 200 });
  });

  it.each([
    ['an empty buffer', () => Buffer.alloc(0)],
    ['a PNG cut at 60%', () => png.subarray(0, Math.floor(png.length * 0.6))],
    ['a PNG cut just before its end chunk', () => png.subarray(0, png.length - 40)],
    ['a PNG with its compressed pixels overwritten', () => Buffer.concat([png.subarray(0, 200), Buffer.alloc(png.length - 400, 0x55), png.subarray(png.length - 200)])],
    ['a JPEG cut at 70%', () => jpeg.subarray(0, Math.floor(jpeg.length * 0.7))],
    ['text', () => Buffer.from('not an image')],
  ])('refuses %s with invalid_image', async (_what, make) => {
    expect(await codeOf(make())).toBe('invalid_image');
  });

  it('refuses an image under 16 pixels on an edge', async () => {
    const tiny = await sharp({ create: { width: 15, height: 40, channels: 3, background: '#000' } }).png().toBuffer();
    expect(await codeOf(tiny)).toBe('invalid_image');
  });
});
