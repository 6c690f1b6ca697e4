/**
 * MP4 encoding and muxing with node-av (N-API bindings to the FFmpeg shipped inside the npm
 * package `@seydx/node-av-<platform>`): H.264 video via libx264, AAC audio via FFmpeg's
 * native encoder, interleaved frame by frame into one file.
 */
import { Encoder, Muxer } from 'node-av/api';
import { Codec, FFmpegError, Frame, Log, Rational } from 'node-av/lib';
import type { Packet } from 'node-av/lib';
import {
  AVFMT_FLAG_CUSTOM_IO,
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
import { AUDIO_SAMPLE_RATE, type AudioTrack } from './audio-track.ts';

const AAC_FRAME_SIZE = 1024;

let logConfigured = false;

/** Limits FFmpeg's own logging to errors (once per process), so renders do not flood stderr. */
export function quietFfmpegLog(): void {
  if (!logConfigured) {
    Log.setLevel(AV_LOG_ERROR);
    logConfigured = true;
  }
}

/** True when the bundled FFmpeg has the encoders this renderer needs. */
export function encoderAvailable(): { h264: boolean; aac: boolean } {
  return { h264: Codec.findEncoderByName(FF_ENCODER_LIBX264) != null, aac: Codec.findEncoderByName(FF_ENCODER_AAC) != null };
}

export interface Mp4WriterOptions {
  /** Frames per second of the video stream (its time base is 1/fps). */
  fps: number;
  /** Width and height of every frame passed to writeFrame. */
  width: number;
  height: number;
  /** The audio to mux alongside the video; null for a video-only file. */
  audio: AudioTrack | null;
}

/** An open MP4 being written. Call finish() once after the last frame, and always close(). */
export interface Mp4Writer {
  /** Encodes YUV 4:2:0 frame `index`, then the audio up to that frame's end (to keep the streams interleaved). */
  writeFrame(yuv: Buffer, index: number): Promise<void>;
  /** Flushes the encoders, writes the remaining audio and the trailer, and closes the file; rejects when any of it could not be written. */
  finish(): Promise<void>;
  /** Releases the encoders and, if finish() did not run, closes the file ignoring errors. */
  close(): Promise<void>;
}

/**
 * Closes a muxer opened on a file path, and the file with it. node-av (6.1) flags every IO
 * context assigned to a format context as custom IO, its own file included, so Muxer.close()
 * would release the file with avio_context_free instead of avio_closep: the descriptor stays
 * open and the 256 KiB write buffer and the URL context are never freed (one fd and a quarter
 * MiB of native memory per clip). Without the flag, close() takes its avio_closep branch. The
 * flag is only read there, after the trailer, so the bytes written do not change.
 */
async function closeMuxer(mux: Muxer): Promise<void> {
  mux.getFormatContext().clearFlags(AVFMT_FLAG_CUSTOM_IO);
  await mux.close();
}

/** The Muxer's own bookkeeping (node-av 6.1), which close() reads to decide whether to write the trailer. */
interface MuxerProgress {
  headerWritten: boolean;
  trailerWritten: boolean;
}

/**
 * Writes the file's trailer (the moov index, and with `+faststart` the rewrite that moves it to the
 * front) and fails when it could not be written. Muxer.close() writes a missing trailer itself but
 * ignores its result, and av_write_trailer is also where the last buffered bytes are flushed: a
 * full disk there would leave a truncated MP4 that looked finished. Marks the trailer written so
 * that close() does not write it a second time.
 */
async function writeTrailer(mux: Muxer): Promise<void> {
  const progress = mux as unknown as MuxerProgress;
  if (typeof progress.headerWritten !== 'boolean' || typeof progress.trailerWritten !== 'boolean') {
    throw new Error('node-av Muxer keeps no headerWritten/trailerWritten: check writeTrailer() in mp4-encoder.ts against this version');
  }
  // Packets wait in the muxer until every stream has produced one; without a header none reached the file.
  if (!progress.headerWritten) throw new Error('the MP4 has no header: no packet reached the muxer');
  const ret = await mux.getFormatContext().writeTrailer();
  progress.trailerWritten = true;
  FFmpegError.throwIfError(ret, 'writing the MP4 trailer');
}

/** Opens `path` for writing; on failure, whatever was already opened is released again. */
export async function openMp4Writer(path: string, opts: Mp4WriterOptions): Promise<Mp4Writer> {
  const { fps, width, height, audio } = opts;
  let venc: Encoder | null = null;
  let aenc: Encoder | null = null;
  let mux: Muxer | null = null;
  let vIndex: number;
  let aIndex: number;

  const close = async (): Promise<void> => {
    if (mux) await closeMuxer(mux).catch(() => undefined);
    venc?.close();
    aenc?.close();
  };

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
    if (audio) {
      aenc = await Encoder.create(FF_ENCODER_AAC, { context: { bitRate: 128_000 }, options: { aac_coder: 'fast' } });
    }
    // No write worker (node-av's default with two streams): its failed write (a full disk) is an
    // unhandled rejection that ends the process, and it makes close() throw before releasing
    // anything. Our writes are awaited one by one anyway, so the order of the packets is the same.
    mux = await Muxer.open(path, { format: 'mp4', options: { movflags: '+faststart' }, useAsyncWrite: false });
    vIndex = mux.addStream(venc);
    aIndex = aenc ? mux.addStream(aenc) : -1;
  } catch (err) {
    await close();
    throw err;
  }
  const video = venc;
  const openMux = mux;

  const write = async (packets: Packet[], index: number): Promise<void> => {
    try {
      for (const p of packets) await openMux.writePacket(p, index);
    } finally {
      // All of them, also the ones after a packet that could not be written.
      for (const p of packets) p.free();
    }
  };

  const totalSamples = audio?.totalSamples ?? 0;
  let samplesSent = 0;
  const pushAudioUntil = async (sampleLimit: number): Promise<void> => {
    if (!aenc || !audio) return;
    while (samplesSent < sampleLimit) {
      const n = Math.min(AAC_FRAME_SIZE, totalSamples - samplesSent);
      const planar = Buffer.alloc(n * 4 * 2);
      const f32 = new Float32Array(planar.buffer, planar.byteOffset, n * 2);
      audio.render(samplesSent, f32.subarray(0, n), f32.subarray(n));
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

  return {
    async writeFrame(yuv, index) {
      const frame = Frame.fromVideoBuffer(yuv, {
        width,
        height,
        format: AV_PIX_FMT_YUV420P,
        timeBase: { num: 1, den: fps },
        pts: BigInt(index),
      });
      try {
        await write(await video.encodeAll(frame), vIndex);
      } finally {
        frame.free();
      }
      await pushAudioUntil(Math.min(totalSamples, Math.round(((index + 1) / fps) * AUDIO_SAMPLE_RATE)));
    },
    async finish() {
      await write(await video.encodeAll(null), vIndex);
      if (aenc) {
        await pushAudioUntil(totalSamples);
        await write(await aenc.encodeAll(null), aIndex);
      }
      try {
        await writeTrailer(openMux);
      } finally {
        await closeMuxer(openMux);
        mux = null;
      }
    },
    close,
  };
}
