/**
 * What every image adapter does with upstream bytes, in one place: recognise a format by its magic
 * bytes, read a bounded answer body or event stream, and hand the client exactly the pixels and format it asked for
 * (resize and re-encode with sharp only when the upstream's image differs; otherwise pass its bytes
 * through untouched).
 */
import { createParser, type EventSourceMessage } from 'eventsource-parser';
import sharp, { type Sharp } from 'sharp';
import { ProviderError } from './provider-error.ts';
import type { ImageFormat, ImageParams } from './types.ts';
import { isTimeout, type UpstreamResponse } from './upstream-http.ts';

export const MIME: Record<ImageFormat, string> = { png: 'image/png', jpeg: 'image/jpeg', webp: 'image/webp' };

/** The format by magic bytes: the upstream goes by the part's Content-Type, so it must be right. */
export function sniff(data: Buffer): ImageFormat | undefined {
  if (data.length >= 8 && data.readUInt32BE(0) === 0x89504e47 && data.readUInt32BE(4) === 0x0d0a1a0a) return 'png';
  if (data.length >= 3 && data[0] === 0xff && data[1] === 0xd8 && data[2] === 0xff) return 'jpeg';
  if (data.length >= 12 && data.toString('latin1', 0, 4) === 'RIFF' && data.toString('latin1', 8, 12) === 'WEBP') return 'webp';
  return undefined;
}

/** An error while the body was being read: the caller's abort stays an abort, the rest is retryable. */
export function bodyError(err: unknown, signal: AbortSignal, what: string): unknown {
  if (signal.aborted) return signal.reason ?? err;
  if (err instanceof ProviderError) return err;
  return new ProviderError('retryable', `the upstream ${what} ${isTimeout(err) ? 'timed out' : 'broke off before its answer was complete'}`, { cause: err });
}

/**
 * The SSE frames of an answer as they arrive (eventsource-parser: `event:` lines optional, blank
 * lines in LF or CRLF form), bounded: a frame over `maxFrameChars`, or over `maxBytes` in all, is a
 * `failed` ProviderError. A last frame the upstream did not terminate is still dispatched. Leaving
 * the loop early (an answer found, an error, an abort) drops the rest of the upstream's answer.
 */
export async function* sseFrames(res: UpstreamResponse, signal: AbortSignal, what: string, limits: { maxFrameChars: number; maxBytes?: number }): AsyncGenerator<EventSourceMessage> {
  const decoder = new TextDecoder();
  const frames: EventSourceMessage[] = [];
  let overflow = false;
  const parser = createParser({
    onEvent: (frame) => frames.push(frame),
    onError: (err) => {
      if (err.type === 'max-buffer-size-exceeded') overflow = true;
    },
    maxBufferSize: limits.maxFrameChars,
  });
  const mib = (n: number) => Math.round(n / 1024 / 1024);
  const chunks = res.body[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  let total = 0;
  try {
    for (;;) {
      const chunk = await chunks.next().catch((err: unknown) => {
        throw bodyError(err, signal, what);
      });
      if (!chunk.done) total += chunk.value.byteLength;
      if (total > (limits.maxBytes ?? Infinity)) throw new ProviderError('failed', `the upstream ${what} answered more than ${mib(limits.maxBytes!)} MiB`);
      parser.feed(chunk.done ? `${decoder.decode()}\n\n` : decoder.decode(chunk.value, { stream: true }));
      if (overflow) throw new ProviderError('failed', `the upstream ${what} streamed an event larger than ${mib(limits.maxFrameChars)} MiB`);
      yield* frames.splice(0);
      if (chunk.done) return;
    }
  } finally {
    if (!res.body.readableEnded) res.body.destroy();
  }
}

/** The whole body, refused past `max` bytes (and then not read further). */
export async function readBounded(res: UpstreamResponse, max: number, signal: AbortSignal, what: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let total = 0;
  try {
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      total += chunk.byteLength;
      if (total > max) throw new ProviderError('failed', `the upstream ${what} answered more than ${Math.round(max / 1024 / 1024)} MiB`);
      chunks.push(chunk);
    }
  } catch (err) {
    res.body.destroy();
    throw bodyError(err, signal, what);
  }
  return Buffer.concat(chunks);
}

