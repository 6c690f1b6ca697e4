/**
 * What every image adapter does with upstream bytes, in one place: recognise a format by its magic
 * bytes, read a bounded answer body or event stream, and hand the client exactly the pixels and format it asked for
 * (resize and re-encode with sharp only when the upstream's image differs; otherwise pass its bytes
 * through untouched).
 */
import sharp, { type Metadata, type Sharp } from 'sharp';
import { ApiError } from '../errors.ts';
import { MAX_IMAGE_PIXELS } from '../lib/image-inspect.ts';
import { MediaJsonScanner, indexOfEither, type MediaJsonFields } from '../lib/media-json-scanner.ts';
import { ProviderError } from './provider-error.ts';
import type { ImageFormat, ImageParams } from './types.ts';
import { isTimeout, sizeOf, type UpstreamResponse } from './upstream-http.ts';

export const MIME: Record<ImageFormat, string> = { png: 'image/png', jpeg: 'image/jpeg', webp: 'image/webp' };

/** The format by magic bytes: the upstream goes by the part's Content-Type, so it must be right. */
export function sniff(data: Buffer): ImageFormat | undefined {
  if (data.length >= 8 && data.readUInt32BE(0) === 0x89504e47 && data.readUInt32BE(4) === 0x0d0a1a0a) return 'png';
  if (data.length >= 3 && data[0] === 0xff && data[1] === 0xd8 && data[2] === 0xff) return 'jpeg';
  if (data.length >= 12 && data.toString('latin1', 0, 4) === 'RIFF' && data.toString('latin1', 8, 12) === 'WEBP') return 'webp';
  return undefined;
}

/** JPEG and WebP quality of an input re-encoded on its way upstream (turned upright). */
const UPRIGHT_QUALITY = 95;

/**
 * An input image as an upstream takes it: PNG, JPEG and WebP go as they are (only PNG with
 * `pngOnly`); anything else the gateway accepts (a GIF: its first frame) is converted to PNG, since
 * the upstream goes by the declared type and refuses the others. An image stored turned (EXIF
 * orientation other than 1, as phones store photos) is turned upright and re-encoded without the
 * tag: the gateway measured it upright (inspectImage), a mask was drawn over it upright, and an
 * upstream that ignores the tag would see it sideways. `name` names the input in the error.
 */
export async function uploadableImage(data: Buffer, name: string, pngOnly = false): Promise<{ data: Buffer; format: ImageFormat }> {
  const sniffed = sniff(data);
  const format = sniffed !== undefined && (!pngOnly || sniffed === 'png') ? sniffed : 'png';
  try {
    if (format === sniffed && !isTurned(await sharp(data).metadata())) return { data, format };
    const upright = sharp(data).autoOrient();
    const encoded = format === 'jpeg' ? upright.jpeg({ quality: UPRIGHT_QUALITY }) : format === 'webp' ? upright.webp({ quality: UPRIGHT_QUALITY }) : upright.png();
    return { data: await encoded.toBuffer(), format };
  } catch (err) {
    throw new ProviderError('invalid_request', `the input '${name}' is not an image the upstream can take`, { cause: err });
  }
}

/** Whether an image is stored turned: an EXIF orientation other than 1 (a viewer rotates or mirrors it). */
export function isTurned(meta: Pick<Metadata, 'orientation'>): boolean {
  return meta.orientation !== undefined && meta.orientation !== 1;
}

/** An error while the body was being read: the caller's abort stays an abort, the rest is retryable. */
export function bodyError(err: unknown, signal: AbortSignal, what: string): unknown {
  if (signal.aborted) return signal.reason ?? err;
  if (err instanceof ProviderError) return err;
  return new ProviderError('retryable', `the upstream ${what} ${isTimeout(err) ? 'timed out' : 'broke off before its answer was complete'}`, { cause: err });
}

/** Limits of an answer read with its media decoded (readMediaJson, sseMediaFrames). */
export interface MediaAnswerLimits {
  /** Bytes of the whole answer, as received. */
  maxBytes: number;
  /** Decoded media bytes of the answer (readMediaJson) or of one frame (sseMediaFrames). */
  maxMediaBytes: number;
  /** Bytes of the JSON besides its media (of the answer, or of one frame). */
  maxOtherBytes: number;
}

