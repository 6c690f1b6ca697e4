/**
 * Per-frame painting into a YUV 4:2:0 picture: backgrounds (animated gradient or the
 * caller's images, cross-faded), the text overlay, the time counter and the progress bar.
 * The painters that cover the whole picture give the event loop its turns between rows (or runs
 * of SLICE_PIXELS); the counter and the progress bar touch a few rows and run in one go.
 */
import sharp from 'sharp';
import type { GlyphAtlas, Overlay } from './text-layer.ts';
import type { TimeSlicer } from './time-slicer.ts';
import { hslToRgb, rgbToYuv, rgbToYuvPicture, type Yuv } from './yuv-picture.ts';

/** Pixels the flat loops paint between two looks at the clock: a few rows of a 1080p frame, tens of microseconds. */
const SLICE_PIXELS = 8192;

export async function blendOverlay(pic: Yuv, o: Overlay, slicer: TimeSlicer): Promise<void> {
  const { lumaIdx, chromaIdx } = o;
  for (let k0 = 0; k0 < lumaIdx.length; k0 += SLICE_PIXELS) {
    const end = Math.min(lumaIdx.length, k0 + SLICE_PIXELS);
    for (let k = k0; k < end; k++) {
      const i = lumaIdx[k]!;
      const al = o.a[i]!;
      pic.y[i] = (pic.y[i]! * (255 - al) + o.y[i]! * al + 127) / 255;
    }
    if (slicer.due()) await slicer.nextTurn();
  }
  for (let k0 = 0; k0 < chromaIdx.length; k0 += SLICE_PIXELS) {
    const end = Math.min(chromaIdx.length, k0 + SLICE_PIXELS);
    for (let k = k0; k < end; k++) {
      const i = chromaIdx[k]!;
      const al = o.ca[i]!;
      pic.u[i] = (pic.u[i]! * (255 - al) + o.u[i]! * al + 127) / 255;
      pic.v[i] = (pic.v[i]! * (255 - al) + o.v[i]! * al + 127) / 255;
    }
    if (slicer.due()) await slicer.nextTurn();
  }
}

export function drawCounter(pic: Yuv, w: number, h: number, atlas: GlyphAtlas, text: string, right: number, top: number): void {
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

export function drawProgress(pic: Yuv, w: number, h: number, progress: number): void {
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

// Backgrounds

export async function drawGradient(pic: Yuv, w: number, h: number, seed: number, t: number, progress: number, slicer: TimeSlicer): Promise<void> {
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
    if (slicer.due()) await slicer.nextTurn();
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
    if (slicer.due()) await slicer.nextTurn();
  }
}

/** Decodes an image and fits it into w×h: whole image centred over a blurred, cropped copy of itself. */
export async function loadImage(bytes: Buffer, w: number, h: number, slicer: TimeSlicer): Promise<Yuv> {
  const src = sharp(bytes, { failOn: 'error' }).rotate();
  const bg = await src.clone().resize(w, h, { fit: 'cover' }).blur(Math.max(4, Math.min(w, h) / 30)).modulate({ brightness: 0.6 }).removeAlpha().png().toBuffer();
  const fg = await src.clone().resize(w, h, { fit: 'inside' }).png().toBuffer();
  const raw = await sharp(bg).composite([{ input: fg, gravity: 'centre' }]).removeAlpha().raw().toBuffer({ resolveWithObject: true });
  if (raw.info.width !== w || raw.info.height !== h) throw new Error('image fit produced an unexpected size');
  return rgbToYuvPicture(raw.data, raw.info.channels, w, h, slicer);
}

export async function mixPictures(out: Yuv, a: Yuv, b: Yuv | null, weight: number, slicer: TimeSlicer): Promise<void> {
  // The whole-picture copies are one memcpy each (a millisecond for 1080p), not worth slicing.
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
  for (let i0 = 0; i0 < O.length; i0 += SLICE_PIXELS) {
    const end = Math.min(O.length, i0 + SLICE_PIXELS);
    for (let i = i0; i < end; i++) O[i] = (A[i]! * wa + B[i]! * wb + 128) >> 8;
    if (slicer.due()) await slicer.nextTurn();
  }
}
