/**
 * `bigbody`: large video creations on a real server process (its own RSS, not the bench's). Each
 * body carries reference images as base64 data URLs (noise PNGs, incompressible) and streams from
 * one shared buffer (the bench holds one image). Per case: the server's idle RSS and its peak
 * (VmHWM, reset before the case), the wall time against writing the same body bytes to disk
 * (write + fsync, and the page cache alone) in the same run, and the statuses (all 202).
 * Then the rejection time: a body whose media is one byte over the limit, sent at full speed; the
 * time from writing the chunk that crosses the limit to the 413's arrival.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { spawnServer, type ServerProcess } from '../../test/support/server-process.ts';
import type { Customer } from './database.ts';
import { serverCommand } from './server-command.ts';

export interface BigBodyCase {
  label: string;
  concurrency: number;
  /** Decoded media bytes of each body (its JSON is about 4/3 of it). */
  mediaBytes: number;
}

export interface BigBodyResult {
  label: string;
  bodyBytes: number;
  concurrency: number;
  idleRssMiB: number;
  peakGrowthMiB: number;
  wallMs: number;
  diskSyncMs: number;
  diskCacheMs: number;
  statuses: Record<string, number>;
}

export interface RejectionResult {
  limitBytes: number;
  /** From writing the chunk that crosses the limit to the response's arrival. */
  afterCrossingMs: number;
  status: number;
  code: string | undefined;
  /** Body bytes the client had written when the answer came, of all it would have sent. */
  writtenMiB: number;
  bodyMiB: number;
}

const MiB = 1024 * 1024;
/** Each reference image: a noise PNG of about this many bytes. */
const IMAGE_BYTES = 8 * MiB;
const CHUNK = 64 * 1024;

/** Linux: resident set and its high-water mark of a process, in bytes. */
function memoryOf(pid: number): { rss: number; hwm: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
  return { rss: kb('VmRSS'), hwm: kb('VmHWM') };
}

function resetPeak(pid: number) {
  writeFileSync(`/proc/${pid}/clear_refs`, '5');
}

/** A PNG of noise (incompressible) of about `bytes`. */
async function noisePng(bytes: number): Promise<Buffer> {
  const edge = Math.max(16, Math.floor(Math.sqrt(bytes / 3)));
  return sharp(randomBytes(edge * edge * 3), { raw: { width: edge, height: edge, channels: 3 } })
    .png({ compressionLevel: 0 })
    .toBuffer();
}

/** The parts of one creation body: head, `count` data URLs of the image (comma-separated), tail. */
function bodyParts(id: string, imageBase64: Buffer, count: number) {
  const head = Buffer.from(
    `${JSON.stringify({ client_request_id: id, prompt: 'many large reference images', model: 'local-video-1', seconds: 4, aspectRatio: '16:9', resolution: '720p' }).slice(0, -1)},"referenceImages":[`,
  );
  const prefix = Buffer.from('"data:image/png;base64,');
  const parts: Buffer[] = [head];
  for (let i = 0; i < count; i++) parts.push(...(i > 0 ? [Buffer.from(',')] : []), prefix, imageBase64, Buffer.from('"'));
  parts.push(Buffer.from(']}'));
  return { parts, length: parts.reduce((n, p) => n + p.length, 0) };
}

/** Sends a body made of `parts` in CHUNK writes, honouring backpressure; `onWritten(offset)` after each. */
function send(
  port: number,
  key: string,
  parts: Buffer[],
  length: number,
  onWritten: (offset: number) => void = () => undefined,
): Promise<{ status: number; body: string; written: number; at: number }> {
  return new Promise((resolve, reject) => {
    let written = 0;
    let answered = false;
    const req = request(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1/videos/generations', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', 'Content-Length': length } },
      (res) => {
        answered = true;
        const at = performance.now();
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString(), written, at }));
      },
    );
    req.on('error', (err: NodeJS.ErrnoException) => {
      if (!answered) reject(err);
    });
    void (async () => {
      for (const part of parts) {
        for (let i = 0; i < part.length && !answered; i += CHUNK) {
          const chunk = part.subarray(i, i + CHUNK);
          const ok = req.write(chunk);
          written += chunk.length;
          onWritten(written);
          if (!ok) {
            await new Promise<void>((r) => {
              const done = () => {
                req.off('drain', done).off('close', done);
                r();
              };
              req.on('drain', done).on('close', done);
            });
          }
          if (req.destroyed) return;
        }
      }
      if (!answered) req.end();
    })();
  });
}

async function diskWrite(parts: Buffer[], copies: number, sync: boolean): Promise<number> {
  const started = performance.now();
  await Promise.all(
    Array.from({ length: copies }, async (_, i) => {
      const path = join(tmpdir(), `mediagate-bench-disk-${process.pid}-${i}`);
      const file = await open(path, 'w');
      try {
        for (const part of parts) await file.write(part);
        if (sync) await file.sync();
      } finally {
        await file.close();
        rmSync(path, { force: true });
      }
    }),
  );
  return performance.now() - started;
}

