/**
 * Procedural video renderer of the built-in `local` provider.
 *
 * Renders a real MP4 (H.264 video via libx264, AAC audio via FFmpeg's native
 * encoder) that "shows the prompt": an animated gradient (or the caller's
 * first/last frame images, cross-faded) with the prompt text, a time counter
 * and a progress bar. No AI, no upstream account: it is the backend the whole
 * API can run (and be tested) against.
 *
 * Encoding uses `node-av` (N-API bindings to FFmpeg 8 whose prebuilt binary is
 * shipped inside the npm package `@seydx/node-av-<platform>`; no system ffmpeg,
 * nothing fetched from outside the npm registry). Frames are drawn directly in
 * YUV 4:2:0 in JavaScript; the static text layer is rasterised once by sharp.
 *
 * Pixel sizes must be even (4:2:0 chroma subsampling halves both dimensions):
 * renderVideo throws a RangeError on odd width/height. Use videoSize() to map a
 * resolution + aspect ratio to a valid size.
 */
import { randomBytes } from 'node:crypto';
import { rename, rm, stat } from 'node:fs/promises';
import sharp from 'sharp';
import type { OverlayOptions } from 'sharp';
import { Decoder, Demuxer, Encoder, Muxer } from 'node-av/api';
import { avGetPixFmtName, Codec, Frame, Log, Rational } from 'node-av/lib';
import type { Packet } from 'node-av/lib';
import type { AVPixelFormat } from 'node-av/constants';
import {
  AV_CHANNEL_ORDER_NATIVE,
  AV_LOG_ERROR,
  AV_PIX_FMT_YUV420P,
  AV_SAMPLE_FMT_FLTP,
  AVCOL_PRI_BT709,
  AVCOL_RANGE_MPEG,
  AVCOL_SPC_BT709,
  AVCOL_TRC_BT709,
  FF_ENCODER_AAC,
  FF_ENCODER_LIBX264,
} from 'node-av/constants';

export interface RenderVideoOptions {
  prompt: string;
  /** Seconds, > 0. The clip has exactly round(durationSeconds × fps) frames. */
  durationSeconds: number;
  /** Even pixel width (2..4096). */
  width: number;
  /** Even pixel height (2..4096). */
  height: number;
  /** Frames per second, 1..60; default 10 (this is a fast test/demo backend). */
  fps?: number;
  /** Add a stereo AAC track (a generated chord) when true. */
  audio: boolean;
  /** Bytes of an image (any format sharp decodes) the clip starts from. */
  firstFrame?: Buffer;
  /** Bytes of an image the clip cross-fades to and ends on. */
  lastFrame?: Buffer;
  /** Where to write the MP4. Written atomically (temp file + rename). */
  outputPath: string;
  /** Aborting stops encoding, removes the partial file and rejects with the signal's reason. */
  signal?: AbortSignal;
}

export interface RenderVideoResult {
  bytes: number;
  durationSeconds: number;
  width: number;
  height: number;
  hasAudio: boolean;
}

export interface Mp4Info {
  /** Duration of the video stream (falls back to the container's duration). */
  durationSeconds: number;
  /** Container duration (the longest stream). */
  containerDurationSeconds: number;
  width: number;
  height: number;
  /** FFmpeg codec name, e.g. `h264`. */
  videoCodec: string;
  /** FFmpeg codec name, e.g. `aac`, or null when there is no audio track. */
  audioCodec: string | null;
  fps: number;
  frameCount: number;
  pixelFormat: string | null;
}

export const DEFAULT_FPS = 10;
export const MAX_DIMENSION = 4096;
export const MAX_DURATION_SECONDS = 120;
const AUDIO_SAMPLE_RATE = 48_000;
const AAC_FRAME_SIZE = 1024;

// ---------------------------------------------------------------------------
// Sizes

const SHORT_EDGES: Record<string, number> = {
  '240p': 240,
  '360p': 360,
  '480p': 480,
  '540p': 540,
  '720p': 720,
  '1080p': 1080,
  '1440p': 1440,
  '2160p': 2160,
  '4k': 2160,
};

/**
 * Maps a resolution (`360p`, `480p`, `720p`, `1080p`, ...: the short edge) and
 * an aspect ratio (`16:9`, `9:16`, `1:1`, `4:3`, `3:4`, `21:9`, any `W:H` up to
 * 4:1) to an even pixel size. The long edge is the exact value when that is an
 * even integer (720p 16:9 → 1280x720, 1080p 21:9 → 2520x1080), else the nearest
 * multiple of 16 if within 1% (480p 16:9 → 848x480), else the nearest even number.
 */
