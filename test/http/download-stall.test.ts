/**
 * A client that stops reading a body piped from the media store (a file download, an image task
 * listing whose b64_json images are read from the store as it is written) while keeping its socket
 * open: Node's pipe waited for it as long as the connection lived, holding the store's stream (a
 * file descriptor; with S3, one of the read client's sockets). Now it is cut off after the bound of
 * a JSON answer carrying images, ten times STREAM_WRITE_IDLE_MS, and the store's stream is closed
 * with it; a client that keeps taking bytes, however slowly and with pauses, gets the whole body.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import net from 'node:net';
import { Readable, Writable } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { pipeBounded, StalledClient } from '../../server/lib/base64-json.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

/** STREAM_WRITE_IDLE_MS here: a client that takes nothing for ten times as long is cut off. */
const IDLE_MS = 200;
const BOUND_MS = IDLE_MS * 10;
/**
 * How long the slow clients stop reading between bursts: well under the bound, since the server
 * sees a client's progress a quarter of the bound late at most, and a loaded machine's timers fire late.
 */
const PAUSE_MS = BOUND_MS * 0.4;

let server: TestServer;

beforeAll(async () => {
  server = await startTestServer({ env: { STREAM_WRITE_IDLE_MS: String(IDLE_MS) } });
  await seedCatalog(server.db);
});

afterAll(async () => server?.close());

afterEach(() => {
  vi.restoreAllMocks();
});

/** A Files API upload of `bytes` random bytes, stored as a video (far more than the sockets' buffers hold). */
async function storedVideo(accountId: string, bytes: number): Promise<{ id: string; data: Buffer }> {
  const id = `file_stall${randomUUID().replace(/-/g, '')}`;
  const storageKey = `upload/xx/${id}.mp4`;
  const data = randomBytes(bytes);
  await server.ctx.mediaStore.put(storageKey, data);
  await server.db
    .insertInto('files')
    .values({ id, accountId, purpose: 'upload', contentType: 'video/mp4', bytes, storageKey, expiresAt: new Date(Date.now() + 3_600_000), filename: 'clip.mp4' })
    .execute();
  return { id, data };
}

/** A completed b64_json image task of the customer whose one image is `bytes` random bytes in the store. */
async function imageTaskWithLargeImage(key: string, bytes: number): Promise<{ taskId: string; data: Buffer }> {
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'local-image-1', prompt: 'a harbour at night', output_format: 'png', response_format: 'b64_json' }),
  });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
  const taskId = res.headers.get('x-task-id')!;
  const file = await server.db.selectFrom('files').select(['id', 'storageKey']).where('taskId', '=', taskId).executeTakeFirstOrThrow();
  // The listing reads the image's bytes as stored: a larger image in its place makes a body no socket buffers whole.
  const data = randomBytes(bytes);
  await server.ctx.mediaStore.put(file.storageKey, data);
  await server.db.updateTable('files').set({ bytes }).where('id', '=', file.id).execute();
  return { taskId, data };
}

/** A raw GET of `path` (with an API key and a request id to find its log lines) on a socket of its own. */
async function rawGet(path: string, key: string, requestId: string): Promise<net.Socket> {
  const url = new URL(server.directUrl);
  const sock = net.connect(Number(url.port), url.hostname);
  await new Promise((resolve) => sock.once('connect', resolve));
  sock.write(`GET ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nX-Request-Id: ${requestId}\r\n\r\n`);
  return sock;
}

/** The head of a response and its Content-Length, once all of the head is in `raw`. */
function headOf(raw: Buffer): { head: string; bodyAt: number; length: number } | undefined {
  const end = raw.indexOf('\r\n\r\n');
  if (end < 0) return undefined;
  const head = raw.subarray(0, end).toString('latin1');
  return { head, bodyAt: end + 4, length: Number(/\r\ncontent-length: (\d+)/i.exec(head)![1]) };
}

/**
 * A client that reads the head and the first bytes of the body, then stops reading with its socket
 * open. `stopped` resolves when it stopped; `rest()` reads on until the server closes the
 * connection (or for at most `waitMs`) and says what it got in all.
 */
async function stallingClient(path: string, key: string, requestId: string) {
  const sock = await rawGet(path, key, requestId);
  const chunks: Buffer[] = [];
  const stopped = new Promise<number>((resolve) => {
    const onData = (d: Buffer) => {
      chunks.push(d);
      const parsed = headOf(Buffer.concat(chunks));
      if (!parsed || Buffer.concat(chunks).length <= parsed.bodyAt) return;
      sock.off('data', onData);
      sock.pause();
      resolve(Date.now());
    };
    sock.on('data', onData);
  });
  const rest = async (waitMs = 10_000) => {
    sock.on('data', (d: Buffer) => chunks.push(d));
    sock.resume();
    const closed = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), waitMs);
      sock.once('close', () => {
        clearTimeout(timer);
        resolve(true);
      });
    });
    sock.destroy();
    const raw = Buffer.concat(chunks);
    const { head, bodyAt, length } = headOf(raw)!;
    return { head, received: raw.length - bodyAt, length, closed };
  };
  return { stopped: await stopped, rest };
}