export async function runBigBodies(
  databaseUrl: string,
  db: Kysely<DB>,
  customer: Customer,
  cases: BigBodyCase[],
  env: Record<string, string> = {},
  log: (line: string) => void = () => undefined,
  built = false,
): Promise<{ results: BigBodyResult[]; rejection: RejectionResult }> {
  const limit = 512 * MiB;
  // The local model takes up to 256 reference images here (an operator can set this limit).
  await sql`update catalog_models set capabilities = jsonb_set(capabilities, '{referenceImages,maxCount}', '256') where id = 'local-video-1'`.execute(db);
  const dataDir = join(tmpdir(), `mediagate-bench-bodies-${process.pid}`);
  const server: ServerProcess = await spawnServer({
    env: {
      DATABASE_URL: databaseUrl,
      MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'),
      MEDIAGATE_DATA_DIR: dataDir,
      DEMO_DATA: '0',
      WORKER_CONCURRENCY: '0',
      VALIDATE_RESPONSES: '0',
      LOG_LEVEL: 'warn',
      MAX_MEDIA_INPUT_BYTES: String(limit),
      ...env,
    },
    command: serverCommand({ built }),
  });
  const pid = server.child.pid!;
  const port = Number(new URL(server.url).port);
  const results: BigBodyResult[] = [];
  try {
    const png = await noisePng(IMAGE_BYTES);
    const imageBase64 = Buffer.from(png.toString('base64'));
    log(`  each reference image: a ${(png.length / MiB).toFixed(2)} MiB noise PNG (${(imageBase64.length / MiB).toFixed(2)} MiB of base64)`);
    for (const c of cases) {
      const count = Math.max(1, Math.floor(c.mediaBytes / png.length));
      const bodies = Array.from({ length: c.concurrency }, (_, i) => bodyParts(`bench-body-${Date.now()}-${i}`, imageBase64, count));
      await new Promise((r) => setTimeout(r, 1000));
      const idle = memoryOf(pid).rss;
      resetPeak(pid);
      const started = performance.now();
      const answers = await Promise.all(bodies.map((b) => send(port, customer.key, b.parts, b.length)));
      const wallMs = performance.now() - started;
      const peak = memoryOf(pid).hwm;
      const diskSyncMs = await diskWrite(bodies[0]!.parts, c.concurrency, true);
      const diskCacheMs = await diskWrite(bodies[0]!.parts, c.concurrency, false);
      const counts: Record<string, number> = {};
      for (const a of answers) counts[a.status] = (counts[a.status] ?? 0) + 1;
      const firstError = answers.find((a) => a.status !== 202);
      if (firstError) log(`  ${c.label}: first non-202 answer: ${firstError.status} ${firstError.body.slice(0, 300)}`);
      results.push({ label: `${c.label} (${count} images each)`, bodyBytes: bodies[0]!.length, concurrency: c.concurrency, idleRssMiB: idle / MiB, peakGrowthMiB: (peak - idle) / MiB, wallMs, diskSyncMs, diskCacheMs, statuses: counts });
    }

    // One byte over the limit: a data URL of limit + 1 bytes (refused while streaming, before any
    // image is decoded, so its bytes need not be an image). Its base64 repeats a 3 MiB block.
    const block = Buffer.from(randomBytes(3 * MiB).toString('base64'));
    const blocks = Math.floor(limit / (3 * MiB));
    const rest = Buffer.from(randomBytes(limit + 1 - blocks * 3 * MiB).toString('base64'));
    const head = Buffer.from(`${JSON.stringify({ client_request_id: `bench-over-${Date.now()}`, prompt: 'one byte too many', model: 'local-video-1', seconds: 4, aspectRatio: '16:9', resolution: '720p' }).slice(0, -1)},"firstFrame":"data:image/png;base64,`);
    const parts = [head, ...Array.from({ length: blocks }, () => block), rest, Buffer.from('"}')];
    const length = parts.reduce((n, p) => n + p.length, 0);
    const crossingOffset = length - 2 - 4; // the last base64 quad takes the decoded total past the limit
    let crossedAt = 0;
    const answer = await send(port, customer.key, parts, length, (offset) => {
      if (!crossedAt && offset >= crossingOffset) crossedAt = performance.now();
    });
    const parsed = (() => {
      try {
        return JSON.parse(answer.body) as { error?: { code?: string } };
      } catch {
        return {};
      }
    })();
    const rejection: RejectionResult = {
      limitBytes: limit,
      afterCrossingMs: crossedAt ? answer.at - crossedAt : NaN,
      status: answer.status,
      code: parsed.error?.code,
      writtenMiB: answer.written / MiB,
      bodyMiB: length / MiB,
    };
    return { results, rejection };
  } finally {
    await server.kill('SIGTERM');
    rmSync(dataDir, { recursive: true, force: true });
  }
}
