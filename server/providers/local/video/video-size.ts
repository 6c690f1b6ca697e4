/**
 * Output sizes of the local video renderer: a resolution + aspect ratio mapped to an even
 * pixel size (H.264 4:2:0 halves both dimensions for chroma, so both must be even).
 */

/** Largest width or height the renderer accepts. */
export const MAX_DIMENSION = 4096;

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
