/**
 * Procedural image rendering of the built-in `local` image provider (no AI): real PNG, JPEG and
 * WebP files at exactly the requested pixel size that visibly show the prompt.
 *
 * - `renderImage`: a background (gradient + shapes derived from a hash of prompt and seed, so the
 *   images of one request differ by seed) with the prompt wrapped into a panel. Everything is one SVG
 *   rasterised by sharp (librsvg), so a 4K render is a single native pass, no per-pixel JS.
 * - `editImage`: the decoded input with a tint, a stripe pattern and the prompt composited on top,
 *   everywhere (no mask) or only where the mask is transparent (the mask's inverted alpha is the
 *   blend weight).
 * - Partial images: the final pixels downscaled (1/4^k) and upscaled back to the output size,
 *   coarsest first, in the output format.
 */
import sharp from 'sharp';
import type { OverlayOptions, Sharp } from 'sharp';

export type ImageFormat = 'png' | 'jpeg' | 'webp';

export interface RenderImageOptions {
  prompt: string;
  width: number;
  height: number;
  format: ImageFormat;
  /** 0 (none) to 100 (maximum). Unset: the encoder's default. */
  compression?: number;
  /** Transparent background (alpha 0), only shapes and text opaque. Needs png or webp. */
  transparent: boolean;
  /** Varies the background among the images of one request. */
  seed?: number;
  /** 0–3 progressively refined previews before the final image. */
  partials?: number;
}

export interface EditImageOptions {
  prompt: string;
  /** Bytes of any image sharp decodes. */
  input: Buffer;
  /** PNG (or other format) with an alpha channel; its transparent area marks the region to edit. */
  mask?: Buffer;
  /** Output size; unset edges are the input's. A different size scales the input to cover it. */
  width?: number;
  height?: number;
  format: ImageFormat;
  compression?: number;
  /** Keep the input's transparency (needs png or webp); otherwise flattened onto white. */
  transparent: boolean;
  partials?: number;
  seed?: number;
}

export interface RenderedImage {
  /** The final image in the requested format. */
  image: Buffer;
  /** Previews (same size and format), coarsest first. */
  partials: Buffer[];
}

export interface ImageInfo {
  format: string;
  width: number;
  height: number;
  hasAlpha: boolean;
}

/** An input image (or mask) that cannot be decoded, or a mask without an alpha channel. */
export class InvalidImageError extends Error {
  constructor(
    message: string,
    readonly which: 'input' | 'mask' = 'input',
  ) {
    super(message);
    this.name = 'InvalidImageError';
  }
}

