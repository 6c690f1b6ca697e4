/**
 * Input images are decoded to their end before anything is charged or sent upstream: an empty,
 * truncated, undecodable or tiny image, or one that is not a PNG, JPEG, WebP or GIF, is the
 * client's mistake (400 `invalid_image`), not an upstream failure. Decoding runs on sharp's
 * threads, not the event loop.
 *
 * The size is the one a viewer shows: with the EXIF orientation applied (a phone's JPEG is stored
 * sideways, tagged 6 or 8). A mask is drawn, and an edit with no size keeps its size, over what the
 * client sees, so every upstream is sent such an input upright: the adapters that send an edit's
 * bytes turn it themselves (uploadableImage: OpenAI, Gemini, Ark), the local renderer too; the ones
 * handed the stored file (fal and Replicate mappings, video frames) get an upright copy stored once
 * (`FileService.mediaInputs`): an upstream that ignores the tag would see the photo sideways. The
 * orientation found here is recorded on the file's row, so that which inputs need that copy is
 * known without decoding them again.
 *
 * Decoding to the end runs on libuv's threadpool (4 threads unless UV_THREADPOOL_SIZE says more),
 * where every file-system call of the media store runs too, and an interlaced image holds its thread
 * for seconds: at most MAX_FULL_DECODES run at once in the process (`fullDecodes`), the rest wait
 * for a turn holding no thread, so downloads and stored writes always find one free.
 */
import sharp, { type Metadata } from 'sharp';
import { badRequest } from '../errors.ts';
import { Semaphore } from './semaphore.ts';

/** Smallest accepted edge of an input image, in pixels. */
export const MIN_IMAGE_EDGE = 16;

/**
 * Most pixels an image the gateway decodes may have (inputs here; upstream answers in fitImage),
 * passed to sharp as `limitInputPixels` (its default, about 268 MP, is far above). An interlaced
 * PNG or a progressive JPEG cannot be decoded row by row: libvips holds all of it, and a solid
 * 16000x16000 PNG of 1 MB would cost gigabytes. Nothing the gateway makes needs more than about
 * 17 MP: the largest output is a 4K-class table size (Gemini's 4K 1:1, 4096x4096 = 16.8 MP) and a
 * custom size or a kept input size is at most 8,294,400 px (CUSTOM_SIZE_LIMITS). 50 MP still takes
 * a phone's full-resolution photo (48 MP 8000x6000, 50 MP 8160x6120 = 49.9 MP) as an edit's or a
 * video's input; held whole it costs at most 200 MB (8-bit RGBA), 400 MB (16-bit).
 */
export const MAX_IMAGE_PIXELS = 50_000_000;

/**
 * The formats an input may be (sharp's names): those of the contract (the File's `content_type`,
 * POST /v1/files) and those every adapter can send or convert (a GIF goes as its first frame).
 * libvips reads more (TIFF, SVG, HEIF, its own format…), and some are costly to decode: an SVG is
 * rendered, filters included, so a few hundred bytes can hold a decoder thread for minutes. The
 * header names the format, so anything else is refused before a pixel is decoded.
 */
const ACCEPTED_FORMATS: ReadonlySet<string> = new Set(['png', 'jpeg', 'webp', 'gif']);

/**
 * Full decodes (`inspectImage` reading down to the last row) run at once in this process: two of
 * libuv's four threads (FileService's conversions, one at a time, may hold a third), so the media
 * store's reads and writes, and the header reads here, are never all queued behind decodes.
 */
export const MAX_FULL_DECODES = 2;

/** The turns of full decodes, process-wide: every caller of inspectImage shares them. */
export const fullDecodes = new Semaphore(MAX_FULL_DECODES);

export interface InspectedImage {
  format: string;
  mimeType: string;
  width: number;
  height: number;
  hasAlpha: boolean;
  /** The EXIF orientation the bytes carry, when it is not 1 (absent: upright as stored). */
  orientation?: number;
}

/**
 * `source`: the bytes, or the path of a file holding them (read by libvips as it decodes). The
 * header is checked at once; the decode waits for its turn (`fullDecodes`), and leaves the queue,
 * rejecting with `signal`'s reason, when `signal` aborts first (its client went away).
 */
export async function inspectImage(source: Buffer | string, param: string, signal?: AbortSignal): Promise<InspectedImage> {
  const invalid = (why: string) => badRequest('invalid_image', `'${param}' ${why}.`, param);
  if (Buffer.isBuffer(source) && source.length === 0) throw invalid('is empty');
  const undecodable = (err: unknown) => {
    if (typeof source === 'string' && /Input file is missing|ENOENT/.test(String(err))) return err;
    return invalid('is not a complete image in a format we can decode (PNG, JPEG, WebP, GIF)');
  };
  let meta: Metadata;
  try {
    // The header only, nothing decoded yet: without the pixel limit, which sharp applies even
    // here, so that an image over it is told its size.
    meta = await sharp(source, { failOn: 'truncated', limitInputPixels: false }).metadata();
  } catch (err) {
    throw undecodable(err);
  }
  if (meta.format && !ACCEPTED_FORMATS.has(meta.format)) throw invalid(`is in ${meta.format.toUpperCase()} format; images must be PNG, JPEG, WebP or GIF`);
  if (!meta.width || !meta.height || !meta.format) throw invalid('is not a decodable image');
  const width = meta.autoOrient?.width ?? meta.width;
  const height = meta.autoOrient?.height ?? meta.height;
  if (width * height > MAX_IMAGE_PIXELS) {
    throw invalid(`is too large: ${width}x${height} pixels, at most ${MAX_IMAGE_PIXELS.toLocaleString('en-US')} pixels`);
  }
  const release = await fullDecodes.acquire(signal);
  try {
    // The header can be intact while the pixels are cut off: decode down to the last row (an
    // order of magnitude cheaper than computing statistics over every pixel).
    const image = sharp(source, { failOn: 'truncated', sequentialRead: true, limitInputPixels: MAX_IMAGE_PIXELS });
    await image.extract({ left: 0, top: meta.height - 1, width: 1, height: 1 }).raw().toBuffer();
  } catch (err) {
    throw undecodable(err);
  } finally {
    release();
  }
  if (width < MIN_IMAGE_EDGE || height < MIN_IMAGE_EDGE) {
    throw invalid(`is ${width}x${height} pixels; images need at least ${MIN_IMAGE_EDGE} pixels on each edge`);
  }
  return {
    format: meta.format,
    mimeType: meta.format === 'jpeg' ? 'image/jpeg' : `image/${meta.format}`,
    width,
    height,
    hasAlpha: meta.hasAlpha ?? false,
    ...(meta.orientation !== undefined && meta.orientation !== 1 && { orientation: meta.orientation }),
  };
}
