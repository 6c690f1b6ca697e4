/**
 * downloadOutput (providers/kit/output-download.ts) and the checks of `contentOf` on what a result
 * link answers with 200: only an ISO base media file (MP4) is handed on, as video/mp4; a text, JSON
 * or XML answer, other bytes, or no bytes are retryable download failures. Over real HTTP.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downloadOutput } from '../../server/providers/kit/output-download.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import { providerErrorOf } from '../support/api-error.ts';

const mp4 = (brand: string) => Buffer.concat([Buffer.from([0, 0, 0, 0x18]), Buffer.from(`ftyp${brand}`, 'latin1'), Buffer.alloc(3000, 9)]);

/** path → [content type, body, chunk size]: the body is sent in chunks of that size. */
const ANSWERS: Record<string, [string, Buffer, number?]> = {
  '/video.mp4': ['video/mp4', mp4('isom')],
  '/dribbled.mp4': ['video/mp4', mp4('mp42'), 3],
  '/movie.mov': ['application/octet-stream', mp4('qt  ')],
  '/untyped': ['', mp4('iso5')],
  '/page': ['text/html; charset=utf-8', Buffer.from('<html><script>alert(1)</script></html>')],
  '/plain': ['text/plain', Buffer.from('expired')],
  '/error': ['application/json', Buffer.from('{"error":"expired"}')],
  '/problem': ['application/problem+json', Buffer.from('{"title":"gone"}')],
  '/s3-error': ['application/xml', Buffer.from('<Error><Code>AccessDenied</Code></Error>')],
  '/blob': ['application/octet-stream', Buffer.alloc(64, 7)],
  '/short': ['video/mp4', Buffer.from('ftyp')],
  '/empty': ['video/mp4', Buffer.alloc(0)],
};

let server: Server;
let base = '';
let closed = 0;
beforeAll(async () => {
  server = createServer((req, res) => {
    if (req.url === '/endless.mp4') {
      // A large video still arriving: the test gives up on it.
      res.writeHead(200, { 'content-type': 'video/mp4' });
      res.write(mp4('isom'));
      const more = setInterval(() => res.write(Buffer.alloc(16 * 1024)), 5);
      res.once('close', () => {
        clearInterval(more);
        closed++;
      });
      return;
    }
    const [type, body, chunk] = ANSWERS[req.url!]!;
    res.writeHead(200, { ...(type && { 'content-type': type }), 'content-length': String(body.length) });
    if (!chunk) return void res.end(body);
    let at = 0;
    const next = () => (at >= body.length ? res.end() : res.write(body.subarray(at, (at += chunk)), () => setImmediate(next)));
    next();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => {
  server.closeAllConnections();
  server.close();
});

const never = new AbortController().signal;
const download = (path: string) => downloadOutput(`${base}${path}`, never, { upstreamError: async (res) => new ProviderError('retryable', `HTTP ${res.status}`) });

async function read(stream: Readable): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

describe('downloadOutput: what a result link answers with 200', () => {
  it.each(['/video.mp4', '/dribbled.mp4', '/movie.mov', '/untyped'])('%s: an ISO media file (any brand, whatever the type said) is handed on whole as video/mp4', async (path) => {
    const content = await download(path);
    expect([content.contentType, content.bytes]).toEqual(['video/mp4', ANSWERS[path]![1].length]);
    expect((await read(content.stream)).equals(ANSWERS[path]![1])).toBe(true);
  });

  it.each([
    ['/page', 'text/html'],
    ['/plain', 'text/plain'],
    ['/error', 'application/json'],
    ['/problem', 'application/problem+json'],
    ['/s3-error', 'application/xml'],
  ])('%s: a %s answer is refused at once as a retryable failure', async (path, type) => {
    const err = await providerErrorOf(download(path));
    expect([err.kind, err.message]).toEqual(['retryable', `the upstream video download answered ${type}, not a video`]);
  });

  it.each([
    ['/blob', 'the upstream video download answered something other than an MP4 video'],
    ['/short', 'the upstream video download answered something other than an MP4 video'],
    ['/empty', 'the upstream video download answered no bytes'],
  ])('%s: the stream fails as a retryable download before it hands on a byte', async (path, message) => {
    const content = await download(path);
    const handed: Buffer[] = [];
    content.stream.on('data', (chunk: Buffer) => handed.push(chunk));
    const err = await providerErrorOf(new Promise((resolve, reject) => content.stream.once('error', reject).once('end', resolve)));
    expect([err.kind, err.message]).toEqual(['retryable', message]);
    expect(handed).toEqual([]);
  });

  it('closes the upstream connection when the stream handed on is destroyed (the store refused it)', async () => {
    const content = await download('/endless.mp4');
    await new Promise((resolve) => content.stream.once('data', resolve));
    content.stream.destroy();
    await expect.poll(() => closed).toBe(1);
  });
});
