/**
 * The local renderer runs on the gateway's event loop, so its pixel work must come in slices with
 * turns of the loop between them (a 1080p frame in one go held every other request for tens of
 * milliseconds). Wall-clock stalls depend on the machine; these tests check the structure instead,
 * with a slicer whose budget is 0 (a turn between every two rows) or unlimited (never a turn).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeAudio } from '../../server/providers/local/video/audio-track.ts';
import { blendOverlay, drawGradient, loadImage, mixPictures } from '../../server/providers/local/video/frame-painter.ts';
import { openMp4Writer } from '../../server/providers/local/video/mp4-encoder.ts';
import { probeMp4 } from '../../server/providers/local/video/mp4-probe.ts';
import { renderVideo, TimeSlicer } from '../../server/providers/local/video/render-video.ts';
import { buildOverlay } from '../../server/providers/local/video/text-layer.ts';
import { allocYuv } from '../../server/providers/local/video/yuv-picture.ts';

/**
 * What the renderer hands the encoder, frame by frame (a hash of each YUV picture), recorded by
 * wrapping the real writer. Slicing must not change these; the MP4's own bytes also depend on
 * FFmpeg's encoder threads, which once (in CI, under load) made two renders of the same frames
 * differ, so the bytes are not what these tests compare.
 */
function recordingWriter(handed: string[]): typeof openMp4Writer {
  return async (...args) => {
    const writer = await openMp4Writer(...args);
    return {
      ...writer,
      writeFrame: (yuv: Buffer, index: number) => {
        handed.push(`${index}:${createHash('sha256').update(yuv).digest('hex')}`);
        return writer.writeFrame(yuv, index);
      },
    };
  };
}

let dir = '';

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'mg-local-video-slicing-'));
});

afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** A turn of the event loop at every check: between every two rows. */
const everyRow = () => new TimeSlicer(0);
/** No turns: the work runs in one go, as it did before slicing. */
const never = () => new TimeSlicer(Infinity);

/**
 * Runs `work` while counting turns of the event loop with a chain of immediates. The work here only
 * computes (no I/O to wait for), so each turn the chain sees is one the work gave away.
 */
async function turnsDuring(work: () => Promise<unknown>): Promise<number> {
  let turns = 0;
  let running = true;
  const tick = () => {
    if (!running) return;
    turns++;
    setImmediate(tick);
  };
  setImmediate(tick);
  try {
    await work();
  } finally {
    running = false;
  }
  return turns;
}

describe('TimeSlicer', () => {
  it('lets the work run on while the budget lasts, and not once it is spent', () => {
    expect(never().due()).toBe(false);
    expect(everyRow().due()).toBe(true);
  });

  it('gives the event loop a turn: what was waiting for it runs first', async () => {
    const slicer = everyRow();
    let queuedBefore = false;
    setImmediate(() => (queuedBefore = true));
    await slicer.nextTurn();
    expect(queuedBefore).toBe(true);
    expect(slicer.turns).toBe(1);
  });

  it('makes the renders that share it wait for one turn, not one each', async () => {
    const slicer = everyRow();
    const first = slicer.nextTurn();
    expect(slicer.nextTurn()).toBe(first);
    await first;
    expect(slicer.turns).toBe(1);
  });
});

describe('the painters give the event loop turns within a frame', () => {
  const w = 1920, h = 1080;

  it('paints the gradient of a 1080p frame with a turn between rows', async () => {
    const pic = allocYuv(w, h);
    expect(await turnsDuring(() => drawGradient(pic, w, h, 42, 1.5, 0.3, everyRow()))).toBeGreaterThanOrEqual(h + h / 2);
  });

  it('cross-fades two 1080p pictures in slices', async () => {
    const a = allocYuv(w, h), b = allocYuv(w, h);
    expect(await turnsDuring(() => mixPictures(a, a, b, 0.5, everyRow()))).toBeGreaterThanOrEqual(a.buf.length / 8192);
  });

  it('converts the prompt overlay and an input image a row at a time', async () => {
    // These wait for sharp too (turns the chain above would count): the slicer counts its own.
    const [ow, oh] = [640, 360];
    const overlay = everyRow();
    await buildOverlay('A lighthouse in a storm', ow, oh, 'label', overlay);
    expect(overlay.turns).toBeGreaterThanOrEqual(oh + oh / 2);
    const png = await sharp({ create: { width: 64, height: 48, channels: 3, background: { r: 200, g: 30, b: 30 } } }).png().toBuffer();
    const image = everyRow();
    await loadImage(png, ow, oh, image);
    expect(image.turns).toBeGreaterThanOrEqual(oh + oh / 2);
  });

  it('renders a clip with a turn between rows of every frame', async () => {
    // Encoding waits on FFmpeg's threads, so the slicer's own count, not the chain's.
    const slicer = everyRow();
    const [width, height, frames] = [320, 240, 10];
    await renderVideo({ prompt: 'Sliced', durationSeconds: 1, width, height, audio: true, outputPath: join(dir, 'sliced.mp4'), slicer });
    // The gradient alone gives a turn after each of its rows; the overlay, once per clip, as many again.
    expect(slicer.turns).toBeGreaterThanOrEqual(frames * (height + height / 2));
  });
});

