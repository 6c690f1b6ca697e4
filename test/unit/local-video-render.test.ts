import { mkdtemp, open, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { probeMp4, readVideoFrame, renderVideo, videoSize } from '../../server/providers/local/video/render-video.ts';

let dir = '';

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'mg-local-video-'));
});

afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

async function firstBox(path: string): Promise<string> {
  const fh = await open(path, 'r');
  try {
    const buf = Buffer.alloc(8);
    await fh.read(buf, 0, 8, 0);
    return buf.subarray(4, 8).toString('latin1');
  } finally {
    await fh.close();
  }
}

/** Mean R, G, B over a window near the top-left corner (clear of the prompt panel and counter). */
function cornerMean(frame: { width: number; height: number; rgb: Buffer }): [number, number, number] {
  const { width: w, height: h, rgb } = frame;
  const sum = [0, 0, 0];
  let n = 0;
  for (let y = Math.floor(h * 0.05); y < Math.floor(h * 0.2); y++) {
    for (let x = Math.floor(w * 0.05); x < Math.floor(w * 0.3); x++) {
      const p = (y * w + x) * 3;
      sum[0]! += rgb[p]!;
      sum[1]! += rgb[p + 1]!;
      sum[2]! += rgb[p + 2]!;
      n++;
    }
  }
  return [sum[0]! / n, sum[1]! / n, sum[2]! / n];
}

describe('videoSize', () => {
  it.each([
    ['720p', '16:9', 1280, 720],
    ['720p', '9:16', 720, 1280],
    ['720p', '1:1', 720, 720],
    ['1080p', '16:9', 1920, 1080],
    ['1080p', '9:16', 1080, 1920],
    ['480p', '16:9', 848, 480],
    ['480p', '4:3', 640, 480],
    ['480p', '3:4', 480, 640],
    ['360p', '16:9', 640, 360],
    ['360p', '9:16', 360, 640],
    ['360p', '1:1', 360, 360],
    ['720p', '4:3', 960, 720],
    ['720p', '21:9', 1680, 720],
    ['1080p', '21:9', 2520, 1080],
    ['720P', ' 16:9 ', 1280, 720],
  ])('%s %s → %ix%i', (res, ratio, width, height) => {
    const size = videoSize(res, ratio);
    expect(size).toEqual({ width, height });
    expect(size.width % 2).toBe(0);
    expect(size.height % 2).toBe(0);
  });

  it('rejects unknown resolutions and ratios', () => {
    expect(() => videoSize('big', '16:9')).toThrow(RangeError);
    expect(() => videoSize('721p', '16:9')).toThrow(RangeError);
    expect(() => videoSize('720p', 'wide')).toThrow(RangeError);
    expect(() => videoSize('720p', '0:9')).toThrow(RangeError);
    expect(() => videoSize('720p', '10:1')).toThrow(RangeError);
  });
});

