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
 * The JavaScript pixel work runs on the caller's event loop in slices of a few
 * milliseconds (time-slicer.ts); encoding and muxing run on FFmpeg's threads.
 *
 * Pixel sizes must be even (4:2:0 chroma subsampling halves both dimensions):
 * renderVideo throws a RangeError on odd width/height. Use videoSize() to map a
 * resolution + aspect ratio to a valid size.
 *
 * This module orchestrates one render; the pieces live next to it (video-size,
 * yuv-picture, text-layer, frame-painter, audio-track, mp4-encoder, mp4-probe, time-slicer).
 * It re-exports their public API so importers keep one entry point.
 */
import { randomBytes } from 'node:crypto';
import { rename, rm, stat } from 'node:fs/promises';
import { AUDIO_SAMPLE_RATE, makeAudio } from './audio-track.ts';
import { blendOverlay, drawCounter, drawGradient, drawProgress, loadImage, mixPictures } from './frame-painter.ts';
import { encoderAvailable, openMp4Writer, quietFfmpegLog, type Mp4Writer } from './mp4-encoder.ts';
import { buildGlyphs, buildOverlay, cleanPrompt } from './text-layer.ts';
import { TimeSlicer } from './time-slicer.ts';
import { MAX_DIMENSION } from './video-size.ts';
import { allocYuv } from './yuv-picture.ts';

export { encoderAvailable } from './mp4-encoder.ts';
export { probeMp4, readVideoFrame, type Mp4Info } from './mp4-probe.ts';
export { SLICE_BUDGET_MS, TimeSlicer } from './time-slicer.ts';
export { MAX_DIMENSION, videoSize } from './video-size.ts';

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
  /**
   * Gives the event loop its turns between slices of pixel work. Renders that run side by side
   * should share one, so that together they stay within its budget per turn. Default: one of
   * this render's own, with SLICE_BUDGET_MS.
   */
  slicer?: TimeSlicer;
  /**
   * Opens the MP4 writer the frames go to. Default: `openMp4Writer`. A test wraps it to see the
   * frames as handed to the encoder (the file's bytes also depend on the encoder's threads).
   */
  openWriter?: typeof openMp4Writer;
}

export interface RenderVideoResult {
  bytes: number;
  durationSeconds: number;
  width: number;
  height: number;
  hasAudio: boolean;
}

export const DEFAULT_FPS = 10;
export const MAX_DURATION_SECONDS = 120;

/** FNV-1a: a stable seed, so one prompt always gets the same colours, motion and chord. */
function hashString(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return h >>> 0;
}

function abortError(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('The operation was aborted', 'AbortError');
}

function formatSeconds(s: number): string {
  return `${s.toFixed(1)}s`;
}

/** Renders the clip to opts.outputPath; rejects with a RangeError on invalid options. */
export async function renderVideo(opts: RenderVideoOptions): Promise<RenderVideoResult> {
  const { width: w, height: h, signal } = opts;
  const slicer = opts.slicer ?? new TimeSlicer();
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

  quietFfmpegLog();
  const enc = encoderAvailable();
  if (!enc.h264) throw new Error('libx264 encoder is not available in the bundled FFmpeg');
  const withAudio = opts.audio && enc.aac;

  const prompt = cleanPrompt(opts.prompt);
  const seed = hashString(prompt);
  const short = Math.min(w, h);
  const [overlay, glyphs, first, last] = await Promise.all([
    buildOverlay(prompt, w, h, 'Mediagate · local preview', slicer),
    buildGlyphs(Math.max(8, Math.round(short * 0.04))).catch(() => null),
    opts.firstFrame ? loadImage(opts.firstFrame, w, h, slicer) : Promise.resolve(null),
    opts.lastFrame ? loadImage(opts.lastFrame, w, h, slicer) : Promise.resolve(null),
  ]);
  if (signal?.aborted) throw abortError(signal);


  const tmpPath = `${opts.outputPath}.${randomBytes(6).toString('hex')}.partial`;
  let mp4: Mp4Writer | null = null;
  let ok = false;
  try {
    const totalSamples = Math.round(duration * AUDIO_SAMPLE_RATE);
    mp4 = await (opts.openWriter ?? openMp4Writer)(tmpPath, { fps, width: w, height: h, audio: withAudio ? makeAudio(seed, totalSamples) : null });

    const pic = allocYuv(w, h);
    for (let i = 0; i < frameCount; i++) {
      if (signal?.aborted) throw abortError(signal);
      const t = i / fps;
      const progress = frameCount > 1 ? i / (frameCount - 1) : 1;
      if (first) {
        // hold the first image, cross-fade over the middle 60%, hold the last one
        const x = Math.min(1, Math.max(0, (progress - 0.2) / 0.6));
        await mixPictures(pic, first, last, x * x * (3 - 2 * x), slicer);
      } else if (last) {
        await drawGradient(pic, w, h, seed, t, progress, slicer);
        const x = Math.min(1, Math.max(0, (progress - 0.2) / 0.6));
        await mixPictures(pic, pic, last, x * x * (3 - 2 * x), slicer);
      } else {
        await drawGradient(pic, w, h, seed, t, progress, slicer);
      }
      await blendOverlay(pic, overlay, slicer);
      const margin = Math.round(short * 0.06);
      if (glyphs && h >= 120) drawCounter(pic, w, h, glyphs, `${formatSeconds((i + 1) / fps)} / ${formatSeconds(duration)}`, w - margin, Math.round(margin / 2));
      drawProgress(pic, w, h, (i + 1) / frameCount);
      await mp4.writeFrame(pic.buf, i);
    }
    if (signal?.aborted) throw abortError(signal);
    await mp4.finish();
    if (signal?.aborted) throw abortError(signal);
    await rename(tmpPath, opts.outputPath);
    ok = true;
    const { size } = await stat(opts.outputPath);
    return { bytes: size, durationSeconds: duration, width: w, height: h, hasAudio: withAudio };
  } finally {
    await mp4?.close();
    if (!ok) await rm(tmpPath, { force: true }).catch(() => undefined);
  }
}