export function videoSize(resolution: string, aspectRatio: string): { width: number; height: number } {
  const res = resolution.trim().toLowerCase();
  let shortEdge = SHORT_EDGES[res];
  if (shortEdge === undefined) {
    const m = /^(\d{2,4})p$/.exec(res);
    if (!m?.[1]) throw new RangeError(`Unsupported resolution "${resolution}"`);
    shortEdge = Number(m[1]);
  }
  if (shortEdge % 2 !== 0 || shortEdge < 16 || shortEdge > MAX_DIMENSION) {
    throw new RangeError(`Unsupported resolution "${resolution}"`);
  }
  const r = /^\s*(\d+(?:\.\d+)?)\s*[:x/]\s*(\d+(?:\.\d+)?)\s*$/i.exec(aspectRatio);
  const rw = r?.[1] ? Number(r[1]) : NaN;
  const rh = r?.[2] ? Number(r[2]) : NaN;
  if (!(rw > 0 && rh > 0)) throw new RangeError(`Unsupported aspect ratio "${aspectRatio}"`);
  const ratio = Math.max(rw, rh) / Math.min(rw, rh);
  if (ratio > 4) throw new RangeError(`Unsupported aspect ratio "${aspectRatio}"`);
  const exact = shortEdge * ratio;
  const by16 = Math.round(exact / 16) * 16;
  const even = Math.round(exact / 2) * 2;
  const longEdge = Math.abs(even - exact) < 1e-6 ? even : Math.abs(by16 - exact) / exact <= 0.01 ? by16 : even;
  if (longEdge > MAX_DIMENSION) throw new RangeError(`${resolution} at ${aspectRatio} exceeds ${MAX_DIMENSION}px`);
  return rw >= rh ? { width: longEdge, height: shortEdge } : { width: shortEdge, height: longEdge };
}

// ---------------------------------------------------------------------------
// Colour helpers (BT.709, limited range; the stream is tagged accordingly)

function rgbToYuv(r: number, g: number, b: number): [number, number, number] {
  const l = 0.2126 * r + 0.7152 * g + 0.0722 * b;
  return [16 + (219 / 255) * l, 128 + ((224 / 255) * (b - l)) / 1.8556, 128 + ((224 / 255) * (r - l)) / 1.5748];
}

function hslToRgb(h: number, s: number, l: number): [number, number, number] {
  h = ((h % 360) + 360) % 360;
  const c = (1 - Math.abs(2 * l - 1)) * s;
  const x = c * (1 - Math.abs(((h / 60) % 2) - 1));
  const m = l - c / 2;
  const [r, g, b] =
    h < 60 ? [c, x, 0] : h < 120 ? [x, c, 0] : h < 180 ? [0, c, x] : h < 240 ? [0, x, c] : h < 300 ? [x, 0, c] : [c, 0, x];
  return [(r + m) * 255, (g + m) * 255, (b + m) * 255];
}

function hashString(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return h >>> 0;
}

function clamp8(v: number): number {
  return v < 0 ? 0 : v > 255 ? 255 : v;
}

/** A YUV 4:2:0 picture: planes stored contiguously (Y, then U, then V). */
interface Yuv {
  buf: Buffer;
  y: Uint8Array;
  u: Uint8Array;
  v: Uint8Array;
}

function allocYuv(w: number, h: number): Yuv {
  const ySize = w * h;
  const cSize = (w / 2) * (h / 2);
  const buf = Buffer.alloc(ySize + 2 * cSize);
  return {
    buf,
    y: buf.subarray(0, ySize),
    u: buf.subarray(ySize, ySize + cSize),
    v: buf.subarray(ySize + cSize),
  };
}