/**
 * A client that reads `burst` bytes, stops reading for `pauseMs` (less than the bound), and so on
 * to the end of the body; it says what it got and how many times it paused.
 */
async function slowClient(path: string, key: string, requestId: string, burst: number, pauseMs: number): Promise<{ head: string; body: Buffer; pauses: number }> {
  const sock = await rawGet(path, key, requestId);
  const chunks: Buffer[] = [];
  let received = 0;
  let parsed: ReturnType<typeof headOf>;
  let sinceBreak = 0;
  let pauses = 0;
  await new Promise<void>((resolve, reject) => {
    sock.on('data', (d: Buffer) => {
      chunks.push(d);
      received += d.length;
      parsed ??= headOf(Buffer.concat(chunks));
      if (parsed && received - parsed.bodyAt >= parsed.length) {
        resolve();
        return;
      }
      sinceBreak += d.length;
      if (sinceBreak < burst) return;
      sinceBreak = 0;
      pauses++;
      sock.pause();
      setTimeout(() => sock.resume(), pauseMs);
    });
    sock.once('close', () => reject(new Error(`the server closed the connection after ${received} bytes`)));
  });
  sock.destroy();
  return { head: parsed!.head, body: Buffer.concat(chunks).subarray(parsed!.bodyAt), pauses };
}

const linesOf = (requestId: string) => server.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.reqId === requestId);

/** The streams the store opened since the spy was set, as the store made them (the filesystem store's ReadStreams). */
function storeReads() {
  const read = vi.spyOn(server.ctx.mediaStore, 'read');
  return () => read.mock.results.map((r) => r.value as Readable & { closed: boolean });
}

describe('a file download whose client stops reading', () => {
  it('is cut off after ten times STREAM_WRITE_IDLE_MS, the store’s read stream closed, and logged once as cut off', async () => {
    const c = await createCustomer(server.db);
    const video = await storedVideo(c.accountId, 16 * 1024 * 1024);
    const reads = storeReads();
    const requestId = `stall-${randomUUID()}`;
    const client = await stallingClient(`/v1/files/${video.id}/content`, c.key, requestId);
    const [stream] = reads();
    expect(reads()).toHaveLength(1);
    // Closed while the client still reads nothing: the server let go of it, not the client.
    await until(() => stream!.closed, 10_000, 'the store’s read stream to close');
    expect(Date.now() - client.stopped).toBeGreaterThanOrEqual(BOUND_MS - 50);
    expect(stream!.destroyed).toBe(true);
    const got = await client.rest();
    expect(got.head).toMatch(/^HTTP\/1\.1 200 /);
    expect(got.length).toBe(video.data.length);
    // Cut short and closed: it would have had the whole file had it gone on reading.
    expect(got.closed).toBe(true);
    expect(got.received).toBeLessThan(got.length);
    await until(() => linesOf(requestId).length >= 2, 5_000, 'the lines of the download');
    expect(linesOf(requestId)).toEqual([
      expect.objectContaining({ level: 40, msg: 'download cut off: its client stopped reading', fileId: video.id, err: `the client took nothing of the answer for ${BOUND_MS} ms and was cut off` }),
      expect.objectContaining({ level: 30, msg: 'client went away before the response ended', status: 200, operation: 'getFileContent' }),
    ]);
    expect(server.logs.filter((l) => l.includes('request failed'))).toEqual([]);
  }, 30_000);

  it('is never cut off while it keeps taking bytes, however long it pauses under the bound: it gets the whole file', async () => {
    const c = await createCustomer(server.db);
    const video = await storedVideo(c.accountId, 16 * 1024 * 1024);
    const started = Date.now();
    const got = await slowClient(`/v1/files/${video.id}/content`, c.key, `slow-${randomUUID()}`, 2 * 1024 * 1024, PAUSE_MS);
    expect(got.head).toMatch(/^HTTP\/1\.1 200 /);
    expect(got.body.equals(video.data)).toBe(true);
    // Far longer than the bound in all: the bound is on a pause, not on the download.
    expect(got.pauses).toBeGreaterThanOrEqual(6);
    expect(Date.now() - started).toBeGreaterThan(2 * BOUND_MS);
  }, 30_000);
});