/**
 * The format and pixel size an image's header declares (PNG IHDR, JPEG SOFn, WebP VP8/VP8L/VP8X),
 * read in place: no decoding, no trip to sharp's threads. Undefined when the header is not one of
 * these or is cut short.
 */
export function headerSize(data: Buffer): { format: ImageFormat; width: number; height: number } | undefined {
  const format = sniff(data);
  if (format === 'png') {
    // Signature (8), then the IHDR chunk: length (4), type (4), width (4), height (4).
    if (data.length < 24 || data.toString('latin1', 12, 16) !== 'IHDR') return undefined;
    return { format, width: data.readUInt32BE(16), height: data.readUInt32BE(20) };
  }
  if (format === 'jpeg') {
    // Segments from offset 2: 0xFF, marker, 2-byte length (which counts itself); a SOFn segment
    // (C0–CF but C4 DHT, C8 JPG, CC DAC) holds precision (1), height (2), width (2).
    let at = 2;
    while (at + 9 < data.length) {
      if (data[at] !== 0xff) return undefined;
      const marker = data[at + 1]!;
      if (marker === 0xff) {
        at++; // fill byte
        continue;
      }
      if (marker === 0xd8 || marker === 0x01 || (marker >= 0xd0 && marker <= 0xd7)) {
        at += 2; // markers without a length
        continue;
      }
      if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) {
        return { format, width: data.readUInt16BE(at + 7), height: data.readUInt16BE(at + 5) };
      }
      if (marker === 0xd9 || marker === 0xda) return undefined; // end, or scan data before any frame header
      at += 2 + data.readUInt16BE(at + 2);
    }
    return undefined;
  }
  if (format === 'webp') {
    if (data.length < 30) return undefined;
    const chunk = data.toString('latin1', 12, 16);
    if (chunk === 'VP8 ') return { format, width: data.readUInt16LE(26) & 0x3fff, height: data.readUInt16LE(28) & 0x3fff };
    if (chunk === 'VP8L') {
      const bits = data.readUInt32LE(21);
      return { format, width: (bits & 0x3fff) + 1, height: ((bits >>> 14) & 0x3fff) + 1 };
    }
    if (chunk === 'VP8X') return { format, width: data.readUIntLE(24, 3) + 1, height: data.readUIntLE(27, 3) + 1 };
  }
  return undefined;
}

/**
 * The image exactly as the client asked for it: resized (cover, centred) when the pixel size
 * differs, re-encoded when the size or the format differs, else the upstream's bytes untouched.
 * Whether they match is read from the header (headerSize); sharp reads it only when that fails.
 */
export async function fitImage(data: Buffer, params: ImageParams): Promise<Buffer> {
  let meta: { format?: string; width?: number; height?: number } | undefined = headerSize(data);
  if (!meta) {
    try {
      meta = await sharp(data).metadata();
    } catch (err) {
      throw new ProviderError('retryable', 'the upstream answered an image that could not be decoded', { cause: err });
    }
  }
  const sameSize = meta.width === params.width && meta.height === params.height;
  if (sameSize && meta.format === params.outputFormat) return data;
  try {
    let img = sharp(data);
    if (!sameSize) img = img.resize(params.width, params.height, { fit: 'cover', position: 'centre' });
    return await encode(img, params.outputFormat, params.outputCompression);
  } catch (err) {
    throw new ProviderError('retryable', 'the upstream answered an image that could not be decoded', { cause: err });
  }
}

/** Compression 0 (none) – 100 (maximum), as in the contract; the same mapping as the local renderer. */
export function encode(img: Sharp, format: ImageFormat, compression: number | undefined): Promise<Buffer> {
  const quality = compression === undefined ? 85 : Math.max(1, Math.min(100, Math.round(100 - compression)));
  switch (format) {
    case 'png':
      return img.png().toBuffer();
    case 'jpeg':
      // JPEG has no alpha: transparent pixels become white, not whatever colour they hid.
      return img.flatten({ background: '#ffffff' }).jpeg({ quality }).toBuffer();
    case 'webp':
      return img.webp({ quality }).toBuffer();
  }
}
