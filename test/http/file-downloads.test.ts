/**
 * Downloads of stored files and the log they leave (issue 26, item 5): every finished response gets
 * one access-log line, a client that closes its connection the moment it has every byte is not an
 * error, and a client that goes away in the middle is logged as what it is (info, with the bytes
 * sent), never as a failed request.
 */
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

let server: TestServer;
let fileUrl: URL;
let expected: Buffer;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
  const c = await createCustomer(server.db);
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'local-image-1', prompt: 'a harbour at night', resolution: '2K', aspectRatio: '1:1', output_format: 'png', response_format: 'url' }),
  });
  expect(res.status).toBe(200);
  fileUrl = new URL(((await res.json()) as { data: { url: string }[] }).data[0]!.url);
  expected = Buffer.from(await (await fetch(fileUrl)).arrayBuffer());
  expect(expected.length).toBeGreaterThan(256 * 1024);
});
afterAll(async () => server?.close());

/**
 * GET over a raw socket that is destroyed as soon as `stopAfter` body bytes arrived (default: the
 * whole body, as a client that trusts Content-Length does), with a request id to find its log lines.
 */
function download(requestId: string, stopAfter?: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const socket = connect(Number(fileUrl.port), fileUrl.hostname);
    let head: Buffer | undefined;
    let length = Number.POSITIVE_INFINITY;
    const chunks: Buffer[] = [];
    let got = 0;
    let raw = Buffer.alloc(0);
    socket.on('connect', () => socket.write(`GET ${fileUrl.pathname}${fileUrl.search} HTTP/1.1\r\nHost: ${fileUrl.host}\r\nX-Request-Id: ${requestId}\r\n\r\n`));
    socket.on('data', (d: Buffer) => {
      if (!head) {
        raw = Buffer.concat([raw, d]);
        const end = raw.indexOf('\r\n\r\n');
        if (end < 0) return;
        head = raw.subarray(0, end);
        length = Number(/content-length: (\d+)/i.exec(head.toString())?.[1]);
        d = raw.subarray(end + 4);
      }
      chunks.push(d);
      got += d.length;
      if (got >= Math.min(length, stopAfter ?? Number.POSITIVE_INFINITY)) {
        socket.destroy();
        resolve(Buffer.concat(chunks));
      }
    });
    socket.on('error', reject);
  });
}

const linesOf = (requestId: string) => server.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.reqId === requestId || l.requestId === requestId);

describe('file downloads', () => {
  it('logs 40 back-to-back downloads by clients that close at the last byte as 40 finished requests, and nothing as failed', async () => {
    for (let i = 0; i < 40; i++) expect((await download(`dl-${i}`)).equals(expected)).toBe(true);
    // A request's line is written when the server sees its end, which may come after the client's last byte.
    await until(() => Array.from({ length: 40 }, (_, i) => linesOf(`dl-${i}`).length > 0).every(Boolean), 5_000, 'a line of every download');
    for (let i = 0; i < 40; i++) {
      const lines = linesOf(`dl-${i}`);
      expect(lines).toEqual([expect.objectContaining({ msg: 'request', level: 30, status: 200, operation: 'getFile' })]);
    }
    expect(server.logs.filter((l) => l.includes('request failed') || l.includes('ERR_STREAM_PREMATURE_CLOSE'))).toEqual([]);
  });

  it('logs a client that goes away in the middle once, at info, with the bytes it was sent', async () => {
    const part = await download('dl-gone', 64 * 1024);
    expect(part.length).toBeLessThan(expected.length);
    await until(() => linesOf('dl-gone').length > 0, 5_000, 'the line of the download');
    const lines = linesOf('dl-gone');
    expect(lines).toEqual([expect.objectContaining({ msg: 'client went away before the response ended', level: 30, status: 200, operation: 'getFile', bytesSent: expect.any(Number) })]);
    const sent = lines[0]!.bytesSent as number;
    expect(sent).toBeGreaterThanOrEqual(64 * 1024);
    expect(sent).toBeLessThan(expected.length);
    expect(server.logs.filter((l) => l.includes('request failed'))).toEqual([]);
  });
});

