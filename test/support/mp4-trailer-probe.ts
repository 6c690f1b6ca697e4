/**
 * Writes a short video-only MP4 to the path given as the first argument with the local renderer's
 * writer (openMp4Writer), and prints one JSON line: `{"finished":true,"size":N}` or
 * `{"error":"…"}`. test/unit/mp4-encoder.test.ts runs it under a file size limit (prlimit --fsize),
 * which makes the writes past the limit fail with EFBIG (Node ignores SIGXFSZ).
 */
import { statSync } from 'node:fs';
import { openMp4Writer, quietFfmpegLog } from '../../server/providers/local/video/mp4-encoder.ts';

const [path] = process.argv.slice(2);
if (!path) throw new Error('usage: mp4-trailer-probe.ts <output path>');
quietFfmpegLog();
const width = 64;
const height = 64;
const writer = await openMp4Writer(path, { fps: 8, width, height, audio: null });
try {
  // Eight flat grey frames: a file of under 2 KiB, all of it still in the muxer's write buffer when
  // the trailer is written, so the trailer's flush is the first write that can hit the limit.
  for (let i = 0; i < 8; i++) await writer.writeFrame(Buffer.alloc((width * height * 3) / 2, 16 + i * 20), i);
  await writer.finish();
  console.log(JSON.stringify({ finished: true, size: statSync(path).size }));
} catch (err) {
  console.log(JSON.stringify({ error: (err as Error).message }));
} finally {
  await writer.close();
}
