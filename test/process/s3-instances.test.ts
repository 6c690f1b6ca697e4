/**
 * Media on S3 with several instances (issue 29, requirement 5): two server processes share the
 * database and a bucket on an S3-compatible server (s3rver, on loopback), and no disk. A video
 * that one instance rendered and stored is served by the other (presigned, and through the other's
 * own signed URLs with Range), and a 512 MiB creation body streams into the bucket in bounded
 * memory.
 *
 * The bound: the large-inputs bench holds the filesystem store to a peak RSS growth of 64 MiB (it
 * measures about 30 here). Writing to S3 measures 58–69 MiB: lib-storage assembles each part in a
 * fresh buffer that lives while the part uploads, so the buffers reach V8's old generation and are
 * freed when external memory has grown by V8's threshold (64 MiB) — garbage, bounded whatever the
 * body's size. The test allows 96 MiB: a body (or one of its inputs) held whole would be hundreds.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { sql } from 'kysely';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestS3, type TestS3 } from '../support/s3-server.ts';
import { spawnServer, type ServerProcess } from '../support/server-process.ts';
import { until } from '../support/tasks.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';

const MiB = 1024 * 1024;
let t: TestDatabase;
let s3: TestS3;
const secret = randomBytes(32).toString('hex');
const dataDirs = [0, 1].map((i) => `/tmp/mediagate-s3-instance-${process.pid}-${i}`);
const running: ServerProcess[] = [];
/** Renders videos (workers on). */
let worker: ServerProcess;
/** Serves the API only (WORKER_CONCURRENCY=0), answering with its own signed URLs. */
let front: ServerProcess;

beforeAll(async () => {
  t = await createTestDatabase();
  await seedCatalog(t.db);
  s3 = await startTestS3('mediagate-instances');
  const start = async (dir: string, env: Record<string, string>) => {
    const p = await spawnServer({
      env: {
        DATABASE_URL: t.url,
        MEDIAGATE_SECRET_KEY: secret,
        MEDIAGATE_DATA_DIR: dir,
        DEMO_DATA: '0',
        TASK_POLL_MS: '100',
        VALIDATE_RESPONSES: '0',
        MAX_MEDIA_INPUT_BYTES: String(512 * MiB),
        ...s3.env('instances/'),
        ...env,
      },
    });
    running.push(p);
    return p;
  };
  [worker, front] = await Promise.all([start(dataDirs[0]!, { WORKER_CONCURRENCY: '2' }), start(dataDirs[1]!, { WORKER_CONCURRENCY: '0', MEDIA_URLS: 'gateway' })]);
}, 120_000);

afterAll(async () => {
  await Promise.all(running.map((p) => p.kill('SIGTERM')));
  await s3?.close();
  await t?.destroy();
  for (const dir of dataDirs) rmSync(dir, { recursive: true, force: true });
});