/** JSON of an answer with its media strings decoded: `text` has a token where each one was, `media` its bytes by token. */
export interface MediaJson {
  text: string;
  media: Map<string, Buffer>;
}

/** An SSE frame: its `event:` field, its data (`data:` lines joined by LF) as MediaJson (tokens unique across the stream). */
export interface MediaFrame extends MediaJson {
  event?: string;
}

/** Numbers the media of one answer: tokens stay unique across the frames of a stream. */
interface TokenCounter {
  next: number;
}

/** A scanner whose sinks collect each media string into one buffer, kept under a token unique within the answer. */
function mediaScanner(fields: MediaJsonFields, limits: MediaAnswerLimits, keep: (token: string, bytes: Buffer) => void, tokens: TokenCounter): MediaJsonScanner {
  return new MediaJsonScanner(fields, { maxMediaBytes: limits.maxMediaBytes, maxItemBytes: limits.maxMediaBytes, maxMediaCount: 1024, maxOtherBytes: limits.maxOtherBytes, maxReferenceChars: 0 }, () => {
    const chunks: Buffer[] = [];
    return {
      write: (chunk) => void chunks.push(chunk),
      end: async () => {
        const token = `mg-media:${tokens.next++}`;
        keep(token, chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks));
        return token;
      },
      abort: () => void (chunks.length = 0),
    };
  });
}

/**
 * A failure while an answer was read (readMediaJson, sseMediaFrames) as the error to throw: an
 * answer over the limits stays `failed` (reading it again cannot help) and the caller's abort an
 * abort. The rest, on a 2xx, is `maybeAccepted` as readJson's is (`unreadAnswer`): the upstream
 * took the request and may have made, and billed, the images, so they are not made again on
 * another member.
 */
function answerError(err: unknown, res: UpstreamResponse, limits: MediaAnswerLimits, signal: AbortSignal, what: string): unknown {
  const error = scannedError(err, limits, signal, what);
  return res.ok && error instanceof ProviderError && error.kind !== 'failed' ? res.unreadAnswer(error) : error;
}

/** A scanner's complaint (it speaks to clients: 400/413) as what it means for an upstream answer; anything else as bodyError says. */
function scannedError(err: unknown, limits: MediaAnswerLimits, signal: AbortSignal, what: string): unknown {
  if (!(err instanceof ApiError)) return bodyError(err, signal, what);
  if (err.code === 'body_too_large') return new ProviderError('failed', `the upstream ${what} answered more than ${sizeOf(limits.maxOtherBytes)} besides its images`);
  if (err.status === 413) return new ProviderError('failed', `the upstream ${what} answered more than ${sizeOf(limits.maxMediaBytes)} of images`);
  if (err.code === 'invalid_data_url') return new ProviderError('retryable', `the upstream ${what} answered an image that is not valid base64`);
  return new ProviderError('retryable', `the upstream ${what} answered something other than JSON`);
}

/**
 * Rethrows a failure to use what an upstream's 2xx answer carried (an image that cannot be decoded
 * or fetched) as `maybeAccepted`: the upstream made, and billed, the image, so the work must not
 * run again on another member. Anything but a ProviderError (the caller's abort) goes as it is.
 */
export function throwAccepted(err: unknown): never {
  throw err instanceof ProviderError && !err.maybeAccepted ? err.with({ maybeAccepted: true }) : err;
}

/**
 * A whole JSON answer, its media strings at `fields` decoded as the answer arrives
 * (MediaJsonScanner): no text of the answer, no base64 string, only the media's bytes and the few
 * KiB around them. Bounded by `limits`; the caller parses `text`. A 2xx whose body breaks off,
 * times out or is not JSON fails as `maybeAccepted` (answerError).
 */
