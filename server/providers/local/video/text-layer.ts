/**
 * The static text layers, rasterised once per clip by sharp (pango): the prompt panel and
 * label as a YUV + alpha overlay, and the glyph atlas of the time counter.
 */
import sharp from 'sharp';
import type { OverlayOptions } from 'sharp';
import type { TimeSlicer } from './time-slicer.ts';
import { clamp8, rgbToYuv } from './yuv-picture.ts';

function escapeMarkup(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&apos;');
}

export function cleanPrompt(prompt: string): string {
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
export interface Overlay {
  y: Uint8Array;
  a: Uint8Array;
  u: Uint8Array;
  v: Uint8Array;
  ca: Uint8Array;
  lumaIdx: Int32Array;
  chromaIdx: Int32Array;
}

/** Rasterises the overlay (sharp, off the event loop), then converts it with turns of the event loop between rows. */
export async function buildOverlay(prompt: string, w: number, h: number, label: string, slicer: TimeSlicer): Promise<Overlay> {
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

  // The pixel lists are filled into arrays of the largest size they can have, then copied to
  // arrays of their own length a slice at a time: pushed onto a growing array and converted at the
  // end, a large panel's million indices were milliseconds of copying in one go.
  const y = new Uint8Array(w * h);
  const a = new Uint8Array(w * h);
  const luma = new Int32Array(w * h);
  let lumaCount = 0;
  for (let yy = 0; yy < h; yy++) {
    for (let i = yy * w, end = i + w; i < end; i++) {
      const p = i * 4;
      const alpha = rgba[p + 3]!;
      if (alpha === 0) continue;
      a[i] = alpha;
      y[i] = clamp8(16 + (219 / 255) * (0.2126 * rgba[p]! + 0.7152 * rgba[p + 1]! + 0.0722 * rgba[p + 2]!) + 0.5);
      luma[lumaCount++] = i;
    }
    if (slicer.due()) await slicer.nextTurn();
  }
  const cw = w / 2, ch = h / 2;
  const u = new Uint8Array(cw * ch);
  const v = new Uint8Array(cw * ch);
  const ca = new Uint8Array(cw * ch);
  const chroma = new Int32Array(cw * ch);
  let chromaCount = 0;
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
      chroma[chromaCount++] = ci;
    }
    if (slicer.due()) await slicer.nextTurn();
  }
  return { y, a, u, v, ca, lumaIdx: await firstEntries(luma, lumaCount, slicer), chromaIdx: await firstEntries(chroma, chromaCount, slicer) };
}

/** A copy of the first `count` entries of `list`, made a slice at a time. */
async function firstEntries(list: Int32Array, count: number, slicer: TimeSlicer): Promise<Int32Array> {
  const out = new Int32Array(count);
  const slice = 65_536;
  for (let k = 0; k < count; k += slice) {
    out.set(list.subarray(k, Math.min(count, k + slice)), k);
    if (slicer.due()) await slicer.nextTurn();
  }
  return out;
}

// Counter glyphs ("1.2s / 4.0s"): rasterised once, blitted per frame (luma only).

const GLYPHS = '0123456789./s'; // plus ' ' (an empty cell)

export interface GlyphAtlas {
  advance: number;
  height: number;
  /** coverage (0..255) per glyph, advance × height */
  masks: Map<string, Uint8Array>;
}

export async function buildGlyphs(px: number): Promise<GlyphAtlas> {
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
