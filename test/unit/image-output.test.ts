import sharp from 'sharp';
import { describe, expect, it } from 'vitest';
import { fitImage, headerSize } from '../../server/providers/image-output.ts';
import type { ImageParams } from '../../server/providers/types.ts';

/** A small image with some detail (a flat one compresses to almost nothing). */
async function encoded(width: number, height: number, format: 'png' | 'jpeg' | 'webp', options: Record<string, unknown> = {}): Promise<Buffer> {
  const pixels = Buffer.alloc(width * height * 4);
  for (let i = 0; i < pixels.length; i++) pixels[i] = (i * 37) % 251;
  const img = sharp(pixels, { raw: { width, height, channels: 4 } });
  if (format === 'png') return img.png(options).toBuffer();
  if (format === 'jpeg') return img.jpeg(options).toBuffer();
  return img.webp(options).toBuffer();
}

describe('headerSize (the size check of upstream outputs, without sharp)', () => {
  const cases: [string, number, number, 'png' | 'jpeg' | 'webp', Record<string, unknown>][] = [
    ['png', 1024, 1024, 'png', {}],
    ['png, odd size, palette', 37, 1201, 'png', { palette: true }],
    ['jpeg baseline', 1536, 1024, 'jpeg', {}],
    ['jpeg progressive', 33, 65, 'jpeg', { progressive: true }],
    ['jpeg with EXIF (an APP1 segment before the frame)', 640, 480, 'jpeg', { exif: true }],
    ['webp lossy (VP8)', 1000, 750, 'webp', {}],
    ['webp lossless (VP8L)', 257, 129, 'webp', { lossless: true }],
    ['webp with alpha (VP8X)', 16383, 2, 'webp', { alphaQuality: 50 }],
  ];
  for (const [name, width, height, format, options] of cases) {
    it(`reads ${name} as sharp does`, async () => {
      let data = await encoded(width, height, format, options);
      if (options.exif) data = await sharp(data).withExif({ IFD0: { Copyright: 'mediagate' } }).jpeg().toBuffer();
      const meta = await sharp(data).metadata();
      expect(headerSize(data)).toEqual({ format: meta.format, width: meta.width, height: meta.height });
      expect(headerSize(data)).toEqual({ format, width, height });
    });
  }

  it('gives up on what it cannot read', async () => {
    const png = await encoded(64, 64, 'png');
    expect(headerSize(png.subarray(0, 20))).toBeUndefined();
    expect(headerSize(Buffer.from('GIF89a......'))).toBeUndefined();
    expect(headerSize(Buffer.alloc(0))).toBeUndefined();
    // A JPEG cut before its frame header, and one whose segments do not chain.
    const jpeg = await encoded(64, 64, 'jpeg');
    expect(headerSize(jpeg.subarray(0, 12))).toBeUndefined();
    const broken = Buffer.from(jpeg);
    broken[2] = 0x00;
    expect(headerSize(broken)).toBeUndefined();
  });
});

describe('fitImage', () => {
  const params = (width: number, height: number, outputFormat: 'png' | 'jpeg' | 'webp'): ImageParams =>
    ({ width, height, outputFormat, outputCompression: undefined }) as unknown as ImageParams;

  it('passes an image of the asked size and format through byte for byte', async () => {
    const png = await encoded(96, 64, 'png');
    expect((await fitImage(png, params(96, 64, 'png'))).equals(png)).toBe(true);
  });

  it('resizes and re-encodes otherwise', async () => {
    const png = await encoded(96, 64, 'png');
    const out = await fitImage(png, params(48, 48, 'webp'));
    expect(await sharp(out).metadata()).toMatchObject({ format: 'webp', width: 48, height: 48 });
    const jpeg = await fitImage(png, params(96, 64, 'jpeg'));
    expect(headerSize(jpeg)).toEqual({ format: 'jpeg', width: 96, height: 64 });
  });

  it('reads a format it has no header reader for with sharp (GIF), and fails what sharp cannot decode', async () => {
    const gif = await sharp(await encoded(32, 32, 'png')).gif().toBuffer();
    const out = await fitImage(gif, params(32, 32, 'png'));
    expect(headerSize(out)).toEqual({ format: 'png', width: 32, height: 32 });
    await expect(fitImage(Buffer.from('not an image at all'), params(32, 32, 'png'))).rejects.toMatchObject({ kind: 'retryable' });
  });
});
