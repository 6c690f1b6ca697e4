/**
 * An input image is a PNG, JPEG, WebP or GIF (the contract's types): inspectImage refuses every
 * other format libvips can read (TIFF, SVG, HEIF/AVIF) as `400 invalid_image` from its header,
 * before any pixel is decoded. An SVG is rendered when decoded, filters included: a few hundred
 * bytes of one once held a decoder thread for minutes.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { beforeAll, describe, expect, it } from 'vitest';
import { ApiError } from '../../server/errors.ts';
import { inspectImage } from '../../server/lib/image-inspect.ts';

const solid = () => sharp({ create: { width: 64, height: 48, channels: 3, background: '#336699' } });
/** An SVG whose filters make libvips' renderer work for a long time on a 2000x2000 canvas. */
const filteredSvg = Buffer.from(
  '<svg xmlns="http://www.w3.org/2000/svg" width="2000" height="2000"><filter id="f"><feTurbulence baseFrequency="0.01" numOctaves="2"/>' +
    '<feGaussianBlur stdDeviation="50"/></filter><rect width="100%" height="100%" filter="url(#f)"/></svg>',
);
const plainSvg = Buffer.from('<svg xmlns="http://www.w3.org/2000/svg" width="64" height="48"><rect width="64" height="48" fill="red"/></svg>');

let tiff: Buffer;
let avif: Buffer;
beforeAll(async () => {
  tiff = await solid().tiff().toBuffer();
  avif = await solid().avif().toBuffer();
});

async function refusal(source: Buffer | string): Promise<ApiError> {
  const err = await inspectImage(source, 'image').then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(err instanceof ApiError)) throw new Error(`expected an ApiError, got ${String(err)}`);
  return err;
}

describe('inspectImage formats', () => {
  it.each([
    ['png', 'image/png', () => solid().png().toBuffer()],
    ['jpeg', 'image/jpeg', () => solid().jpeg().toBuffer()],
    ['webp', 'image/webp', () => solid().webp().toBuffer()],
    ['gif', 'image/gif', () => solid().gif().toBuffer()],
  ])('accepts a %s image', async (format, mimeType, make) => {
    expect(await inspectImage(await make(), 'image')).toMatchObject({ format, mimeType, width: 64, height: 48 });
  });

  it.each([
    ['TIFF', () => tiff],
    ['SVG', () => plainSvg],
    ['HEIF', () => avif],
  ])('refuses a %s image as invalid_image, naming its format', async (format, make) => {
    const err = await refusal(make());
    expect(err.status).toBe(400);
    expect(err.code).toBe('invalid_image');
    expect(err.param).toBe('image');
    expect(err.message).toBe(`'image' is in ${format} format; images must be PNG, JPEG, WebP or GIF.`);
  });

  it('refuses a stored TIFF read from its file path', async () => {
    const path = join(mkdtempSync(join(tmpdir(), 'mediagate-inspect-')), 'frame.png');
    writeFileSync(path, tiff);
    expect((await refusal(path)).message).toBe("'image' is in TIFF format; images must be PNG, JPEG, WebP or GIF.");
  });

  it('refuses a filter-heavy SVG from its header, without rendering it', async () => {
    const started = Date.now();
    expect((await refusal(filteredSvg)).code).toBe('invalid_image');
    // Rendering it takes tens of seconds; reading its header takes milliseconds.
    expect(Date.now() - started).toBeLessThan(2000);
  }, 20_000);
});