export async function readMediaJson(res: UpstreamResponse, fields: MediaJsonFields, limits: MediaAnswerLimits, signal: AbortSignal, what: string): Promise<MediaJson> {
  const media = new Map<string, Buffer>();
  const scanner = mediaScanner(fields, limits, (token, bytes) => media.set(token, bytes), { next: 0 });
  let total = 0;
  try {
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      total += chunk.byteLength;
      if (total > limits.maxBytes) throw new ProviderError('failed', `the upstream ${what} answered more than ${Math.round(limits.maxBytes / 1024 / 1024)} MiB`);
      await scanner.push(chunk);
    }
    return { text: scanner.end().toString('utf8'), media };
  } catch (err) {
    res.body.destroy();
    scanner.abort(err as Error);
    throw answerError(err, res, limits, signal, what);
  }
}

const LF = 0x0a;
const CR = 0x0d;
/** Longest field name (`event`, `data`, `id`, `retry`) and `event:` value kept; longer ones are skipped. */
const MAX_FIELD_BYTES = 256;

/**
 * The SSE frames of an answer as they arrive, each frame's JSON with its media strings at `fields`
 * decoded while it arrives: a frame holding a 20 MiB image never exists as text. SSE as served by
 * OpenAI and Google: `event:` lines optional, lines ending in LF, CRLF or CR, `data:` lines of a
 * frame joined by LF, comments and other fields skipped, a leading BOM ignored, a last frame the
 * upstream did not end with a blank line still dispatched. Bounded: more than `maxBytes` in all, or
 * a frame over the media or other-bytes limit, is a `failed` ProviderError; a 2xx that breaks off,
 * times out or streams what is not JSON fails as `maybeAccepted` (answerError). Leaving the loop
 * early (an answer found, an error, an abort) drops the rest of the upstream's answer.
 */
