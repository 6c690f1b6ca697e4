/**
 * A media store that is slow to take a client's bytes (a stalled S3 part upload) holds the body
 * back on the server's side: that time is not the client's idle time. An upload (`POST /v1/files`)
 * and a JSON edit with a data URL whose store stalls for three idle limits are answered as if it
 * had not stalled, not 408 body_timeout; a client that stops sending is still cut off, the idle
 * limit counted from when the store took bytes again.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FilesystemMediaStore } from '../../server/storage/media-store.ts';
import { StallingStore } from '../fakes/media-stores.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { noisePng } from '../support/noise-png.ts';

const IDLE_MS = 500;
const STALL_MS = 3 * IDLE_MS;

let server: TestServer;
let store: StallingStore;
let mediaDir: string;
/** About 4.3 MB that do not compress: far more than the socket and stream buffers hold. */
let png: Buffer;

beforeAll(async () => {
  png = await noisePng(1200, 1200, 7);
  mediaDir = mkdtempSync(join(tmpdir(), 'mg-store-stall-'));
  store = new StallingStore(new FilesystemMediaStore(mediaDir), STALL_MS);
  server = await startTestServer({ env: { BODY_IDLE_TIMEOUT_MS: String(IDLE_MS), MEDIA_DIR: mediaDir }, overrides: { mediaStore: store } });
  await seedCatalog(server.db);
});
afterAll(async () => {
  await server?.close();
  if (mediaDir) rmSync(mediaDir, { recursive: true, force: true, maxRetries: 5 });
});

describe('a media store that stalls while a body is read', () => {
  it('an upload whose store stalls for three idle limits is stored whole (201), not 408', async () => {
    const c = await createCustomer(server.db);
    const stallsBefore = store.stalls;
    const form = new FormData();
    form.append('purpose', 'input');
    form.append('file', new Blob([png], { type: 'image/png' }), 'noise.png');
    const started = Date.now();
    const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    const body = (await res.json()) as Record<string, any>;
    expect([res.status, body.error?.code]).toEqual([201, undefined]);
    expect(store.stalls).toBe(stallsBefore + 1);
    expect(Date.now() - started).toBeGreaterThanOrEqual(STALL_MS);
    expect(body.bytes).toBe(png.length);
    const row = await server.db.selectFrom('files').select(['bytes', 'purpose']).where('id', '=', body.id).executeTakeFirstOrThrow();
    expect(row).toEqual({ bytes: png.length, purpose: 'upload' });
  });

  it('an upload whose last bytes arrive while the store stalls is stored too (201), not 408', async () => {
    // 72 KB: the whole body is taken by the parser's buffers (the request has ended, never paused)
    // while the store still holds the file's first chunk back.
    const c = await createCustomer(server.db);
    const stallsBefore = store.stalls;
    const small = await noisePng(155, 155, 8);
    const form = new FormData();
    form.append('purpose', 'input');
    form.append('file', new Blob([small], { type: 'image/png' }), 'small.png');
    const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    const body = (await res.json()) as Record<string, any>;
    expect([res.status, body.error?.code, body.bytes]).toEqual([201, undefined, small.length]);
    expect(store.stalls).toBe(stallsBefore + 1);
  });

  it('a JSON edit whose data URL the store stalls on for three idle limits is answered 200, not 408', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const stallsBefore = store.stalls;
    const res = await fetch(`${server.directUrl}/v1/images/edits`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'make it red', model: 'local-image-1', images: [`data:image/png;base64,${png.toString('base64')}`] }),
    });
    const body = (await res.json()) as Record<string, any>;
    expect([res.status, body.error?.code]).toEqual([200, undefined]);
    expect(body.data).toHaveLength(1);
    expect(store.stalls).toBe(stallsBefore + 1);
  });

  it('a client that stops sending after the store stalled is still answered 408 body_timeout', async () => {
    const c = await createCustomer(server.db);
    const stallsBefore = store.stalls;
    const url = new URL(server.directUrl);
    const boundary = 'mg-stall';
    const head = `--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ninput\r\n--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\nContent-Type: image/png\r\n\r\n`;
    // Half of the file, then nothing: the body is declared whole but never completed.
    const started = Date.now();
    const answer = await new Promise<string>((resolve) => {
      const socket = connect(Number(url.port), url.hostname, () => {
        socket.write(`POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${c.key}\r\nContent-Type: multipart/form-data; boundary=${boundary}\r\nContent-Length: ${head.length + png.length + 64}\r\n\r\n${head}`);
        socket.write(png.subarray(0, png.length >> 1));
      });
      let received = '';
      socket.on('data', (d: Buffer) => (received += d.toString('latin1')));
      socket.on('error', () => undefined);
      socket.on('close', () => resolve(received));
    });
    expect(answer.split('\r\n')[0]).toBe('HTTP/1.1 408 Request Timeout');
    expect(/"code":"([^"]+)"/.exec(answer)?.[1]).toBe('body_timeout');
    // Not while the store stalled (an idle limit later): the idle limit counts from when it took bytes again.
    expect(Date.now() - started).toBeGreaterThanOrEqual(STALL_MS);
    expect(store.stalls).toBe(stallsBefore + 1);
    expect(await server.db.selectFrom('files').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  });
});

describe('a media store slower than the whole body limit (BODY_TIMEOUT_MS) after the body arrived', () => {
  let slowServer: TestServer;
  let slowStore: StallingStore;
  let dir: string;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'mg-store-stall-total-'));
    slowStore = new StallingStore(new FilesystemMediaStore(dir), 2500);
    slowServer = await startTestServer({ env: { BODY_IDLE_TIMEOUT_MS: '30000', BODY_TIMEOUT_MS: '1000', MEDIA_DIR: dir }, overrides: { mediaStore: slowStore } });
  });
  afterAll(async () => {
    await slowServer?.close();
    if (dir) rmSync(dir, { recursive: true, force: true, maxRetries: 5 });
  });

  it("stores an upload the client sent whole at once (201): the store's time is not the client's", async () => {
    const c = await createCustomer(slowServer.db);
    const small = await noisePng(155, 155, 8);
    const form = new FormData();
    form.append('purpose', 'input');
    form.append('file', new Blob([small], { type: 'image/png' }), 'small.png');
    const res = await fetch(`${slowServer.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    const body = (await res.json()) as Record<string, any>;
    expect([res.status, body.error?.code, body.bytes]).toEqual([201, undefined, small.length]);
    expect(slowStore.stalls).toBe(1);
  });
});
