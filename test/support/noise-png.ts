/**
 * A PNG of seeded random pixels, stored uncompressed: its size is about its pixel count × 3, and
 * the same seed gives the same bytes (tests that need inputs of a known size that do not compress).
 */
import sharp from 'sharp';

export async function noisePng(width: number, height: number, seed: number): Promise<Buffer> {
  const raw = Buffer.alloc(width * height * 3);
  let a = seed >>> 0;
  for (let i = 0; i < raw.length; i++) {
    a = (a + 0x6d2b79f5) >>> 0; // mulberry32
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    raw[i] = (t ^ (t >>> 14)) >>> 24;
  }
  return sharp(raw, { raw: { width, height, channels: 3 } }).png({ compressionLevel: 0 }).toBuffer();
}
