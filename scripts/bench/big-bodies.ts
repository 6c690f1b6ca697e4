/**
 * Memory and time of large video-creation bodies, measured on a real server process (its own RSS,
 * not the bench's): the server is spawned on the bench database, N bodies of B bytes are sent at
 * once, and the server's peak RSS (VmHWM, reset before each case) is compared with its idle RSS.
 * Baseline in the same run: writing the same bytes to a file on disk.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { spawnServer, type ServerProcess } from '../../test/support/server-process.ts';
import type { Customer } from './database.ts';

export interface BigBodyCase {
  label: string;
  concurrency: number;
  /** Approximate size of each JSON body. */
  bytes: number;
}

export interface BigBodyResult {
  label: string;
  bytesPerBody: number;
  concurrency: number;
  idleRssMiB: number;
  peakGrowthMiB: number;
  wallMs: number;
  diskMs: number;
  statuses: Record<string, number>;
}

const MiB = 1024 * 1024;

/** Linux: resident set and its high-water mark of a process, in bytes. */
function memoryOf(pid: number): { rss: number; hwm: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
  return { rss: kb('VmRSS'), hwm: kb('VmHWM') };
}

function resetPeak(pid: number) {
  writeFileSync(`/proc/${pid}/clear_refs`, '5');
}

/** A PNG of noise (incompressible) whose base64 data URL is about `bytes` long. */
async function noisePng(bytes: number): Promise<Buffer> {
  const pixels = Math.floor((bytes * 3) / 4 / 3);
  const edge = Math.max(16, Math.floor(Math.sqrt(pixels)));
  return sharp(randomBytes(edge * edge * 3), { raw: { width: edge, height: edge, channels: 3 } })
    .png({ compressionLevel: 0 })
    .toBuffer();
}

/** One creation request whose body streams from a shared buffer (the bench holds one copy). */
function send(port: number, key: string, id: string, dataUrlBase64: Buffer): Promise<number> {
  const head = Buffer.from(
    JSON.stringify({ client_request_id: id, prompt: 'a large first frame', model: 'local-video-1', seconds: 4, aspectRatio: '16:9', resolution: '720p', firstFrame: '@' }).split('"@"')[0] +
      '"data:image/png;base64,',
  );
  const tail = Buffer.from('"}');
  return new Promise((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1/videos/generations', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', 'Content-Length': head.length + dataUrlBase64.length + tail.length } },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      },
    );
    req.on('error', (err: NodeJS.ErrnoException) => (err.code === 'ECONNRESET' || err.code === 'EPIPE' ? resolve(-1) : reject(err)));
    req.write(head);
    req.write(dataUrlBase64);
    req.end(tail);
  });
}

async function diskWrite(payload: Buffer, copies: number): Promise<number> {
  const started = performance.now();
  await Promise.all(
    Array.from({ length: copies }, async (_, i) => {
      const path = join(tmpdir(), `mediagate-bench-disk-${process.pid}-${i}`);
      const file = await open(path, 'w');
      try {
        await file.write(payload);
        await file.sync();
      } finally {
        await file.close();
        rmSync(path, { force: true });
      }
    }),
  );
  return performance.now() - started;
}

export async function runBigBodies(databaseUrl: string, customer: Customer, cases: BigBodyCase[], env: Record<string, string> = {}): Promise<BigBodyResult[]> {
  const server: ServerProcess = await spawnServer({
    env: {
      DATABASE_URL: databaseUrl,
      MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'),
      MEDIAGATE_DATA_DIR: join(tmpdir(), `mediagate-bench-bodies-${process.pid}`),
      DEMO_DATA: '0',
      WORKER_CONCURRENCY: '0',
      VALIDATE_RESPONSES: '0',
      JSON_BODY_LIMIT_BYTES: String(Math.max(...cases.map((c) => c.bytes)) + MiB),
      ...env,
    },
  });
  const pid = server.child.pid!;
  const port = Number(new URL(server.url).port);
  const results: BigBodyResult[] = [];
  try {
    for (const c of cases) {
      const png = await noisePng(c.bytes);
      const payload = Buffer.from(png.toString('base64'));
      await new Promise((r) => setTimeout(r, 500));
      const idle = memoryOf(pid).rss;
      resetPeak(pid);
      const started = performance.now();
      const statuses = await Promise.all(Array.from({ length: c.concurrency }, (_, i) => send(port, customer.key, `bench-body-${Date.now()}-${i}`, payload)));
      const wallMs = performance.now() - started;
      const peak = memoryOf(pid).hwm;
      const diskMs = await diskWrite(payload, c.concurrency);
      const counts: Record<string, number> = {};
      for (const s of statuses) counts[s] = (counts[s] ?? 0) + 1;
      results.push({ label: c.label, bytesPerBody: payload.length, concurrency: c.concurrency, idleRssMiB: idle / MiB, peakGrowthMiB: (peak - idle) / MiB, wallMs, diskMs, statuses: counts });
    }
  } finally {
    await server.kill('SIGTERM');
  }
  return results;
}