export async function* sseMediaFrames(res: UpstreamResponse, fields: MediaJsonFields, limits: MediaAnswerLimits, signal: AbortSignal, what: string): AsyncGenerator<MediaFrame> {
  let media = new Map<string, Buffer>();
  const tokens: TokenCounter = { next: 0 };
  // One scanner for every frame (reset between them); its sinks put each frame's media in `media`.
  const scanner = mediaScanner(fields, limits, (token, bytes) => media.set(token, bytes), tokens);
  let dataLines = 0;
  let event: string | undefined;
  /** The line being read: its field name until the colon, then what its value goes to. */
  type Line = { at: 'name'; name: number[] } | { at: 'value'; field: 'data' | 'event' | 'other'; value: number[]; first: boolean };
  let line = { at: 'name', name: [] } as Line;
  let skipLF = false;
  let started = false;
  let total = 0;
  const frames: MediaFrame[] = [];

  const endLine = async () => {
    const l = line;
    line = { at: 'name', name: [] };
    if (l.at === 'value') {
      if (l.field === 'event') event = Buffer.from(l.value).toString('utf8');
      return;
    }
    if (l.name.length > 0) {
      // A field without a colon has an empty value.
      const field = fieldOf(l.name);
      if (field === 'data') await dataLine();
      else if (field === 'event') event = '';
      return;
    }
    // A blank line ends the frame (one whose data is empty is not dispatched, as the SSE standard says).
    const text = dataLines > 0 ? scanner.end().toString('utf8') : '';
    if (text !== '') frames.push({ ...(event !== undefined && { event }), text, media });
    scanner.reset();
    media = new Map();
    dataLines = 0;
    event = undefined;
  };
  const dataLine = async () => {
    if (dataLines++ > 0) await scanner.push(Buffer.from('\n'));
  };
  const fieldOf = (name: number[]): 'data' | 'event' | 'other' => {
    const text = Buffer.from(name).toString('latin1');
    return text === 'data' ? 'data' : text === 'event' ? 'event' : 'other';
  };

  /** Reads one chunk; the complete frames wait in `frames`. */
  const feed = async (chunk: Buffer) => {
    let pos = 0;
    if (!started && chunk.length > 0) {
      started = true;
      if (chunk.length >= 3 && chunk[0] === 0xef && chunk[1] === 0xbb && chunk[2] === 0xbf) pos = 3;
    }
    while (pos < chunk.length) {
      if (skipLF) {
        skipLF = false;
        if (chunk[pos] === LF) {
          pos++;
          continue;
        }
      }
      const eol = indexOfEither(chunk, LF, CR, pos);
      const end = eol === -1 ? chunk.length : eol;
      if (line.at === 'name') {
        const colon = chunk.indexOf(0x3a, pos);
        const nameEnd = colon !== -1 && colon < end ? colon : end;
        for (let i = pos; i < nameEnd && line.name.length <= MAX_FIELD_BYTES; i++) line.name.push(chunk[i]!);
        if (nameEnd < end) {
          // The colon: the value follows (a line starting with a colon is a comment).
          const field = line.name.length === 0 ? 'other' : fieldOf(line.name);
          line = { at: 'value', field, value: [], first: true };
          if (field === 'data') await dataLine();
          pos = nameEnd + 1;
          continue;
        }
        pos = end;
      } else {
        let from = pos;
        if (line.first && from < end) {
          line.first = false;
          if (chunk[from] === 0x20) from++; // one space after the colon is not part of the value
        }
        if (line.field === 'data' && from < end) await scanner.push(chunk.subarray(from, end));
        else if (line.field === 'event') for (let i = from; i < end && line.value.length <= MAX_FIELD_BYTES; i++) line.value.push(chunk[i]!);
        pos = end;
      }
      if (eol !== -1) {
        await endLine();
        skipLF = chunk[eol] === CR;
        pos = eol + 1;
      }
    }
  };

  try {
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      total += chunk.byteLength;
      if (total > limits.maxBytes) throw new ProviderError('failed', `the upstream ${what} answered more than ${Math.round(limits.maxBytes / 1024 / 1024)} MiB`);
      await feed(chunk);
      yield* frames.splice(0);
    }
    // The upstream may end without the last blank line: end the line, then the frame.
    if (line.at === 'value' || line.name.length > 0) await endLine();
    await endLine();
    yield* frames.splice(0);
  } catch (err) {
    scanner.abort(err as Error);
    throw answerError(err, res, limits, signal, what);
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

/** Format and pixel size of an image: from its header (headerSize), or from sharp when that fails. */
export async function imageMeta(data: Buffer): Promise<{ format?: string; width?: number; height?: number }> {
  const meta = headerSize(data);
  if (meta) return meta;
  try {
    return await sharp(data).metadata();
  } catch (err) {
    throw new ProviderError('retryable', 'the upstream answered an image that could not be decoded', { cause: err, maybeAccepted: true });
  }
}

/**
 * The image exactly as the client asked for it: resized (cover, centred) when the pixel size
 * differs, re-encoded when the size or the format differs, or when the client asked for an
 * `output_compression` the upstream was not sent (`upstreamCompressed`: the adapter passed it on);
 * else the upstream's bytes untouched. With the model's `resize: native` (`params.resize`) the
 * size is the upstream's: only a format that differs is re-encoded. Whether they match is read
 * from the header (imageMeta). An image to decode over {@link MAX_IMAGE_PIXELS} (an interlaced PNG
 * is held whole while decoded) is not decoded: the upstream's failure, retryable, as an
 * undecodable one.
 */
export async function fitImage(data: Buffer, params: ImageParams, upstreamCompressed = false): Promise<Buffer> {
  const meta = await imageMeta(data);
  const sameSize = params.resize === 'native' || (meta.width === params.width && meta.height === params.height);
  const compress = params.outputCompression !== undefined && params.outputFormat !== 'png' && !upstreamCompressed;
  if (sameSize && meta.format === params.outputFormat && !compress) return data;
  if (meta.width && meta.height && meta.width * meta.height > MAX_IMAGE_PIXELS) {
    throw new ProviderError('retryable', `the upstream answered an image too large to decode (${meta.width}x${meta.height} pixels, at most ${MAX_IMAGE_PIXELS.toLocaleString('en-US')})`, { maybeAccepted: true });
  }
  try {
    let img = sharp(data, { limitInputPixels: MAX_IMAGE_PIXELS });
    if (!sameSize) img = img.resize(params.width, params.height, { fit: 'cover', position: 'centre' });
    return await encode(img, params.outputFormat, params.outputCompression);
  } catch (err) {
    throw new ProviderError('retryable', 'the upstream answered an image that could not be decoded', { cause: err, maybeAccepted: true });
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