describe('an image task listing (b64_json images read from the store) whose client stops reading', () => {
  it('is cut off after ten times STREAM_WRITE_IDLE_MS, the store’s read stream closed, and logged once as cut off', async () => {
    const c = await createCustomer(server.db);
    const task = await imageTaskWithLargeImage(c.key, 12 * 1024 * 1024);
    const reads = storeReads();
    const requestId = `stall-${randomUUID()}`;
    const client = await stallingClient('/v1/images', c.key, requestId);
    await until(() => reads().length === 1 && reads()[0]!.closed, 10_000, 'the store’s read stream to close');
    expect(Date.now() - client.stopped).toBeGreaterThanOrEqual(BOUND_MS - 50);
    const got = await client.rest();
    expect(got.head).toMatch(/^HTTP\/1\.1 200 /);
    expect(got.length).toBeGreaterThan((task.data.length * 4) / 3);
    expect(got.closed).toBe(true);
    expect(got.received).toBeLessThan(got.length);
    await until(() => linesOf(requestId).length >= 2, 5_000, 'the lines of the listing');
    expect(linesOf(requestId)).toEqual([
      expect.objectContaining({ level: 40, msg: 'image task listing cut off: its client stopped reading', accountId: c.accountId }),
      expect.objectContaining({ level: 30, msg: 'client went away before the response ended', status: 200, operation: 'listImageTasks' }),
    ]);
    expect(server.logs.filter((l) => l.includes('request failed'))).toEqual([]);
  }, 30_000);

  it('is never cut off while it keeps taking bytes: it gets the whole listing and its image', async () => {
    const c = await createCustomer(server.db);
    const task = await imageTaskWithLargeImage(c.key, 12 * 1024 * 1024);
    const started = Date.now();
    const got = await slowClient('/v1/images', c.key, `slow-${randomUUID()}`, 2 * 1024 * 1024, PAUSE_MS);
    expect(got.head).toMatch(/^HTTP\/1\.1 200 /);
    const page = JSON.parse(got.body.toString('utf8')) as { data: { id: string; data: { b64_json: string }[] }[] };
    expect(page.data.map((t) => t.id)).toEqual([task.taskId]);
    expect(page.data[0]!.data[0]!.b64_json === task.data.toString('base64')).toBe(true);
    expect(got.pauses).toBeGreaterThanOrEqual(6);
    expect(Date.now() - started).toBeGreaterThan(2 * BOUND_MS);
  }, 30_000);
});

describe('pipeBounded', () => {
  /** A source of `count` chunks of 64 KiB, one every `everyMs`, that records its destruction. */
  function source(count: number, everyMs = 0) {
    const chunks = Array.from({ length: count }, () => randomBytes(64 * 1024));
    async function* produce() {
      for (const chunk of chunks) {
        if (everyMs > 0) await new Promise((resolve) => setTimeout(resolve, everyMs));
        yield chunk;
      }
    }
    return { stream: Readable.from(produce(), { objectMode: false }), bytes: Buffer.concat(chunks) };
  }

  /** A writable that keeps what it gets, each write taken after `delayMs` (never, when undefined: a client that stopped reading). */
  function client(delayMs?: number) {
    const got: Buffer[] = [];
    const out = new Writable({
      highWaterMark: 16 * 1024,
      write(chunk: Buffer, _enc, done) {
        if (delayMs === undefined) return;
        got.push(chunk);
        setTimeout(done, delayMs);
      },
    });
    return { out, got: () => Buffer.concat(got) };
  }

  it('destroys a writable whose client takes nothing for idleMs, and the source with it, telling `stalled` once', async () => {
    const src = source(64);
    const { out } = client();
    const stalled = vi.fn();
    const started = Date.now();
    await expect(pipeBounded(src.stream, out, 200, stalled)).rejects.toMatchObject({ code: 'ERR_STREAM_PREMATURE_CLOSE' });
    expect(Date.now() - started).toBeGreaterThanOrEqual(190);
    expect(out.destroyed).toBe(true);
    expect(src.stream.destroyed).toBe(true);
    expect(stalled).toHaveBeenCalledTimes(1);
    expect(stalled.mock.calls[0]![0]).toBeInstanceOf(StalledClient);
  }, 5000);

  it('waits for a client that keeps taking bytes, however slowly, and for a source slower than the bound', async () => {
    // A slow client: each 64 KiB written takes 30 ms, the whole body far longer than idleMs.
    const slowClient = client(30);
    const slowTaker = source(48);
    const stalled = vi.fn();
    const started = Date.now();
    await pipeBounded(slowTaker.stream, slowClient.out, 200, stalled);
    expect(Date.now() - started).toBeGreaterThan(600);
    expect(slowClient.got().equals(slowTaker.bytes)).toBe(true);
    // A slow source: nothing waits for the client between its chunks, which is not the client's stall.
    const fastClient = client(0);
    const slowSource = source(4, 300);
    await pipeBounded(slowSource.stream, fastClient.out, 200, stalled);
    expect(fastClient.got().equals(slowSource.bytes)).toBe(true);
    expect(stalled).not.toHaveBeenCalled();
  }, 10_000);
});
