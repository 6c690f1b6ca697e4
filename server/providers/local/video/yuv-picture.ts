/**
 * YUV 4:2:0 pictures and colour conversions (BT.709, limited range; the encoded stream is
 * tagged accordingly). Frames are painted directly in YUV so no per-frame conversion is needed.
 */
import type { TimeSlicer } from './time-slicer.ts';

export function rgbToYuv(r: number, g: number, b: number): [number, number, number] {
  const l = 0.2126 * r + 0.7152 * g + 0.0722 * b;
  return [16 + (219 / 255) * l, 128 + ((224 / 255) * (b - l)) / 1.8556, 128 + ((224 / 255) * (r - l)) / 1.5748];
}

export function hslToRgb(h: number, s: number, l: number): [number, number, number] {
  h = ((h % 360) + 360) % 360;
  const c = (1 - Math.abs(2 * l - 1)) * s;
  const x = c * (1 - Math.abs(((h / 60) % 2) - 1));
  const m = l - c / 2;
  const [r, g, b] =
    h < 60 ? [c, x, 0] : h < 120 ? [x, c, 0] : h < 180 ? [0, c, x] : h < 240 ? [0, x, c] : h < 300 ? [x, 0, c] : [c, 0, x];
  return [(r + m) * 255, (g + m) * 255, (b + m) * 255];
}

export function clamp8(v: number): number {
  return v < 0 ? 0 : v > 255 ? 255 : v;
}

/** A YUV 4:2:0 picture: planes stored contiguously (Y, then U, then V). */
export interface Yuv {
  buf: Buffer;
  y: Uint8Array;
  u: Uint8Array;
  v: Uint8Array;
}

export function allocYuv(w: number, h: number): Yuv {
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

/** Converts packed RGB/RGBA (alpha ignored) to YUV 4:2:0, with turns of the event loop between rows. */
export async function rgbToYuvPicture(rgb: Buffer, channels: number, w: number, h: number, slicer: TimeSlicer): Promise<Yuv> {
  const out = allocYuv(w, h);
  const cw = w / 2;
  for (let yy = 0; yy < h; yy++) {
    for (let xx = 0; xx < w; xx++) {
      const p = (yy * w + xx) * channels;
      const r = rgb[p]!, g = rgb[p + 1]!, b = rgb[p + 2]!;
      out.y[yy * w + xx] = clamp8(16 + (219 / 255) * (0.2126 * r + 0.7152 * g + 0.0722 * b) + 0.5);
    }
    if (slicer.due()) await slicer.nextTurn();
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
    if (slicer.due()) await slicer.nextTurn();
  }
  return out;
}

/** Packed YUV 4:2:0 (BT.709 limited range) → packed RGB24. */
export function yuv420ToRgb(buf: Buffer, w: number, h: number): Buffer {
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
