/**
 * With ALLOW_PRIVATE_TARGETS (development, on-premises), a media URL input may be plain http:// to
 * this machine, as a callback_url may (README): a local test server's or a local gateway's links
 * fed back in. Plain http:// anywhere else is still refused before any connection.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { randomUUID } from 'node:crypto';
import sharp from 'sharp';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
let images: Server;
let png: Buffer;
let fetched = 0;
beforeAll(async () => {
  png = await sharp({ create: { width: 64, height: 64, channels: 3, background: '#224466' } }).png().toBuffer();
  images = createServer((_req, res) => {
    fetched++;
    res.writeHead(200, { 'content-type': 'image/png', 'content-length': png.length });
    res.end(png);
  });
  await new Promise<void>((resolve) => images.listen(0, '127.0.0.1', resolve));
  server = await startTestServer({ env: { ALLOW_PRIVATE_TARGETS: '1' } });
  await seedCatalog(server.db);
});
afterAll(async () => {
  await server?.close();
  await new Promise((resolve) => images?.close(resolve));
});

const video = (firstFrame: string) => ({ client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', firstFrame });

async function create(key: string, body: unknown) {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as { error?: { code: string; message: string; param: string } } };
}

it('fetches a plain http:// media URL on this machine', async () => {
  const c = await createCustomer(server.db, { balance: 10 });
  const { port } = images.address() as AddressInfo;
  const created = await create(c.key, video(`http://127.0.0.1:${port}/frame.png`));
  expect(created.status).toBe(202);
  expect(fetched).toBe(1);
});

it('refuses plain http:// to any other host, before connecting, and says what is accepted', async () => {
  const c = await createCustomer(server.db, { balance: 10 });
  const refused = await create(c.key, video('http://10.0.0.5/frame.png'));
  expect(refused.status).toBe(400);
  expect(refused.body.error).toMatchObject({ code: 'invalid_media_url', param: 'firstFrame' });
  const wrong = await create(c.key, video('ftp://127.0.0.1/frame.png'));
  expect(wrong.body.error).toMatchObject({
    code: 'invalid_data_url',
    message: "'firstFrame' must be a base64 image data URL (data:image/png;base64,...), a file id (file_...) or an https URL (or http:// to this machine).",
  });
});
