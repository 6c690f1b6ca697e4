/**
 * A body sent where no credential was checked before it is never read: JSON is parsed only for the
 * body methods (POST, PUT, PATCH) under /v1, /api/v1 and /admin, whose credentials are checked
 * before the body. A GET or DELETE of the API, /healthz or an unknown path carrying an unfinished
 * (gzip) JSON body is answered at once, from its head: it was read, inflated and parsed first, so
 * an anonymous client held about 1 MiB of the server per 1 KiB it sent, for up to 16 minutes.
 */
import { connect, type Socket } from 'node:net';
import { constants, createGzip } from 'node:zlib';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
const sockets: Socket[] = [];
beforeAll(async () => {
  server = await startTestServer({});
});
afterAll(async () => {
  for (const s of sockets) s.destroy();
  await server?.close();
});

/** Sends the head and a flushed, unfinished gzip stream of 1,000 KiB of JSON whitespace; returns what the server answers. */
async function stalledBody(method: string, path: string): Promise<() => string> {
  const url = new URL(server.directUrl);
  const gz = createGzip();
  const parts: Buffer[] = [];
  gz.on('data', (c: Buffer) => parts.push(c));
  gz.write(Buffer.alloc(1000 * 1024, 0x20));
  await new Promise<void>((resolve) => gz.flush(constants.Z_SYNC_FLUSH, () => resolve()));
  const body = Buffer.concat(parts);
  const socket = connect(Number(url.port), url.hostname);
  sockets.push(socket);
  let answer = '';
  socket.on('data', (d) => (answer += d.toString()));
  socket.on('error', () => undefined);
  await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
  socket.write(`${method} ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n`);
  socket.write(`${body.length.toString(16)}\r\n`);
  socket.write(body);
  socket.write('\r\n');
  return () => answer.split('\r\n')[0] ?? '';
}

it.each([
  ['GET', '/v1/credits', '401'],
  ['DELETE', '/v1/files/file_abc', '401'],
  ['GET', '/admin/v1/accounts', '401'],
  ['GET', '/healthz', '200'],
  ['POST', '/healthz', '40'],
  ['POST', '/nothing-here', '404'],
])('answers %s %s from its head, without reading the anonymous body', async (method, path, status) => {
  const answered = await stalledBody(method, path);
  await expect.poll(answered, { timeout: 5_000 }).toMatch(new RegExp(`^HTTP/1.1 ${status}`));
});

it('refuses an anonymous body method of the API before its body, as before', async () => {
  const answered = await stalledBody('POST', '/v1/images/generations');
  // No credentials: refused before the body, as before.
  await expect.poll(answered, { timeout: 5_000 }).toMatch(/^HTTP\/1.1 401/);
});
