import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import sharp from 'sharp';
import { describe, expect, it } from 'vitest';
import { fitImage, headerSize, readMediaJson, sseMediaFrames, type MediaAnswerLimits, type MediaFrame } from '../../server/providers/image-output.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { ImageParams } from '../../server/providers/types.ts';
import { UpstreamResponse } from '../../server/providers/upstream-http.ts';

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

  it('applies an output_compression the upstream was not sent, even to an image of the asked size and format', async () => {
    const noise = await sharp(Buffer.from(Array.from({ length: 96 * 64 * 3 }, (_, i) => (i * 7919) % 251)), { raw: { width: 96, height: 64, channels: 3 } }).jpeg({ quality: 95 }).toBuffer();
    const compressed = (compression: number) => ({ ...params(96, 64, 'jpeg'), outputCompression: compression }) as ImageParams;
    const strong = await fitImage(noise, compressed(90));
    expect(headerSize(strong)).toEqual({ format: 'jpeg', width: 96, height: 64 });
    expect(strong.length).toBeLessThan(noise.length);
    expect(strong.length).toBeLessThan((await fitImage(noise, compressed(10))).length);
    // Sent upstream (OpenAI's GPT image models take output_compression): its bytes are kept.
    expect((await fitImage(noise, compressed(90), true)).equals(noise)).toBe(true);
    // None asked: kept too.
    expect((await fitImage(noise, params(96, 64, 'jpeg'))).equals(noise)).toBe(true);
  });

  it("with the model's resize: native, keeps the upstream's size: its bytes as they came, or re-encoded only for another format", async () => {
    const png = await encoded(96, 64, 'png');
    const native = (format: 'png' | 'jpeg' | 'webp') => ({ ...params(128, 128, format), resize: 'native' as const });
    expect((await fitImage(png, native('png'))).equals(png)).toBe(true);
    expect(headerSize(await fitImage(png, native('jpeg')))).toEqual({ format: 'jpeg', width: 96, height: 64 });
  });
});

/** An answer whose body arrives as `text` cut into pieces of the given sizes (cycled). */
function answer(text: string | Buffer, sizes: number[]): UpstreamResponse {
  const bytes = Buffer.isBuffer(text) ? text : Buffer.from(text, 'utf8');
  const chunks: Buffer[] = [];
  for (let at = 0, i = 0; at < bytes.length; i++) {
    const n = sizes[i % sizes.length]!;
    chunks.push(bytes.subarray(at, at + n));
    at += n;
  }
  return new UpstreamResponse(200, {}, Readable.from(chunks, { objectMode: false }));
}

const LIMITS: MediaAnswerLimits = { maxBytes: 64 * 1024 * 1024, maxMediaBytes: 16 * 1024 * 1024, maxOtherBytes: 64 * 1024 };
const IMAGE = { base64Paths: new Set(['b64_json']) };
const signal = new AbortController().signal;

async function frames(text: string | Buffer, sizes: number[], limits = LIMITS): Promise<(MediaFrame & { json: unknown })[]> {
  const out: (MediaFrame & { json: unknown })[] = [];
  for await (const f of sseMediaFrames(answer(text, sizes), IMAGE, limits, signal, 'image generation')) {
    out.push({ ...f, json: f.text.trim() === '[DONE]' ? '[DONE]' : JSON.parse(f.text) });
  }
  return out;
}

describe('sseMediaFrames (SSE with the images decoded while they arrive)', () => {
  const a = randomBytes(200_001);
  const b = randomBytes(3);
  const stream =
    '\ufeff: a comment first\n' +
    `event: image_generation.partial_image\ndata: {"type":"image_generation.partial_image","b64_json":"${a.toString('base64')}","partial_image_index":0}\n\n` +
    'retry: 1000\r\nid: 7\r\n' +
    `data: {"type":"image_generation.completed",\r\ndata: "b64_json":"${b.toString('base64')}"}\r\n\r\n` +
    'data\n\n' + // a data field without a colon: an empty frame, not dispatched
    'event: done\rdata: [DONE]'; // CR line ends, and no blank line at the end

  it.each([[[1 << 20]], [[1]], [[2]], [[7, 1, 3]], [[4096]]])('reads every frame, however the stream is cut (%j)', async (sizes) => {
    const got = await frames(stream, sizes);
    expect(got.map((f) => [f.event, f.json])).toEqual([
      ['image_generation.partial_image', { type: 'image_generation.partial_image', b64_json: 'mg-media:0', partial_image_index: 0 }],
      [undefined, { type: 'image_generation.completed', b64_json: 'mg-media:1' }],
      ['done', '[DONE]'],
    ]);
    expect(got[0]!.media.get('mg-media:0')!.equals(a)).toBe(true);
    expect(got[1]!.media.get('mg-media:1')!.equals(b)).toBe(true);
  });

  it('fails a frame over the limits, and a stream over its byte limit, as failed', async () => {
    const err = await frames(stream, [4096], { ...LIMITS, maxMediaBytes: 100_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    expect([(err as ProviderError).kind, (err as ProviderError).message]).toEqual(['failed', 'the upstream image generation answered more than 100000 bytes of images']);
    const big = await frames(stream, [4096], { ...LIMITS, maxBytes: 1000 }).catch((e: unknown) => e);
    expect((big as ProviderError).kind).toBe('failed');
    const bad = await frames('data: {"b64_json":"not base64!"}\n\n', [5]).catch((e: unknown) => e);
    expect([(bad as ProviderError).kind, (bad as ProviderError).message]).toEqual(['retryable', 'the upstream image generation answered an image that is not valid base64']);
  });
});

describe('readMediaJson (a whole answer with its images decoded while it arrives)', () => {
  it('decodes the images at the given paths, in a list of answers too', async () => {
    const img = randomBytes(70_000);
    const body = JSON.stringify([{ candidates: [{ content: { parts: [{ text: 'hi' }, { inlineData: { mimeType: 'image/png', data: img.toString('base64') } }] } }] }]);
    const fields = { base64Paths: new Set(['[].candidates[].content.parts[].inlineData.data']) };
    const { text, media } = await readMediaJson(answer(body, [333]), fields, LIMITS, signal, 'image generation');
    expect(JSON.parse(text)).toEqual([{ candidates: [{ content: { parts: [{ text: 'hi' }, { inlineData: { mimeType: 'image/png', data: 'mg-media:0' } }] } }] }]);
    expect(media.get('mg-media:0')!.equals(img)).toBe(true);
  });
});