/** A mask whose (EXIF-oriented) dimensions differ from the input image's. */
export class MaskSizeMismatchError extends Error {
  constructor(
    readonly input: { width: number; height: number },
    readonly mask: { width: number; height: number },
  ) {
    super(`The mask is ${mask.width}x${mask.height} but the image is ${input.width}x${input.height}.`);
    this.name = 'MaskSizeMismatchError';
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers

const FONT = "'DejaVu Sans', 'Liberation Sans', Arial, Helvetica, sans-serif";
const MAX_PARTIALS = 3;

/** FNV-1a (32 bit) of a string's UTF-16 units. */
function hash32(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** mulberry32: a small deterministic PRNG in [0, 1). */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** XML 1.0 forbids most control characters and lone surrogates: drop them, then escape. */
export function escapeXml(text: string): string {
  return text
    .replace(/[^\t\n\r\u0020-\uD7FF\uE000-\uFFFD\u{10000}-\u{10FFFF}]/gu, '')
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;')
    .replace(/'/g, '&apos;');
}

/**
 * Greedy word wrap to `maxChars` per line (code points), at most `maxLines` lines; long words are
 * split; an overflow ends the last line with an ellipsis.
 */
export function wrapText(text: string, maxChars: number, maxLines: number): string[] {
  const chars = Math.max(1, maxChars);
  const words = text.replace(/[\t\n\r]+/g, ' ').split(' ').filter((w) => w.length > 0);
  const lines: string[] = [];
  let line = '';
  let overflow = false;
  outer: for (const word of words) {
    let rest = [...word];
    while (rest.length > 0) {
      const lineLen = [...line].length;
      const room = lineLen === 0 ? chars : chars - lineLen - 1;
      if (rest.length <= room) {
        line = lineLen === 0 ? rest.join('') : `${line} ${rest.join('')}`;
        rest = [];
      } else if (lineLen === 0) {
        line = rest.slice(0, chars).join('');
        rest = rest.slice(chars);
        lines.push(line);
        line = '';
      } else {
        lines.push(line);
        line = '';
      }
      if (lines.length >= maxLines) {
        overflow = rest.length > 0 || line.length > 0 || words.indexOf(word) < words.length - 1;
        break outer;
      }
    }
  }
  if (line && lines.length < maxLines) lines.push(line);
  else if (line) overflow = true;
  if (overflow && lines.length > 0) {
    const last = [...(lines[lines.length - 1] ?? '')];
    lines[lines.length - 1] = `${last.slice(0, Math.max(0, chars - 1)).join('').trimEnd()}…`;
  }
  return lines;
}

interface Box {
  x: number;
  y: number;
  w: number;
  h: number;
}

/**
 * A dark panel with the prompt in white, wrapped to fit `box` (font size from the image size; the
 * panel grows downwards from the box's vertical centre line up to the box's height). Empty prompt:
 * nothing.
 */
function textPanelSvg(prompt: string, box: Box, imageMin: number, panelOpacity: number): string {
  const text = prompt.trim();
  if (!text || box.w < 8 || box.h < 8) return '';
  const fontSize = Math.max(10, Math.min(Math.round(imageMin * 0.045), Math.round(box.h / 2.6), Math.round(box.w / 6)));
  const lineHeight = Math.round(fontSize * 1.3);
  const pad = Math.round(fontSize * 0.7);
  const maxChars = Math.floor((box.w - 2 * pad) / (fontSize * 0.62));
  const maxLines = Math.max(1, Math.floor((box.h - 2 * pad) / lineHeight));
  const lines = wrapText(text, maxChars, maxLines);
  if (lines.length === 0) return '';
  const panelH = lines.length * lineHeight + 2 * pad;
  const panelY = Math.round(box.y + Math.max(0, (box.h - panelH) / 2));
  const tspans = lines
    .map((l, i) => `<text x="${box.x + pad}" y="${panelY + pad + Math.round(fontSize * 0.95) + i * lineHeight}">${escapeXml(l)}</text>`)
    .join('');
  return (
    `<rect x="${box.x}" y="${panelY}" width="${box.w}" height="${panelH}" rx="${Math.round(fontSize * 0.4)}" fill="#101018" fill-opacity="${panelOpacity}"/>` +
    `<g font-family="${FONT}" font-size="${fontSize}" font-weight="bold" fill="#ffffff">${tspans}</g>`
  );
}

/** An HSL colour whose brightest channel stays ≤ ~230, so only text is near-white. */
function colour(rand: () => number, hue?: number): string {
  const h = Math.round(hue ?? rand() * 360);
  const s = Math.round(45 + rand() * 30);
  const l = Math.round(28 + rand() * 30);
  return `hsl(${h},${s}%,${l}%)`;
}

function backgroundSvg(prompt: string, seed: number, width: number, height: number, transparent: boolean): string {
  const rand = prng(hash32(`${seed}\u0000${prompt}`));
  const min = Math.min(width, height);
  const hue = rand() * 360;
  const parts: string[] = [];
  if (!transparent) {
    const angle = rand() * 360;
    const rad = (angle * Math.PI) / 180;
    const x = (0.5 + Math.cos(rad) / 2).toFixed(3);
    const y = (0.5 + Math.sin(rad) / 2).toFixed(3);
    const x2 = (0.5 - Math.cos(rad) / 2).toFixed(3);
    const y2 = (0.5 - Math.sin(rad) / 2).toFixed(3);
    parts.push(
      `<defs><linearGradient id="bg" x1="${x}" y1="${y}" x2="${x2}" y2="${y2}">` +
        `<stop offset="0" stop-color="${colour(rand, hue)}"/>` +
        `<stop offset="0.55" stop-color="${colour(rand, hue + 60 + rand() * 60)}"/>` +
        `<stop offset="1" stop-color="${colour(rand, hue + 180 + rand() * 60)}"/>` +
        `</linearGradient></defs>`,
      `<rect width="${width}" height="${height}" fill="url(#bg)"/>`,
    );
  }
  // Shapes. Transparent mode keeps them inside the middle of the canvas, so the corners stay clear.
  const count = 7 + Math.floor(rand() * 6);
  for (let i = 0; i < count; i++) {
    const cx = transparent ? width * (0.25 + rand() * 0.5) : width * rand();
    const cy = transparent ? height * (0.25 + rand() * 0.5) : height * rand();
    const r = min * (transparent ? 0.05 + rand() * 0.12 : 0.06 + rand() * 0.22);
    const fill = colour(rand, hue + rand() * 240);
    const opacity = transparent ? 1 : (0.3 + rand() * 0.5).toFixed(2);
    const kind = Math.floor(rand() * 3);
    if (kind === 0) {
      parts.push(`<circle cx="${cx.toFixed(1)}" cy="${cy.toFixed(1)}" r="${r.toFixed(1)}" fill="${fill}" fill-opacity="${opacity}"/>`);
    } else if (kind === 1) {
      const rot = Math.round(rand() * 90);
      parts.push(
        `<rect x="${(cx - r).toFixed(1)}" y="${(cy - r * 0.7).toFixed(1)}" width="${(2 * r).toFixed(1)}" height="${(1.4 * r).toFixed(1)}" ` +
          `transform="rotate(${rot} ${cx.toFixed(1)} ${cy.toFixed(1)})" fill="${fill}" fill-opacity="${opacity}"/>`,
      );
    } else {
      const pts = [0, 1, 2]
        .map((k) => {
          const a = rand() * 0.6 + (k * 2 * Math.PI) / 3;
          return `${(cx + r * Math.cos(a)).toFixed(1)},${(cy + r * Math.sin(a)).toFixed(1)}`;
        })
        .join(' ');
      parts.push(`<polygon points="${pts}" fill="${fill}" fill-opacity="${opacity}"/>`);
    }
  }
  return parts.join('');
}

function hslToRgb(h: number, s: number, l: number): { r: number; g: number; b: number } {
  const f = (n: number) => {
    const k = (n + h * 12) % 12;
    const a = s * Math.min(l, 1 - l);
    return Math.round(255 * (l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1))));
  };
  return { r: f(0), g: f(8), b: f(4) };
}

function svgDocument(width: number, height: number, body: string): Buffer {
  return Buffer.from(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">${body}</svg>`);
}

function checkFormat(format: ImageFormat, transparent: boolean): void {
  if (format !== 'png' && format !== 'jpeg' && format !== 'webp') throw new RangeError(`Unsupported output format '${String(format)}'.`);
  if (transparent && format === 'jpeg') throw new RangeError('A transparent background needs png or webp output.');
}

function checkSize(width: number, height: number): void {
  if (!Number.isInteger(width) || !Number.isInteger(height) || width < 1 || height < 1 || width > 16384 || height > 16384) {
    throw new RangeError(`Invalid output size ${width}x${height}.`);
  }
}

function partialCount(n: number | undefined): number {
  return Math.max(0, Math.min(MAX_PARTIALS, Math.floor(n ?? 0)));
}

/** Encodes a pipeline; `alpha` false drops the alpha channel. Compression 0 (none) – 100 (maximum). */
function encode(img: Sharp, format: ImageFormat, compression: number | undefined, alpha: boolean): Promise<Buffer> {
  const p = alpha ? img : img.removeAlpha();
  const c = compression === undefined ? undefined : Math.max(0, Math.min(100, compression));
  const quality = c === undefined ? undefined : Math.max(1, Math.min(100, Math.round(100 - c)));
  switch (format) {
    case 'png':
      return p.png({ compressionLevel: c === undefined ? 6 : Math.round((c / 100) * 9) }).toBuffer();
    case 'jpeg':
      return p.jpeg({ quality: quality ?? 85 }).toBuffer();
    case 'webp':
      return p.webp({ quality: quality ?? 85, effort: 2 }).toBuffer();
  }
}

interface RawImage {
  data: Buffer;
  width: number;
  height: number;
}

const fromRaw = (img: RawImage) => sharp(img.data, { raw: { width: img.width, height: img.height, channels: 4 } });

/** Progressively refined previews of `final` (RGBA raw): downscaled by 4^k, upscaled back, coarsest first. */
async function makePartials(final: RawImage, count: number, format: ImageFormat, compression: number | undefined, alpha: boolean): Promise<Buffer[]> {
  const jobs: Promise<Buffer>[] = [];
  for (let i = 0; i < count; i++) {
    const factor = 4 ** (count - i); // e.g. 3 partials: 1/64, 1/16, 1/4
    const w = Math.max(1, Math.round(final.width / factor));
    const h = Math.max(1, Math.round(final.height / factor));
    jobs.push(
      (async () => {
        const small = await fromRaw(final).resize(w, h, { fit: 'fill', kernel: 'linear' }).raw().toBuffer();
        const up = sharp(small, { raw: { width: w, height: h, channels: 4 } }).resize(final.width, final.height, { fit: 'fill', kernel: 'cubic' });
        return encode(up, format, compression, alpha);
      })(),
    );
  }
  return Promise.all(jobs);
}

async function finish(final: RawImage, opts: { format: ImageFormat; compression?: number; partials?: number }, alpha: boolean): Promise<RenderedImage> {
  const [image, partials] = await Promise.all([
    encode(fromRaw(final), opts.format, opts.compression, alpha),
    makePartials(final, partialCount(opts.partials), opts.format, opts.compression, alpha),
  ]);
  return { image, partials };
}

// ---------------------------------------------------------------------------------------------
// Public API

/** Renders a procedural image showing `prompt`, at exactly `width` x `height`. */
export async function renderImage(opts: RenderImageOptions): Promise<RenderedImage> {
  const { width, height, transparent } = opts;
  checkFormat(opts.format, transparent);
  checkSize(width, height);
  const min = Math.min(width, height);
  const marginX = Math.round(width * 0.07);
  const box: Box = { x: marginX, y: Math.round(height * 0.52), w: width - 2 * marginX, h: Math.round(height * 0.4) };
  const svg = svgDocument(
    width,
    height,
    backgroundSvg(opts.prompt, opts.seed ?? 0, width, height, transparent) + textPanelSvg(opts.prompt, box, min, transparent ? 1 : 0.6),
  );
  const pipeline = () => sharp(svg, { limitInputPixels: false }).resize(width, height, { fit: 'fill' });
  if (partialCount(opts.partials) === 0) {
    // (ensureAlpha and removeAlpha in one pipeline: ensureAlpha wins, so only add it when kept.)
    const img = transparent ? pipeline().ensureAlpha() : pipeline();
    return { image: await encode(img, opts.format, opts.compression, transparent), partials: [] };
  }
  const data = await pipeline().ensureAlpha().raw().toBuffer();
  return finish({ data, width, height }, opts, transparent);
}

/** Bounding box (full-resolution pixels) of the weight > 50 % area, from a downscaled copy; undefined when empty. */
async function weightBox(weight: Buffer, width: number, height: number): Promise<Box | undefined> {
  const scale = Math.min(1, 256 / Math.max(width, height));
  const w = Math.max(1, Math.round(width * scale));
  const h = Math.max(1, Math.round(height * scale));
  // (A one-channel raw input may come back as sRGB: step by the returned channel count.)
  const { data: small, info } = await sharp(weight, { raw: { width, height, channels: 1 } })
    .resize(w, h, { fit: 'fill', kernel: 'linear' })
    .raw()
    .toBuffer({ resolveWithObject: true });
  const step = info.channels;
  let x0 = w, y0 = h, x1 = -1, y1 = -1;
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      if ((small[(y * w + x) * step] ?? 0) > 127) {
        if (x < x0) x0 = x;
        if (x > x1) x1 = x;
        if (y < y0) y0 = y;
        if (y > y1) y1 = y;
      }
    }
  }
  if (x1 < 0) return undefined;
  const sx = width / w;
  const sy = height / h;
  const x = Math.floor(x0 * sx);
  const y = Math.floor(y0 * sy);
  return { x, y, w: Math.min(width, Math.ceil((x1 + 1) * sx)) - x, h: Math.min(height, Math.ceil((y1 + 1) * sy)) - y };
}

/**
 * Applies `prompt` to an input image: a tint, a stripe pattern and the prompt text, only where the
 * mask is transparent (blend weight = 1 − mask alpha) or, without a mask, everywhere (text in a
 * banner at the top). Throws {@link InvalidImageError} for an undecodable input or mask (or a mask
 * without alpha) and {@link MaskSizeMismatchError} when the mask's size differs from the input's.
 */
export async function editImage(opts: EditImageOptions): Promise<RenderedImage> {
  checkFormat(opts.format, opts.transparent);
  let inMeta: { width: number; height: number };
  try {
    const m = await sharp(opts.input, { failOn: 'error' }).metadata();
    inMeta = { width: m.autoOrient?.width ?? m.width, height: m.autoOrient?.height ?? m.height };
    if (!inMeta.width || !inMeta.height) throw new Error('no dimensions');
  } catch (err) {
    throw new InvalidImageError(`The input image cannot be decoded: ${(err as Error).message}`, 'input');
  }
  const width = opts.width ?? inMeta.width;
  const height = opts.height ?? inMeta.height;
  checkSize(width, height);

  let base: Buffer;
  try {
    base = await sharp(opts.input, { failOn: 'error', limitInputPixels: false })
      .rotate()
      .resize(width, height, { fit: 'cover' })
      .ensureAlpha()
      .raw({ depth: 'uchar' })
      .toBuffer();
  } catch (err) {
    throw new InvalidImageError(`The input image cannot be decoded: ${(err as Error).message}`, 'input');
  }

  // Blend weight (1 channel): 255 where the edit applies.
  let weight: Buffer | undefined;
  if (opts.mask) {
    let maskRaw: { data: Buffer; info: { channels: number } };
    try {
      const mm = await sharp(opts.mask, { failOn: 'error' }).metadata();
      if (!mm.hasAlpha) throw new InvalidImageError('The mask has no alpha channel: its transparent area marks the region to edit.', 'mask');
      const mw = mm.autoOrient?.width ?? mm.width;
      const mh = mm.autoOrient?.height ?? mm.height;
      if (mw !== inMeta.width || mh !== inMeta.height) throw new MaskSizeMismatchError(inMeta, { width: mw, height: mh });
      maskRaw = await sharp(opts.mask, { failOn: 'error', limitInputPixels: false })
        .rotate()
        .resize(width, height, { fit: 'cover' })
        .raw({ depth: 'uchar' })
        .toBuffer({ resolveWithObject: true });
    } catch (err) {
      if (err instanceof InvalidImageError || err instanceof MaskSizeMismatchError) throw err;
      throw new InvalidImageError(`The mask cannot be decoded: ${(err as Error).message}`, 'mask');
    }
    const channels = maskRaw.info.channels;
    weight = await sharp(maskRaw.data, { raw: { width, height, channels: channels as 1 | 2 | 3 | 4 } })
      .extractChannel((channels - 1) as 0 | 1 | 2 | 3)
      .negate()
      .raw()
      .toBuffer();
  }

  const rand = prng(hash32(`${opts.seed ?? 0}\u0000${opts.prompt}`));
  const hue = Math.round(rand() * 360);
  const min = Math.min(width, height);
  const stripe = Math.max(6, Math.round(min / 40));
  let textBox: Box | undefined;
  if (weight) {
    const region = await weightBox(weight, width, height);
    if (region) {
      const inset = Math.round(Math.min(region.w, region.h) * 0.06);
      textBox = { x: region.x + inset, y: region.y + inset, w: region.w - 2 * inset, h: region.h - 2 * inset };
    }
  } else {
    const margin = Math.round(min * 0.04);
    textBox = { x: margin, y: margin, w: width - 2 * margin, h: Math.round(height * 0.3) };
  }
  // Overlay: a tint, 45° stripes (a small seamless tile repeated by libvips; an SVG <pattern> over a
  // 4K canvas is slow in librsvg) and the prompt panel.
  const tile = stripe * 2;
  const h2 = tile / 2;
  const stripeTile = svgDocument(
    tile,
    tile,
    `<g fill="hsl(${(hue + 180) % 360},70%,45%)" fill-opacity="0.3">` +
      `<polygon points="0,0 ${h2},0 0,${h2}"/><polygon points="${tile},0 ${tile},${h2} ${h2},${tile} 0,${tile}"/></g>`,
  );
  const tint = hslToRgb(hue / 360, 0.75, 0.5);
  const layers: OverlayOptions[] = [{ input: stripeTile, tile: true, left: 0, top: 0 }];
  const panel = textBox ? textPanelSvg(opts.prompt, textBox, min, 0.7) : '';
  if (panel) layers.push({ input: svgDocument(width, height, panel), left: 0, top: 0 });
  let layer: Sharp = sharp({ create: { width, height, channels: 4, background: { ...tint, alpha: 0.4 } } }).composite(layers);
  if (weight) {
    // Keep the overlay only where the weight is: alpha := overlay alpha × weight.
    const weightRgba = await sharp({ create: { width, height, channels: 3, background: { r: 0, g: 0, b: 0 } } })
      .joinChannel(weight, { raw: { width, height, channels: 1 } })
      .raw()
      .toBuffer();
    const overlayRaw = await layer.raw().toBuffer();
    layer = sharp(overlayRaw, { raw: { width, height, channels: 4 } }).composite([
      { input: weightRgba, raw: { width, height, channels: 4 }, blend: 'dest-in' },
    ]);
  }
  const layerRaw = await layer.raw().toBuffer();
  let out: Sharp = sharp(base, { raw: { width, height, channels: 4 } }).composite([{ input: layerRaw, raw: { width, height, channels: 4 } }]);
  if (!opts.transparent) {
    const composed = await out.raw().toBuffer();
    out = sharp(composed, { raw: { width, height, channels: 4 } }).flatten({ background: { r: 255, g: 255, b: 255 } }).ensureAlpha();
  }
  const data = await out.raw().toBuffer();
  return finish({ data, width, height }, opts, opts.transparent);
}

/** Format, EXIF-oriented size and alpha of an image (header only); undefined when not decodable. */
export async function imageInfo(buf: Buffer): Promise<ImageInfo | undefined> {
  try {
    const m = await sharp(buf).metadata();
    const width = m.autoOrient?.width ?? m.width;
    const height = m.autoOrient?.height ?? m.height;
    if (!m.format || !width || !height) return undefined;
    return { format: m.format, width, height, hasAlpha: m.hasAlpha };
  } catch {
    return undefined;
  }
}
