/**
 * Input images are decoded to their end before anything is charged or sent upstream: an empty,
 * truncated, undecodable or tiny image is the client's mistake (400 `invalid_image`), not an
 * upstream failure. Decoding runs on sharp's threads, not the event loop.
 *
 * The size is the one a viewer shows: with the EXIF orientation applied (a phone's JPEG is stored
 * sideways, tagged 6 or 8). A mask is drawn, and an edit with no size keeps its size, over what the
 * client sees; the adapters send such an input turned upright (uploadableImage), the local renderer
 * turns it itself.
 */
import sharp, { type Metadata } from 'sharp';
import { badRequest } from '../errors.ts';

/** Smallest accepted edge of an input image, in pixels. */
export const MIN_IMAGE_EDGE = 16;

export interface InspectedImage {
  format: string;
  mimeType: string;
  width: number;
  height: number;
  hasAlpha: boolean;
}

/** `source`: the bytes, or the path of a file holding them (read by libvips as it decodes). */
export async function inspectImage(source: Buffer | string, param: string): Promise<InspectedImage> {
  const invalid = (why: string) => badRequest('invalid_image', `'${param}' ${why}.`, param);
  if (Buffer.isBuffer(source) && source.length === 0) throw invalid('is empty');
  let meta: Metadata;
  try {
    const image = sharp(source, { failOn: 'truncated', sequentialRead: true });
    meta = await image.metadata();
    // The header can be intact while the pixels are cut off: decode down to the last row (an
    // order of magnitude cheaper than computing statistics over every pixel).
    if (meta.width && meta.height) await image.extract({ left: 0, top: meta.height - 1, width: 1, height: 1 }).raw().toBuffer();
  } catch (err) {
    if (typeof source === 'string' && /Input file is missing|ENOENT/.test(String(err))) throw err;
    throw invalid('is not a complete image in a format we can decode (PNG, JPEG, WebP, GIF)');
  }
  if (!meta.width || !meta.height || !meta.format) throw invalid('is not a decodable image');
  const width = meta.autoOrient?.width ?? meta.width;
  const height = meta.autoOrient?.height ?? meta.height;
  if (width < MIN_IMAGE_EDGE || height < MIN_IMAGE_EDGE) {
    throw invalid(`is ${width}x${height} pixels; images need at least ${MIN_IMAGE_EDGE} pixels on each edge`);
  }
  return {
    format: meta.format,
    mimeType: meta.format === 'jpeg' ? 'image/jpeg' : `image/${meta.format}`,
    width,
    height,
    hasAlpha: meta.hasAlpha ?? false,
  };
}
