/**
 * `bigbody`: large video creations on a real server process (its own RSS, not the bench's). Each
 * body carries reference images as base64 data URLs (noise PNGs, incompressible) and streams from
 * one shared buffer (the bench holds one image). Per case: the server's idle RSS and its peak
 * (VmHWM, reset before the case), the wall time against writing the same body bytes to disk
 * (write + fsync, and the page cache alone) in the same run, and the statuses (all 202).
 * Then the rejection time: a body whose media is one byte over the limit, sent at full speed; the
 * time from writing the chunk that crosses the limit to the 413's arrival.
 *
 * Then the run (`runBigTask`): a Veo task whose three reference images are 512 MiB together, run
 * to completion by a server with workers against an upstream that reads the whole body
 * (veo-sink.ts: the images go inline as base64, 680 MiB of JSON): the server's peak RSS growth
 * while the task is created and while it runs (target: at most 64 MiB), against the bytes the
 * upstream read.
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
import { createApiKey, createGroup } from '../../test/support/factories.ts';
import { spawnServer, type ServerProcess } from '../../test/support/server-process.ts';
import { VEO_31, addUpstreamMember } from '../../test/support/upstreams.ts';
import { upsertCatalog } from '../../server/db/seed-demo.ts';
import type { Customer } from './database.ts';
import { serverCommand } from './server-command.ts';
import { startVeoSink } from './veo-sink.ts';

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

export interface BigTaskResult {
  inputMiB: number;
  /** Bytes of each of the three reference images. */
  imageBytes: number;
  bodyMiB: number;
  idleRssMiB: number;
  /** Peak RSS growth while the creation body was read (the task not yet run). */
  createPeakGrowthMiB: number;
  /** RSS when the 202 arrived (what the creation left), the start of the run. */
  createdRssMiB: number;
  /** Peak RSS growth from the 202 until the task completed: submit (the body streamed to the upstream), poll, download. */
  runPeakGrowthMiB: number;
  createMs: number;
  runMs: number;
  status: string;
  /** What the upstream read: the submit body, and the decoded bytes of each inline image. */
  upstreamBodyMiB: number;
  upstreamImageBytes: number[];
}

/** See the header: one Veo task with 512 MiB of reference images, created and run on a server with workers. */
export async function runBigTask(databaseUrl: string, db: Kysely<DB>, customer: Customer, env: Record<string, string> = {}, log: (line: string) => void = () => undefined, built = false): Promise<BigTaskResult> {
  const sink = await startVeoSink();
  const secret = randomBytes(32);
  const dataDir = join(tmpdir(), `mediagate-bench-task-${process.pid}`);
  await upsertCatalog(db, [VEO_31]);
  const group = await createGroup(db);
  await addUpstreamMember(db, secret, { groupId: group.id, provider: 'gemini', baseUrl: sink.url, credentials: { api_key: 'bench-key' }, models: [VEO_31.id] });
  const key = await createApiKey(db, { accountId: customer.accountId, groupId: group.id });
  const server = await spawnServer({
    env: {
      DATABASE_URL: databaseUrl,
      MEDIAGATE_SECRET_KEY: secret.toString('hex'),
      MEDIAGATE_DATA_DIR: dataDir,
      DEMO_DATA: '0',
      VALIDATE_RESPONSES: '0',
      LOG_LEVEL: 'warn',
      VIDEO_POLL_INTERVAL_MS: '200',
      TASK_POLL_MS: '100',
      ...env,
    },
    command: serverCommand({ built }),
  });
  const pid = server.child.pid!;
  try {
    // Three noise PNGs of a third of 512 MiB each (the same bytes three times: the bench holds one).
    // (A noise PNG comes out a little larger than asked: its filter bytes and zlib's block headers.)
    let png = await noisePng(Math.floor((512 * MiB) / 3) - MiB);
    if (3 * png.length > 512 * MiB) png = await noisePng(Math.floor((512 * MiB) / 3) - 2 * MiB - (3 * png.length - 512 * MiB));
    const imageBase64 = Buffer.from(png.toString('base64'));
    const head = Buffer.from(
      `${JSON.stringify({ client_request_id: `bench-task-${Date.now()}`, prompt: 'three very large references', model: VEO_31.id, seconds: 8, aspectRatio: '16:9', resolution: '720p' }).slice(0, -1)},"referenceImages":[`,
    );
    const prefix = Buffer.from('"data:image/png;base64,');
    const parts = [head, prefix, imageBase64, Buffer.from('",'), prefix, imageBase64, Buffer.from('",'), prefix, imageBase64, Buffer.from('"]}')];
    const length = parts.reduce((n, p) => n + p.length, 0);
    await new Promise((r) => setTimeout(r, 1000));
    const idle = memoryOf(pid).rss;
    resetPeak(pid);
    const started = performance.now();
    const answer = await send(Number(new URL(server.url).port), key.key, parts, length);
    const createMs = performance.now() - started;
    const createPeak = memoryOf(pid).hwm;
    if (answer.status !== 202) throw new Error(`the creation answered ${answer.status}: ${answer.body.slice(0, 300)}`);
    const id = (JSON.parse(answer.body) as { id: string }).id;
    const created = memoryOf(pid).rss;
    resetPeak(pid);
    const runStarted = performance.now();
    let status = 'queued';
    for (const deadline = Date.now() + 300_000; Date.now() < deadline; ) {
      const row = await db.selectFrom('videoTasks').select(['status', 'errorMessage']).where('id', '=', id).executeTakeFirstOrThrow();
      status = row.status;
      if (status === 'completed' || status === 'failed') {
        if (row.errorMessage) log(`  the task failed: ${row.errorMessage}`);
        break;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    const runMs = performance.now() - runStarted;
    const runPeak = memoryOf(pid).hwm;
    const upstream = sink.bodies.at(-1);
    return {
      inputMiB: (3 * png.length) / MiB,
      imageBytes: png.length,
      bodyMiB: length / MiB,
      idleRssMiB: idle / MiB,
      createPeakGrowthMiB: (createPeak - idle) / MiB,
      createdRssMiB: created / MiB,
      runPeakGrowthMiB: (runPeak - created) / MiB,
      createMs,
      runMs,
      status,
      upstreamBodyMiB: (upstream?.bytes ?? 0) / MiB,
      upstreamImageBytes: upstream?.images ?? [],
    };
  } finally {
    await server.kill('SIGTERM');
    await sink.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
}