describe('slicing changes no output', () => {
  const w = 320, h = 240;

  it('paints the same pixels in slices as in one go', async () => {
    const paint = async (slicer: TimeSlicer) => {
      const png = await sharp({ create: { width: 90, height: 200, channels: 3, background: { r: 30, g: 40, b: 220 } } }).png().toBuffer();
      const overlay = await buildOverlay('The same pixels, sliced or not', w, h, 'label', slicer);
      const image = await loadImage(png, w, h, slicer);
      const pic = allocYuv(w, h);
      await drawGradient(pic, w, h, 7, 0.4, 0.2, slicer);
      await mixPictures(pic, pic, image, 0.35, slicer);
      await blendOverlay(pic, overlay, slicer);
      return { pic: pic.buf, lumaIdx: overlay.lumaIdx, chromaIdx: overlay.chromaIdx };
    };
    const sliced = await paint(everyRow());
    const whole = await paint(never());
    // More entries than one slice of the flat loops (8192), so slice boundaries are crossed.
    expect(whole.lumaIdx.length).toBeGreaterThan(8192);
    expect(Buffer.from(sliced.lumaIdx.buffer).equals(Buffer.from(whole.lumaIdx.buffer))).toBe(true);
    expect(Buffer.from(sliced.chromaIdx.buffer).equals(Buffer.from(whole.chromaIdx.buffer))).toBe(true);
    expect(sliced.pic.equals(whole.pic)).toBe(true);
  });

  it('computes the same audio samples in encoder-sized pieces as in one piece', () => {
    const total = 48_000;
    const track = makeAudio(1234, total);
    const left = new Float32Array(total), right = new Float32Array(total);
    track.render(0, left, right);
    const pieceL = new Float32Array(total), pieceR = new Float32Array(total);
    for (let from = 0; from < total; from += 1024) {
      const n = Math.min(1024, total - from);
      track.render(from, pieceL.subarray(from, from + n), pieceR.subarray(from, from + n));
    }
    expect(Buffer.from(pieceL.buffer).equals(Buffer.from(left.buffer))).toBe(true);
    expect(Buffer.from(pieceR.buffer).equals(Buffer.from(right.buffer))).toBe(true);
    // fades in from silence and out to it
    expect(left[0]).toBe(0);
    expect(Math.abs(left[total - 1]!)).toBeLessThan(1e-3);
  });

  it('hands the encoder the same frames whatever the budget, and writes a playable MP4', async () => {
    const blue = await sharp({ create: { width: 200, height: 300, channels: 3, background: { r: 30, g: 40, b: 220 } } }).jpeg().toBuffer();
    const render = async (name: string, slicer: TimeSlicer) => {
      const handed: string[] = [];
      const outputPath = join(dir, name);
      await renderVideo({ prompt: 'Byte for byte', durationSeconds: 1, width: w, height: h, audio: true, lastFrame: blue, outputPath, slicer, openWriter: recordingWriter(handed) });
      return { frames: handed, info: await probeMp4(outputPath) };
    };
    const sliced = await render('every-row.mp4', everyRow());
    const whole = await render('never.mp4', never());
    expect(whole.frames).toHaveLength(10);
    // the clip fades to the blue image: its frames are not all alike
    expect(new Set(whole.frames.map((f) => f.split(':')[1])).size).toBeGreaterThan(5);
    expect(sliced.frames).toEqual(whole.frames);
    expect(sliced.info).toEqual(whole.info);
    expect(whole.info).toMatchObject({ width: w, height: h, videoCodec: 'h264', audioCodec: 'aac', frameCount: 10 });
  });
});
