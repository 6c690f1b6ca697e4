/** Reads rendered files back: stream facts (probeMp4) and single decoded frames (readVideoFrame). */
import { Decoder, Demuxer } from 'node-av/api';
import { avGetPixFmtName, Codec } from 'node-av/lib';
import type { Frame } from 'node-av/lib';
import type { AVPixelFormat } from 'node-av/constants';
import { AV_PIX_FMT_YUV420P } from 'node-av/constants';
import { yuv420ToRgb } from './yuv-picture.ts';

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