describe('renderVideo', () => {
  it('renders a 2 s 360p 16:9 H.264 MP4 without audio', async () => {
    const outputPath = join(dir, 'landscape.mp4');
    const result = await renderVideo({ prompt: 'A lighthouse in a storm', durationSeconds: 2, width: 640, height: 360, audio: false, outputPath });
    expect(result).toMatchObject({ durationSeconds: 2, width: 640, height: 360, hasAudio: false });
    expect(result.bytes).toBe((await stat(outputPath)).size);
    expect(result.bytes).toBeGreaterThan(1000);
    expect(await firstBox(outputPath)).toBe('ftyp');

    const info = await probeMp4(outputPath);
    expect(info.width).toBe(640);
    expect(info.height).toBe(360);
    expect(info.videoCodec).toBe('h264');
    expect(info.audioCodec).toBeNull();
    expect(info.pixelFormat).toBe('yuv420p');
    expect(info.fps).toBe(10);
    expect(info.frameCount).toBe(20);
    expect(Math.abs(info.durationSeconds - 2)).toBeLessThanOrEqual(0.1);
    // no temp files left beside the output
    expect((await readdir(dir)).filter((f) => f.startsWith('landscape'))).toEqual(['landscape.mp4']);
  });

  it('renders a 2 s 9:16 clip with an AAC track', async () => {
    const outputPath = join(dir, 'portrait.mp4');
    const { width, height } = videoSize('360p', '9:16');
    const result = await renderVideo({ prompt: 'Vertical clip with sound', durationSeconds: 2, width, height, fps: 12, audio: true, outputPath });
    expect(result).toMatchObject({ durationSeconds: 2, width: 360, height: 640, hasAudio: true });
    expect(await firstBox(outputPath)).toBe('ftyp');

    const info = await probeMp4(outputPath);
    expect(info).toMatchObject({ width: 360, height: 640, videoCodec: 'h264', audioCodec: 'aac', frameCount: 24 });
    expect(Math.abs(info.durationSeconds - 2)).toBeLessThanOrEqual(1 / 12);
    expect(Math.abs(info.containerDurationSeconds - 2)).toBeLessThanOrEqual(0.1);

    const frame = await readVideoFrame(outputPath, 23);
    expect(frame.width).toBe(360);
    expect(frame.height).toBe(640);
  });

  it('starts from firstFrame and ends on lastFrame', async () => {
    const red = await sharp({ create: { width: 300, height: 200, channels: 3, background: { r: 220, g: 30, b: 30 } } }).png().toBuffer();
    const blue = await sharp({ create: { width: 200, height: 300, channels: 3, background: { r: 30, g: 40, b: 220 } } }).jpeg().toBuffer();
    const outputPath = join(dir, 'frames.mp4');
    const result = await renderVideo({
      prompt: 'From red to blue',
      durationSeconds: 2,
      width: 480,
      height: 480,
      audio: false,
      firstFrame: red,
      lastFrame: blue,
      outputPath,
    });
    expect(result).toMatchObject({ width: 480, height: 480, durationSeconds: 2, hasAudio: false });
    const info = await probeMp4(outputPath);
    expect(info).toMatchObject({ width: 480, height: 480, videoCodec: 'h264', audioCodec: null, frameCount: 20 });

    const [r0, g0, b0] = cornerMean(await readVideoFrame(outputPath, 0));
    expect(r0).toBeGreaterThan(150);
    expect(g0).toBeLessThan(90);
    expect(b0).toBeLessThan(90);
    // the last image is portrait, so it is letterboxed: sample its centre column
    const last = await readVideoFrame(outputPath, 19);
    const p = (Math.floor(last.height * 0.1) * last.width + Math.floor(last.width / 2)) * 3;
    expect(last.rgb[p + 2]!).toBeGreaterThan(150);
    expect(last.rgb[p]!).toBeLessThan(90);
  });

  it('rejects odd sizes and bad durations before writing anything', async () => {
    const outputPath = join(dir, 'odd.mp4');
    const base = { prompt: 'x', durationSeconds: 1, audio: false, outputPath };
    await expect(renderVideo({ ...base, width: 641, height: 360 })).rejects.toThrow(/even/);
    await expect(renderVideo({ ...base, width: 640, height: 361 })).rejects.toThrow(/even/);
    await expect(renderVideo({ ...base, width: 640.5, height: 360 })).rejects.toThrow(RangeError);
    await expect(renderVideo({ ...base, width: 640, height: 360, durationSeconds: 0 })).rejects.toThrow(RangeError);
    await expect(renderVideo({ ...base, width: 640, height: 360, fps: 0 })).rejects.toThrow(RangeError);
    await expect(stat(outputPath)).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it('stops on abort and leaves no partial file', async () => {
    const outputPath = join(dir, 'aborted.mp4');
    const controller = new AbortController();
    const promise = renderVideo({
      prompt: 'Never finished',
      durationSeconds: 20,
      width: 1280,
      height: 720,
      audio: true,
      outputPath,
      signal: controller.signal,
    });
    setTimeout(() => controller.abort(new Error('client went away')), 300);
    await expect(promise).rejects.toThrow('client went away');
    await expect(stat(outputPath)).rejects.toMatchObject({ code: 'ENOENT' });
    expect((await readdir(dir)).filter((f) => f.startsWith('aborted'))).toEqual([]);
  });

  it('rejects at once when the signal is already aborted', async () => {
    const outputPath = join(dir, 'pre-aborted.mp4');
    await expect(
      renderVideo({ prompt: 'x', durationSeconds: 1, width: 320, height: 240, audio: false, outputPath, signal: AbortSignal.abort() }),
    ).rejects.toMatchObject({ name: 'AbortError' });
    await expect(stat(outputPath)).rejects.toMatchObject({ code: 'ENOENT' });
  });
});