async function json(url: string, key: string, init: { method?: string; body?: unknown } = {}) {
  const res = await fetch(url, {
    method: init.method ?? 'GET',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: init.body === undefined ? undefined : JSON.stringify(init.body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, any> };
}

/** Every file under a data directory that is media (the embedded database, if any, aside). */
function mediaFilesUnder(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return (readdirSync(dir, { recursive: true, withFileTypes: true }) as import('node:fs').Dirent[])
    .filter((e) => e.isFile() && /(video_output|image_output|input|upload)/.test(e.parentPath ?? ''))
    .map((e) => e.name);
}

describe('two instances, one bucket, no shared disk', { timeout: 180_000 }, () => {
  it('a video stored by the instance that rendered it is downloaded through the other, presigned and through its own signed URL with Range', async () => {
    const c = await createCustomer(t.db, { balance: 100 });
    const created = await json(`${front.url}/v1/videos/generations`, c.key, {
      method: 'POST',
      body: { client_request_id: `s3-${randomBytes(4).toString('hex')}`, prompt: 'a lighthouse in fog', model: 'local-video-lite', seconds: 2, aspectRatio: '16:9', resolution: '360p' },
    });
    expect(created.status).toBe(202);
    const id = created.body.id as string;
    const done = await until(async () => {
      const r = await json(`${front.url}/v1/videos/${id}`, c.key);
      return r.body.status === 'completed' || r.body.status === 'failed' ? r.body : undefined;
    }, 60_000, 'the video to finish');
    expect(done.status).toBe('completed');

    // The bytes are in the bucket, under the prefix and the key the file's purpose and id give.
    const file = await t.db.selectFrom('files').select(['id', 'storageKey', 'bytes']).where('taskId', '=', id).where('purpose', '=', 'video_output').executeTakeFirstOrThrow();
    const stored = await s3.store('instances/').stat(file.storageKey);
    expect(stored?.bytes).toBe(Number(file.bytes));
    expect(file.storageKey).toBe(`video_output/${file.id.slice(5, 7)}/${file.id}`);

    // The front instance answers with its own signed URL (MEDIA_URLS=gateway) and streams from the bucket.
    const viaFront = new URL(done.video_url as string);
    expect(viaFront.origin).toBe(new URL(front.url).origin);
    const whole = await fetch(viaFront);
    expect(whole.status).toBe(200);
    expect(whole.headers.get('content-type')).toBe('video/mp4');
    const bytes = Buffer.from(await whole.arrayBuffer());
    expect(bytes.length).toBe(Number(file.bytes));
    expect(bytes.subarray(4, 8).toString()).toBe('ftyp');
    const part = await fetch(viaFront, { headers: { Range: 'bytes=100-199' } });
    expect(part.status).toBe(206);
    expect(part.headers.get('content-range')).toBe(`bytes 100-199/${file.bytes}`);
    expect(Buffer.from(await part.arrayBuffer()).equals(bytes.subarray(100, 200))).toBe(true);

    // The rendering instance answers with a presigned URL of the bucket (MEDIA_URLS=presigned, S3's default).
    const viaWorker = await json(`${worker.url}/v1/videos/${id}`, c.key);
    const presigned = new URL(viaWorker.body.video_url as string);
    expect(presigned.origin).toBe(new URL(s3.endpoint).origin);
    expect(presigned.searchParams.get('X-Amz-Signature')).toMatch(/^[0-9a-f]{64}$/);
    expect(Buffer.from(await (await fetch(presigned)).arrayBuffer()).equals(bytes)).toBe(true);

    // Neither instance kept media on its own disk.
    for (const dir of dataDirs) expect(mediaFilesUnder(dir)).toEqual([]);
  });

  it('streams a 512 MiB creation body into the bucket in bounded memory (peak RSS growth at most 96 MiB)', async () => {
    const c = await createCustomer(t.db, { balance: 1000 });
    await sql`update catalog_models set capabilities = jsonb_set(capabilities, '{referenceImages,maxCount}', '256') where id = 'local-video-1'`.execute(t.db);
    // One incompressible 8 MiB PNG, sent 63 times (the body streams from this one buffer).
    const edge = Math.floor(Math.sqrt((8 * MiB) / 3));
    const png = await sharp(randomBytes(edge * edge * 3), { raw: { width: edge, height: edge, channels: 3 } }).png({ compressionLevel: 0 }).toBuffer();
    const count = Math.floor((512 * MiB) / png.length);
    const base64 = Buffer.from(png.toString('base64'));
    const head = Buffer.from(
      `${JSON.stringify({ client_request_id: `s3-big-${randomBytes(4).toString('hex')}`, prompt: 'many large references', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' }).slice(0, -1)},"referenceImages":[`,
    );
    const parts: Buffer[] = [head];
    for (let i = 0; i < count; i++) parts.push(Buffer.from(`${i ? ',' : ''}"data:image/png;base64,`), base64, Buffer.from('"'));
    parts.push(Buffer.from(']}'));
    const length = parts.reduce((n, p) => n + p.length, 0);

    // A first small body loads the code of S3 writes (the SDK's multipart upload, its XML parser):
    // code, not memory that grows with the body; the bench's idle server has run a case before too.
    const warm = [Buffer.from(`${head.toString().replace('s3-big-', 's3-warm-')}"data:image/png;base64,`), base64, Buffer.from('"]}')];
    expect((await send(Number(new URL(front.url).port), c.key, warm, warm.reduce((n, p) => n + p.length, 0))).status).toBe(202);

    const pid = front.child.pid!;
    const memory = () => {
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)![1]) * 1024;
      return { rss: kb('VmRSS'), hwm: kb('VmHWM') };
    };
    const idle = memory().rss;
    writeFileSync(`/proc/${pid}/clear_refs`, '5');
    const answer = await send(Number(new URL(front.url).port), c.key, parts, length);
    const growthMiB = (memory().hwm - idle) / MiB;
    expect(answer.status, answer.body.slice(0, 300)).toBe(202);
    expect(growthMiB).toBeLessThanOrEqual(96);

    const { inputFileIds } = await t.db.selectFrom('videoTasks').select('inputFileIds').where('id', '=', (JSON.parse(answer.body) as { id: string }).id).executeTakeFirstOrThrow();
    expect(inputFileIds).toHaveLength(count);
    const rows = await t.db.selectFrom('files').select(['storageKey', 'bytes']).where('id', 'in', inputFileIds).execute();
    const store = s3.store('instances/');
    for (const row of rows) {
      expect(Number(row.bytes)).toBe(png.length);
      expect((await store.stat(row.storageKey))?.bytes).toBe(png.length);
    }
    for (const dir of dataDirs) expect(mediaFilesUnder(dir)).toEqual([]);
  });
});

/** POSTs a body made of `parts` in 64 KiB writes, honouring backpressure. */
function send(port: number, key: string, parts: Buffer[], length: number): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1/videos/generations', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', 'Content-Length': length } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (d: Buffer) => chunks.push(d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
      },
    );
    req.on('error', reject);
    void (async () => {
      for (const part of parts) {
        for (let i = 0; i < part.length; i += 64 * 1024) {
          if (!req.write(part.subarray(i, i + 64 * 1024))) await new Promise((r) => req.once('drain', r));
        }
      }
      req.end();
    })();
  });
}