describe('ranges and validators of a download', () => {
  /** The signed URL through the contract lane's proxy when it runs (so the answers are checked against the contract). */
  const viaContract = () => `${server.baseUrl}${fileUrl.pathname}${fileUrl.search}`;

  it('sends ETag, Last-Modified, Accept-Ranges and Content-Disposition, and 304 for a current copy', async () => {
    const whole = await fetch(viaContract());
    expect(whole.status).toBe(200);
    const etag = whole.headers.get('etag')!;
    expect(etag).toBe(`"${fileUrl.pathname.split('/').at(-1)}"`);
    expect(whole.headers.get('accept-ranges')).toBe('bytes');
    expect(new Date(whole.headers.get('last-modified')!).getTime()).toBeGreaterThan(0);
    expect(whole.headers.get('content-disposition')).toMatch(/^inline; filename="file_\w+\.png"$/);
    await whole.arrayBuffer();
    const again = await fetch(viaContract(), { headers: { 'If-None-Match': etag } });
    expect(again.status).toBe(304);
    expect((await again.arrayBuffer()).byteLength).toBe(0);
  });

  it('answers one byte range with 206 and Content-Range, from the start, the middle and the end', async () => {
    const size = expected.length;
    for (const [header, start, end] of [
      ['bytes=0-99', 0, 99],
      [`bytes=1000-${size + 50}`, 1000, size - 1],
      ['bytes=-500', size - 500, size - 1],
      // A suffix longer than the file is the whole file (RFC 9110 §14.1.3), not 416.
      [`bytes=-${size + 1000}`, 0, size - 1],
    ] as const) {
      const checked = await fetch(viaContract(), { headers: { Range: header } });
      expect([checked.status, checked.headers.get('content-range')]).toEqual([206, `bytes ${start}-${end}/${size}`]);
      await checked.arrayBuffer();
      // The bytes from the server itself (the contract lane's proxy re-encodes binary bodies).
      const res = await fetch(fileUrl, { headers: { Range: header } });
      expect(Number(res.headers.get('content-length'))).toBe(end - start + 1);
      expect(Buffer.from(await res.arrayBuffer()).equals(expected.subarray(start, end + 1))).toBe(true);
    }
  });

  it('answers 416 for a range outside the file, and the whole file for several ranges or a stale If-Range', async () => {
    const outside = await fetch(viaContract(), { headers: { Range: `bytes=${expected.length + 10}-` } });
    expect(outside.status).toBe(416);
    expect(outside.headers.get('content-range')).toBe(`bytes */${expected.length}`);
    expect(((await outside.json()) as { error: { code: string } }).error.code).toBe('range_not_satisfiable');
    // Several ranges, adjacent, overlapping or partly outside the file too: the whole file, never one merged range.
    for (const ranges of ['bytes=0-9,100-109', 'bytes=0-9,10-19', 'bytes=0-9,5-30', `bytes=0-9,${expected.length + 10}-${expected.length + 20}`]) {
      const several = await fetch(fileUrl, { headers: { Range: ranges } });
      expect([ranges, several.status]).toEqual([ranges, 200]);
      expect(Buffer.from(await several.arrayBuffer()).length).toBe(expected.length);
    }
    // A current copy is 304 whatever its Range asks (the precondition comes first, RFC 9110 §13.2.2).
    const etag = `"${fileUrl.pathname.split('/').at(-1)}"`;
    const current = await fetch(fileUrl, { headers: { Range: `bytes=${expected.length + 10}-`, 'If-None-Match': etag } });
    expect(current.status).toBe(304);
    await current.arrayBuffer();
    const stale = await fetch(fileUrl, { headers: { Range: 'bytes=0-9', 'If-Range': '"file_another"' } });
    expect(stale.status).toBe(200);
    await stale.arrayBuffer();
  });
});