/** Converts packed RGB/RGBA (alpha ignored) to YUV 4:2:0. */
function rgbToYuvPicture(rgb: Buffer, channels: number, w: number, h: number): Yuv {
  const out = allocYuv(w, h);
  const cw = w / 2;
  for (let yy = 0; yy < h; yy++) {
    for (let xx = 0; xx < w; xx++) {
      const p = (yy * w + xx) * channels;
      const r = rgb[p]!, g = rgb[p + 1]!, b = rgb[p + 2]!;
      out.y[yy * w + xx] = clamp8(16 + (219 / 255) * (0.2126 * r + 0.7152 * g + 0.0722 * b) + 0.5);
    }
  }
  for (let cy = 0; cy < h / 2; cy++) {
    for (let cx = 0; cx < cw; cx++) {
      let r = 0, g = 0, b = 0;
      for (let dy = 0; dy < 2; dy++) {
        for (let dx = 0; dx < 2; dx++) {
          const p = ((cy * 2 + dy) * w + cx * 2 + dx) * channels;
          r += rgb[p]!;
          g += rgb[p + 1]!;
          b += rgb[p + 2]!;
        }
      }
      const [, u, v] = rgbToYuv(r / 4, g / 4, b / 4);
      out.u[cy * cw + cx] = clamp8(u + 0.5);
      out.v[cy * cw + cx] = clamp8(v + 0.5);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Static text layer

function escapeMarkup(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&apos;');
}

function cleanPrompt(prompt: string): string {
  // eslint-disable-next-line no-control-regex
  const s = prompt.replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, ' ').replace(/\s+/g, ' ').trim();
  const max = 600;
  return s.length > max ? `${s.slice(0, max - 1)}…` : s || '(empty prompt)';
}

interface RasterText {
  data: Buffer;
  width: number;
  height: number;
}

async function renderText(
  markup: string,
  font: string,
  maxWidth: number,
  maxHeight: number,
  align: 'left' | 'centre',
): Promise<RasterText> {
  // Font sizes are in points; at 72 dpi a point is a pixel. When the text does not fit,
  // pango picks the dpi (so the size) that fills the box.
  const opts = { text: markup, font, width: maxWidth, rgba: true, wrap: 'word-char' as const, align, dpi: 72 };
  let img = await sharp({ text: opts }).raw().toBuffer({ resolveWithObject: true });
  if (img.info.height > maxHeight || img.info.width > maxWidth) {
    // Too long for the box at the preferred size: let pango pick a size that fits.
    const { dpi: _dpi, ...fit } = opts;
    img = await sharp({ text: { ...fit, height: maxHeight } }).raw().toBuffer({ resolveWithObject: true });
  }
  if (img.info.height > maxHeight || img.info.width > maxWidth) {
    img = await sharp(img.data, { raw: { width: img.info.width, height: img.info.height, channels: 4 } })
      .resize(maxWidth, maxHeight, { fit: 'inside' })
      .raw()
      .toBuffer({ resolveWithObject: true });
  }
  return { data: img.data, width: img.info.width, height: img.info.height };
}

/** The overlay as Y/U/V colour + alpha planes (alpha 0..255), with the pixel lists it touches. */
interface Overlay {
  y: Uint8Array;
  a: Uint8Array;
  u: Uint8Array;
  v: Uint8Array;
  ca: Uint8Array;
  lumaIdx: Int32Array;
  chromaIdx: Int32Array;
}

async function buildOverlay(prompt: string, w: number, h: number, label: string): Promise<Overlay> {
  const short = Math.min(w, h);
  const margin = Math.round(short * 0.06);
  const fontPx = Math.max(10, Math.round(short * 0.065));
  const labelPx = Math.max(8, Math.round(short * 0.035));
  const boxW = w - 4 * margin;
  const boxH = Math.round(h * 0.5);
  // Text needs fonts (fontconfig); without any, the clip is still rendered, just without text.
  const safe = (p: Promise<RasterText>): Promise<RasterText | null> => p.catch(() => null);
  const [text, lab] = await Promise.all([
    safe(renderText(`<span foreground="white">${escapeMarkup(prompt)}</span>`, `sans bold ${fontPx}`, Math.max(8, boxW), Math.max(8, boxH), 'centre')),
    safe(renderText(`<span foreground="#ffffffcc">${escapeMarkup(label)}</span>`, `sans ${labelPx}`, Math.max(8, w - 2 * margin), labelPx * 2, 'left')),
  ]);
  const layers: OverlayOptions[] = [];
  let panelSvg = '';
  if (text && text.width <= w && text.height <= h) {
    const pad = Math.round(fontPx * 0.6);
    const panelW = Math.min(w - 2 * margin, text.width + 2 * pad);
    const panelH = Math.min(h - 2 * margin, text.height + 2 * pad);
    const radius = Math.round(pad * 0.8);
    panelSvg = `<rect x="${Math.round((w - panelW) / 2)}" y="${Math.round((h - panelH) / 2)}" width="${panelW}" height="${panelH}" rx="${radius}" ry="${radius}" fill="#000000" fill-opacity="0.45"/>`;
    layers.push({ input: text.data, raw: { width: text.width, height: text.height, channels: 4 }, left: Math.round((w - text.width) / 2), top: Math.round((h - text.height) / 2) });
  }
  if (lab && margin + lab.width <= w && Math.round(margin / 2) + lab.height <= h && h >= 120) {
    layers.push({ input: lab.data, raw: { width: lab.width, height: lab.height, channels: 4 }, left: margin, top: Math.round(margin / 2) });
  }
  const rgba = await sharp(Buffer.from(`<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}">${panelSvg}</svg>`))
    .composite(layers)
    .raw()
    .toBuffer();
  if (rgba.length !== w * h * 4) throw new Error('overlay rasterised at an unexpected size');

  const n = w * h;
  const y = new Uint8Array(n);
  const a = new Uint8Array(n);
  const luma: number[] = [];
  for (let i = 0; i < n; i++) {
    const p = i * 4;
    const alpha = rgba[p + 3]!;
    if (alpha === 0) continue;
    a[i] = alpha;
    y[i] = clamp8(16 + (219 / 255) * (0.2126 * rgba[p]! + 0.7152 * rgba[p + 1]! + 0.0722 * rgba[p + 2]!) + 0.5);
    luma.push(i);
  }
  const cw = w / 2, ch = h / 2;
  const u = new Uint8Array(cw * ch);
  const v = new Uint8Array(cw * ch);
  const ca = new Uint8Array(cw * ch);
  const chroma: number[] = [];
  for (let cy = 0; cy < ch; cy++) {
    for (let cx = 0; cx < cw; cx++) {
      let r = 0, g = 0, b = 0, sa = 0;
      for (let dy = 0; dy < 2; dy++) {
        for (let dx = 0; dx < 2; dx++) {
          const p = ((cy * 2 + dy) * w + cx * 2 + dx) * 4;
          const al = rgba[p + 3]!;
          r += rgba[p]! * al;
          g += rgba[p + 1]! * al;
          b += rgba[p + 2]! * al;
          sa += al;
        }
      }
      if (sa === 0) continue;
      const [, uu, vv] = rgbToYuv(r / sa, g / sa, b / sa);
      const ci = cy * cw + cx;
      u[ci] = clamp8(uu + 0.5);
      v[ci] = clamp8(vv + 0.5);
      ca[ci] = Math.round(sa / 4);
      chroma.push(ci);
    }
  }
  return { y, a, u, v, ca, lumaIdx: Int32Array.from(luma), chromaIdx: Int32Array.from(chroma) };
}

function blendOverlay(pic: Yuv, o: Overlay): void {
  const { lumaIdx, chromaIdx } = o;
  for (let k = 0; k < lumaIdx.length; k++) {
    const i = lumaIdx[k]!;
    const al = o.a[i]!;
    pic.y[i] = (pic.y[i]! * (255 - al) + o.y[i]! * al + 127) / 255;
  }
  for (let k = 0; k < chromaIdx.length; k++) {
    const i = chromaIdx[k]!;
    const al = o.ca[i]!;
    pic.u[i] = (pic.u[i]! * (255 - al) + o.u[i]! * al + 127) / 255;
    pic.v[i] = (pic.v[i]! * (255 - al) + o.v[i]! * al + 127) / 255;
  }
}

// ---------------------------------------------------------------------------
// Counter glyphs ("1.2s / 4.0s"): rasterised once, blitted per frame (luma only).

const GLYPHS = '0123456789./s'; // plus ' ' (an empty cell)

interface GlyphAtlas {
  advance: number;
  height: number;
  /** coverage (0..255) per glyph, advance × height */
  masks: Map<string, Uint8Array>;
}

async function buildGlyphs(px: number): Promise<GlyphAtlas> {
  // Rendered as one string so that every glyph sits on the same baseline; pango crops
  // the image to the ink, so cells are cut at multiples of the monospace advance.
  const img = await sharp({
    text: { text: `<span foreground="white">${escapeMarkup(GLYPHS)}</span>`, font: `monospace bold ${px}`, rgba: true, dpi: 72 },
  })
    .raw()
    .toBuffer({ resolveWithObject: true });
  const n = GLYPHS.length;
  const { width: iw, height } = img.info;
  const advance = Math.max(1, Math.round(iw / n));
  const offset = Math.floor((advance * n - iw) / 2);
  const masks = new Map<string, Uint8Array>();
  for (let k = 0; k < n; k++) {
    const m = new Uint8Array(advance * height);
    for (let yy = 0; yy < height; yy++) {
      for (let xx = 0; xx < advance; xx++) {
        const sx = k * advance - offset + xx;
        if (sx >= 0 && sx < iw) m[yy * advance + xx] = img.data[(yy * iw + sx) * 4 + 3]!;
      }
    }
    masks.set(GLYPHS[k]!, m);
  }
  masks.set(' ', new Uint8Array(advance * height));
  return { advance, height, masks };
}

function drawCounter(pic: Yuv, w: number, h: number, atlas: GlyphAtlas, text: string, right: number, top: number): void {
  const x0 = right - text.length * atlas.advance;
  // translucent dark box behind the text (luma + neutral chroma)
  const bx0 = Math.max(0, (x0 - 6) & ~1), bx1 = Math.min(w, (right + 6 + 1) & ~1);
  const by0 = Math.max(0, (top - 2) & ~1), by1 = Math.min(h, (top + atlas.height + 2 + 1) & ~1);
  for (let yy = by0; yy < by1; yy++) {
    for (let xx = bx0; xx < bx1; xx++) pic.y[yy * w + xx] = (pic.y[yy * w + xx]! * 2 + 16) / 3;
  }
  const cw = w / 2;
  for (let yy = by0 / 2; yy < by1 / 2; yy++) {
    for (let xx = bx0 / 2; xx < bx1 / 2; xx++) {
      pic.u[yy * cw + xx] = (pic.u[yy * cw + xx]! + 128) / 2;
      pic.v[yy * cw + xx] = (pic.v[yy * cw + xx]! + 128) / 2;
    }
  }
  for (let c = 0; c < text.length; c++) {
    const m = atlas.masks.get(text[c]!);
    if (!m) continue;
    const gx = x0 + c * atlas.advance;
    for (let yy = 0; yy < atlas.height; yy++) {
      const py = top + yy;
      if (py < 0 || py >= h) continue;
      for (let xx = 0; xx < atlas.advance; xx++) {
        const al = m[yy * atlas.advance + xx]!;
        const px = gx + xx;
        if (al === 0 || px < 0 || px >= w) continue;
        const i = py * w + px;
        pic.y[i] = (pic.y[i]! * (255 - al) + 235 * al) / 255;
      }
    }
  }
}

function drawProgress(pic: Yuv, w: number, h: number, progress: number): void {
  const barH = Math.max(2, Math.round(h * 0.012 / 2) * 2);
  const filled = Math.round((w * progress) / 2) * 2;
  const cw = w / 2;
  for (let yy = h - barH; yy < h; yy++) {
    const row = yy * w;
    for (let xx = 0; xx < w; xx++) pic.y[row + xx] = xx < filled ? 235 : 40;
  }
  for (let yy = (h - barH) / 2; yy < h / 2; yy++) {
    const row = yy * cw;
    for (let xx = 0; xx < cw; xx++) {
      pic.u[row + xx] = 128;
      pic.v[row + xx] = 128;
    }
  }
}

// ---------------------------------------------------------------------------
// Backgrounds

function drawGradient(pic: Yuv, w: number, h: number, seed: number, t: number, progress: number): void {
  const hue0 = seed % 360;
  const hueShift = 70 * progress;
  const [y0, u0, v0] = rgbToYuv(...hslToRgb(hue0 + hueShift, 0.65, 0.42));
  const [y1, u1, v1] = rgbToYuv(...hslToRgb(hue0 + 150 + hueShift, 0.7, 0.22));
  const angle = ((seed >>> 9) % 628) / 100 + t * 0.6;
  const dx = Math.cos(angle), dy = Math.sin(angle);
  const len = Math.abs(dx) * w + Math.abs(dy) * h;
  const sx = dx / len, sy = dy / len;
  const cx = w / 2, cy = h / 2;
  // moving soft highlight ("orb")
  const short = Math.min(w, h);
  const r = short * 0.35;
  const ox = cx + Math.cos(t * 1.3 + seed) * w * 0.3;
  const oy = cy + Math.sin(t * 0.9 + seed) * h * 0.3;
  const dY = y1 - y0;
  for (let yy = 0; yy < h; yy++) {
    let s = 0.5 + (0 - cx) * sx + (yy - cy) * sy;
    const row = yy * w;
    const ddy = (yy - oy) * (yy - oy);
    for (let xx = 0; xx < w; xx++, s += sx) {
      const ss = s < 0 ? 0 : s > 1 ? 1 : s;
      let val = y0 + dY * ss;
      const d2 = (xx - ox) * (xx - ox) + ddy;
      if (d2 < r * r) {
        const k = 1 - d2 / (r * r);
        val += 40 * k * k;
      }
      pic.y[row + xx] = val > 235 ? 235 : val;
    }
  }
  const cw = w / 2, ch = h / 2;
  const dU = u1 - u0, dV = v1 - v0;
  for (let yy = 0; yy < ch; yy++) {
    let s = 0.5 + (0.5 - cx) * sx + (yy * 2 + 0.5 - cy) * sy;
    const row = yy * cw;
    for (let xx = 0; xx < cw; xx++, s += 2 * sx) {
      const ss = s < 0 ? 0 : s > 1 ? 1 : s;
      pic.u[row + xx] = u0 + dU * ss;
      pic.v[row + xx] = v0 + dV * ss;
    }
  }
}

/** Decodes an image and fits it into w×h: whole image centred over a blurred, cropped copy of itself. */
async function loadImage(bytes: Buffer, w: number, h: number): Promise<Yuv> {
  const src = sharp(bytes, { failOn: 'error' }).rotate();
  const bg = await src.clone().resize(w, h, { fit: 'cover' }).blur(Math.max(4, Math.min(w, h) / 30)).modulate({ brightness: 0.6 }).removeAlpha().png().toBuffer();
  const fg = await src.clone().resize(w, h, { fit: 'inside' }).png().toBuffer();
  const raw = await sharp(bg).composite([{ input: fg, gravity: 'centre' }]).removeAlpha().raw().toBuffer({ resolveWithObject: true });
  if (raw.info.width !== w || raw.info.height !== h) throw new Error('image fit produced an unexpected size');
  return rgbToYuvPicture(raw.data, raw.info.channels, w, h);
}

function mixPictures(out: Yuv, a: Yuv, b: Yuv | null, weight: number): void {
  if (!b || weight <= 0) {
    out.buf.set(a.buf);
    return;
  }
  if (weight >= 1) {
    out.buf.set(b.buf);
    return;
  }
  const wb = Math.round(weight * 256), wa = 256 - wb;
  const A = a.buf, B = b.buf, O = out.buf;
  for (let i = 0; i < O.length; i++) O[i] = (A[i]! * wa + B[i]! * wb + 128) >> 8;
}

// ---------------------------------------------------------------------------
// Audio: a soft chord picked from the prompt, with a slow swell and fades.

function makeAudio(seed: number, totalSamples: number): { left: Float32Array; right: Float32Array } {
  const left = new Float32Array(totalSamples);
  const right = new Float32Array(totalSamples);
  const roots = [220, 246.94, 261.63, 293.66, 329.63, 196];
  const root = roots[seed % roots.length]!;
  const minor = ((seed >>> 4) & 1) === 1;
  const freqs = [root, root * (minor ? 1.1892 : 1.2599), root * 1.4983, root * 2];
  const pans = [0.5, 0.25, 0.75, 0.5];
  const sr = AUDIO_SAMPLE_RATE;
  const fade = Math.min(Math.floor(sr * 0.25), Math.floor(totalSamples / 2));
  for (let i = 0; i < totalSamples; i++) {
    const t = i / sr;
    let l = 0, r = 0;
    for (let k = 0; k < freqs.length; k++) {
      const env = 0.6 + 0.4 * Math.sin(2 * Math.PI * (0.25 + k * 0.07) * t + k);
      const s = Math.sin(2 * Math.PI * freqs[k]! * t) * env;
      l += s * (1 - pans[k]!);
      r += s * pans[k]!;
    }
    let g = 0.12;
    if (i < fade) g *= i / fade;
    if (totalSamples - i < fade) g *= (totalSamples - i) / fade;
    left[i] = l * g;
    right[i] = r * g;
  }
  return { left, right };
}

// ---------------------------------------------------------------------------
// Rendering

let logConfigured = false;

function abortError(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('The operation was aborted', 'AbortError');
}

function formatSeconds(s: number): string {
  return `${s.toFixed(1)}s`;
}

/** True when the bundled FFmpeg has the encoders this renderer needs. */
export function encoderAvailable(): { h264: boolean; aac: boolean } {
  return { h264: Codec.findEncoderByName(FF_ENCODER_LIBX264) != null, aac: Codec.findEncoderByName(FF_ENCODER_AAC) != null };
}

export async function renderVideo(opts: RenderVideoOptions): Promise<RenderVideoResult> {
  const { width: w, height: h, signal } = opts;
  const fps = opts.fps ?? DEFAULT_FPS;
  if (!Number.isInteger(w) || !Number.isInteger(h) || w < 2 || h < 2 || w > MAX_DIMENSION || h > MAX_DIMENSION) {
    throw new RangeError(`width and height must be integers in 2..${MAX_DIMENSION} (got ${w}x${h})`);
  }
  if (w % 2 !== 0 || h % 2 !== 0) {
    throw new RangeError(`width and height must be even for H.264 4:2:0 (got ${w}x${h})`);
  }
  if (!Number.isInteger(fps) || fps < 1 || fps > 60) throw new RangeError(`fps must be an integer in 1..60 (got ${fps})`);
  if (!(opts.durationSeconds > 0) || opts.durationSeconds > MAX_DURATION_SECONDS) {
    throw new RangeError(`durationSeconds must be in (0, ${MAX_DURATION_SECONDS}] (got ${opts.durationSeconds})`);
  }
  const frameCount = Math.max(1, Math.round(opts.durationSeconds * fps));
  const duration = frameCount / fps;
  if (signal?.aborted) throw abortError(signal);

  if (!logConfigured) {
    Log.setLevel(AV_LOG_ERROR);
    logConfigured = true;
  }
  const enc = encoderAvailable();
  if (!enc.h264) throw new Error('libx264 encoder is not available in the bundled FFmpeg');
  const withAudio = opts.audio && enc.aac;

  const prompt = cleanPrompt(opts.prompt);
  const seed = hashString(prompt);
  const short = Math.min(w, h);
  const [overlay, glyphs, first, last] = await Promise.all([
    buildOverlay(prompt, w, h, 'Mediagate · local preview'),
    buildGlyphs(Math.max(8, Math.round(short * 0.04))).catch(() => null),
    opts.firstFrame ? loadImage(opts.firstFrame, w, h) : Promise.resolve(null),
    opts.lastFrame ? loadImage(opts.lastFrame, w, h) : Promise.resolve(null),
  ]);
  if (signal?.aborted) throw abortError(signal);

  const tmpPath = `${opts.outputPath}.${randomBytes(6).toString('hex')}.partial`;
  let venc: Encoder | null = null;
  let aenc: Encoder | null = null;
  let mux: Muxer | null = null;
  let ok = false;
  try {
    venc = await Encoder.create(FF_ENCODER_LIBX264, {
      context: {
        gopSize: fps * 2,
        maxBFrames: 0,
        threadCount: 0,
        framerate: new Rational(fps, 1),
        colorPrimaries: AVCOL_PRI_BT709,
        colorTrc: AVCOL_TRC_BT709,
        colorSpace: AVCOL_SPC_BT709,
        colorRange: AVCOL_RANGE_MPEG,
      },
      options: { preset: 'veryfast', crf: 26, profile: 'high' },
    });
    if (withAudio) {
      aenc = await Encoder.create(FF_ENCODER_AAC, { context: { bitRate: 128_000 }, options: { aac_coder: 'fast' } });
    }
    mux = await Muxer.open(tmpPath, { format: 'mp4', options: { movflags: '+faststart' } });
    const vIndex = mux.addStream(venc);
    const aIndex = aenc ? mux.addStream(aenc) : -1;

    const write = async (packets: Packet[], index: number): Promise<void> => {
      for (const p of packets) {
        try {
          await mux!.writePacket(p, index);
        } finally {
          p.free();
        }
      }
    };

    const totalSamples = Math.round(duration * AUDIO_SAMPLE_RATE);
    const audio = aenc ? makeAudio(seed, totalSamples) : null;
    let samplesSent = 0;
    const pushAudioUntil = async (sampleLimit: number): Promise<void> => {
      if (!aenc || !audio) return;
      while (samplesSent < sampleLimit) {
        const n = Math.min(AAC_FRAME_SIZE, totalSamples - samplesSent);
        const planar = Buffer.alloc(n * 4 * 2);
        const f32 = new Float32Array(planar.buffer, planar.byteOffset, n * 2);
        f32.set(audio.left.subarray(samplesSent, samplesSent + n), 0);
        f32.set(audio.right.subarray(samplesSent, samplesSent + n), n);
        const frame = Frame.fromAudioBuffer(planar, {
          nbSamples: n,
          format: AV_SAMPLE_FMT_FLTP,
          sampleRate: AUDIO_SAMPLE_RATE,
          channelLayout: { order: AV_CHANNEL_ORDER_NATIVE, nbChannels: 2, mask: 3n },
          timeBase: { num: 1, den: AUDIO_SAMPLE_RATE },
          pts: BigInt(samplesSent),
        });
        try {
          await write(await aenc.encodeAll(frame), aIndex);
        } finally {
          frame.free();
        }
        samplesSent += n;
      }
    };

    const pic = allocYuv(w, h);
    for (let i = 0; i < frameCount; i++) {
      if (signal?.aborted) throw abortError(signal);
      const t = i / fps;
      const progress = frameCount > 1 ? i / (frameCount - 1) : 1;
      if (first) {
        // hold the first image, cross-fade over the middle 60%, hold the last one
        const x = Math.min(1, Math.max(0, (progress - 0.2) / 0.6));
        mixPictures(pic, first, last, x * x * (3 - 2 * x));
      } else if (last) {
        drawGradient(pic, w, h, seed, t, progress);
        const x = Math.min(1, Math.max(0, (progress - 0.2) / 0.6));
        mixPictures(pic, pic, last, x * x * (3 - 2 * x));
      } else {
        drawGradient(pic, w, h, seed, t, progress);
      }
      blendOverlay(pic, overlay);
      const margin = Math.round(short * 0.06);
      if (glyphs && h >= 120) drawCounter(pic, w, h, glyphs, `${formatSeconds((i + 1) / fps)} / ${formatSeconds(duration)}`, w - margin, Math.round(margin / 2));
      drawProgress(pic, w, h, (i + 1) / frameCount);

      const frame = Frame.fromVideoBuffer(pic.buf, {
        width: w,
        height: h,
        format: AV_PIX_FMT_YUV420P,
        timeBase: { num: 1, den: fps },
        pts: BigInt(i),
      });
      try {
        await write(await venc.encodeAll(frame), vIndex);
      } finally {
        frame.free();
      }
      await pushAudioUntil(Math.min(totalSamples, Math.round(((i + 1) / fps) * AUDIO_SAMPLE_RATE)));
    }
    if (signal?.aborted) throw abortError(signal);
    await write(await venc.encodeAll(null), vIndex);
    if (aenc) {
      await pushAudioUntil(totalSamples);
      await write(await aenc.encodeAll(null), aIndex);
    }
    await mux.close();
    mux = null;
    if (signal?.aborted) throw abortError(signal);
    await rename(tmpPath, opts.outputPath);
    ok = true;
    const { size } = await stat(opts.outputPath);
    return { bytes: size, durationSeconds: duration, width: w, height: h, hasAudio: withAudio };
  } finally {
    if (mux) await mux.close().catch(() => undefined);
    venc?.close();
    aenc?.close();
    if (!ok) await rm(tmpPath, { force: true }).catch(() => undefined);
  }
}

// ---------------------------------------------------------------------------
// Probe

function rationalToNumber(r: { num: number; den: number } | null | undefined): number {
  return r && r.den !== 0 ? r.num / r.den : 0;
}

/** Reads duration, size and codecs of an MP4 (or any container FFmpeg demuxes). */
export async function probeMp4(path: string): Promise<Mp4Info> {
  const demuxer = await Demuxer.open(path);
  try {
    const video = demuxer.video();
    const audio = demuxer.audio();
    if (!video) throw new Error(`${path} has no video stream`);
    const par = video.codecpar;
    const tb = rationalToNumber(video.timeBase);
    const containerDuration = demuxer.duration;
    const streamDuration = video.duration > 0n ? Number(video.duration) * tb : containerDuration;
    return {
      durationSeconds: streamDuration,
      containerDurationSeconds: containerDuration,
      width: par.width,
      height: par.height,
      videoCodec: Codec.findDecoder(par.codecId)?.name ?? 'unknown',
      audioCodec: audio ? (Codec.findDecoder(audio.codecpar.codecId)?.name ?? 'unknown') : null,
      fps: rationalToNumber(video.avgFrameRate),
      frameCount: Number(video.nbFrames),
      pixelFormat: avGetPixFmtName(par.format as AVPixelFormat) ?? null,
    };
  } finally {
    await demuxer.close();
  }
}

/**
 * Decodes video frame `index` (0-based, in presentation order) of a file to packed RGB24.
 * Uses the synchronous demux path (node-av's async Demuxer.packets() needs Node ≥ 22).
 */
export async function readVideoFrame(path: string, index: number): Promise<{ width: number; height: number; rgb: Buffer }> {
  const demuxer = await Demuxer.open(path);
  let decoder: Decoder | null = null;
  try {
    const video = demuxer.video();
    if (!video) throw new Error(`${path} has no video stream`);
    decoder = await Decoder.create(video);
    let n = 0;
    const take = (frames: Frame[]): Frame | null => {
      let hit: Frame | null = null;
      for (const f of frames) {
        if (n === index && !hit) hit = f;
        else f.free();
        n++;
      }
      return hit;
    };
    let hit: Frame | null = null;
    for (const packet of demuxer.packetsSync(video.index)) {
      if (packet && packet.streamIndex !== video.index) {
        packet.free();
        continue;
      }
      hit = take(decoder.decodeAllSync(packet));
      packet?.free();
      if (hit || !packet) break;
    }
    if (!hit) hit = take(decoder.decodeAllSync(null));
    if (!hit) throw new RangeError(`${path} has no video frame ${index}`);
    try {
      if (hit.format !== AV_PIX_FMT_YUV420P) throw new Error(`unexpected pixel format ${avGetPixFmtName(hit.format as AVPixelFormat)}`);
      return { width: hit.width, height: hit.height, rgb: yuv420ToRgb(hit.toBuffer(), hit.width, hit.height) };
    } finally {
      hit.free();
    }
  } finally {
    decoder?.close();
    await demuxer.close();
  }
}

/** Packed YUV 4:2:0 (BT.709 limited range) → packed RGB24. */
function yuv420ToRgb(buf: Buffer, w: number, h: number): Buffer {
  const rgb = Buffer.alloc(w * h * 3);
  const cw = w / 2;
  const uOff = w * h, vOff = uOff + cw * (h / 2);
  for (let yy = 0; yy < h; yy++) {
    for (let xx = 0; xx < w; xx++) {
      const Y = (buf[yy * w + xx]! - 16) * 1.1644;
      const ci = (yy >> 1) * cw + (xx >> 1);
      const U = buf[uOff + ci]! - 128, V = buf[vOff + ci]! - 128;
      const p = (yy * w + xx) * 3;
      rgb[p] = clamp8(Y + 1.7927 * V);
      rgb[p + 1] = clamp8(Y - 0.2132 * U - 0.5329 * V);
      rgb[p + 2] = clamp8(Y + 2.1124 * U);
    }
  }
  return rgb;
}
