import { randomBytes } from 'node:crypto';
import { Readable, Writable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { describe, expect, it } from 'vitest';
import { Base64Bytes, Base64Source, CORKED_BYTES, jsonParts, jsonPartsLength, jsonStream, writeJsonParts } from '../../server/lib/base64-json.ts';

/** A writable that keeps what it gets, accepting `highWaterMark` bytes before asking for a drain, slowly. */
function sink(highWaterMark = 16 * 1024, delayMs = 0) {
  const chunks: Buffer[] = [];
  let drains = 0;
  const out = new Writable({
    highWaterMark,
    write(chunk: Buffer, _enc, done) {
      chunks.push(chunk);
      if (delayMs > 0) setTimeout(done, delayMs);
      else setImmediate(done);
    },
  });
  out.on('drain', () => drains++);
  return { out, text: () => Buffer.concat(chunks).toString('utf8'), drains: () => drains };
}

/** The body as the plain JSON it stands for (every Base64Bytes as its base64 string). */
function plain(value: unknown): string {
  return JSON.stringify(value, (_k, v: unknown) => (v instanceof Base64Bytes ? v.bytes.toString('base64') : v));
}

describe('base64 JSON (images written without their base64 strings)', () => {
  const big = randomBytes(3 * 64 * 1024 * 2 + 7); // over two slices, not a multiple of 3
  const body = {
    created: 1,
    data: [
      { b64_json: new Base64Bytes(big), revised_prompt: 'a "quoted" prompt with \u0000mg-b64- inside and ünïcödé' },
      { b64_json: new Base64Bytes(Buffer.alloc(0)) },
      { b64_json: new Base64Bytes(randomBytes(1)) },
      { url: 'https://example.com/x.png' },
    ],
    ...Object.fromEntries(Array.from({ length: 12 }, (_, i) => [`k${i}`, new Base64Bytes(randomBytes(i))])),
    size: '1024x1024',
  };

  it('writes exactly the JSON the body stands for, and says its length', async () => {
    const parts = jsonParts(body);
    expect(parts.media).toHaveLength(15);
    const s = sink();
    await writeJsonParts(s.out, parts);
    expect(s.text()).toBe(plain(body));
    expect(jsonPartsLength(parts)).toBe(Buffer.byteLength(plain(body)));
    expect(JSON.parse(s.text()).data[0].b64_json).toBe(big.toString('base64'));
  });

  it('frames a body between a prefix and a suffix (SSE) and handles a body without images', async () => {
    const s = sink();
    await writeJsonParts(s.out, jsonParts({ type: 'x', b64_json: new Base64Bytes(big) }), 'event: x\ndata: ', '\n\n');
    await writeJsonParts(s.out, jsonParts({ type: 'error' }), 'event: error\ndata: ', '\n\n');
    expect(s.text()).toBe(`event: x\ndata: ${plain({ type: 'x', b64_json: new Base64Bytes(big) })}\n\nevent: error\ndata: {"type":"error"}\n\n`);
  });

  it('waits for the writable to drain instead of queueing the whole image', async () => {
    const s = sink(8 * 1024, 1);
    const writing = writeJsonParts(s.out, jsonParts({ b64_json: new Base64Bytes(big) }));
    // Queued at most one slice past what a frame may hold back while corked, at any time.
    let most = 0;
    const sampler = setInterval(() => (most = Math.max(most, s.out.writableLength)), 0);
    most = s.out.writableLength;
    await writing;
    clearInterval(sampler);
    expect(most).toBeGreaterThan(0);
    expect(most).toBeLessThanOrEqual(CORKED_BYTES + 4 * 64 * 1024 + 64);
    expect(s.drains()).toBeGreaterThan(0);
    expect(JSON.parse(s.text()).b64_json).toBe(big.toString('base64'));
  });

  it('a body or event of up to CORKED_BYTES reaches the writable as one write; a larger one in several', async () => {
    const writes: number[] = [];
    const out = new Writable({
      writev(chunks, done) {
        writes.push(chunks.length);
        setImmediate(done);
      },
      write(_chunk, _enc, done) {
        writes.push(1);
        setImmediate(done);
      },
    });
    // An SSE frame: prefix + JSON text, one image's base64, the rest of the JSON + the blank line.
    await writeJsonParts(out, jsonParts({ type: 'x', b64_json: new Base64Bytes(randomBytes(100 * 1024)), n: 1 }), 'event: x\ndata: ', '\n\n');
    expect(writes).toEqual([3]);
    writes.length = 0;
    await writeJsonParts(out, jsonParts({ b64_json: new Base64Bytes(randomBytes(1024 * 1024)) }));
    expect(writes.length).toBeGreaterThan(1);
    expect(out.writableCorked).toBe(0);
  });

  it('rejects when the writable goes away mid-body', async () => {
    const s = sink(1024, 5);
    const writing = writeJsonParts(s.out, jsonParts({ b64_json: new Base64Bytes(randomBytes(4 * 1024 * 1024)) }));
    setTimeout(() => s.out.destroy(), 10);
    await expect(writing).rejects.toThrow();
  });
});

describe('jsonStream (upstream request bodies with inputs streamed into them)', () => {
  /** A source that hands out `bytes` in chunks of `chunk` bytes (odd sizes: base64 must join across them), counting opens and the largest chunk. */
  function source(bytes: Buffer, chunk: number) {
    const stats = { opens: 0 };
    const src = new Base64Source(() => {
      stats.opens++;
      return Readable.from((function* () {
        for (let at = 0; at < bytes.length; at += chunk) yield bytes.subarray(at, at + chunk);
      })());
    }, bytes.length);
    return { src, stats };
  }

  it('writes exactly the JSON with each source as its base64 string, says its length, and opens each source once per body', async () => {
    const a = randomBytes(100_003);
    const b = randomBytes(2);
    const first = source(a, 7);
    const second = source(b, 1);
    const value = { instances: [{ prompt: 'q"uote', image: { bytesBase64Encoded: first.src, mimeType: 'image/png' } }], refs: [second.src], n: 1 };
    const { body, length } = jsonStream(value);
    const text = (await buffer(body)).toString('utf8');
    expect(JSON.parse(text)).toEqual({ instances: [{ prompt: 'q"uote', image: { bytesBase64Encoded: a.toString('base64'), mimeType: 'image/png' } }], refs: [b.toString('base64')], n: 1 });
    expect(Buffer.byteLength(text)).toBe(length);
    expect([first.stats.opens, second.stats.opens]).toEqual([1, 1]);
    // A second body (a retry on another member) reads the sources again.
    await buffer(jsonStream(value).body);
    expect([first.stats.opens, second.stats.opens]).toEqual([2, 2]);
  });

  it('fails the body when a source is shorter than it said', async () => {
    const short = new Base64Source(() => Readable.from([Buffer.from('abc')]), 4);
    await expect(buffer(jsonStream({ x: short }).body)).rejects.toThrow(/3 bytes where 4 were expected/);
  });

  it('produces the base64 while the source is read: never more than a chunk ahead of it', async () => {
    const chunk = 64 * 1024;
    let read = 0;
    const total = 64 * chunk;
    const src = new Base64Source(
      () =>
        new Readable({
          read() {
            if (read >= total) return this.push(null);
            read += chunk;
            this.push(Buffer.alloc(chunk, 1));
          },
        }),
      total,
    );
    const { body } = jsonStream({ data: src });
    let written = 0;
    let maxAhead = 0;
    for await (const part of body) {
      written += (part as Buffer).length;
      maxAhead = Math.max(maxAhead, read - (written * 3) / 4);
    }
    expect(written).toBeGreaterThan((total * 4) / 3);
    // The source is read a few chunks (the streams' buffers) ahead of what was written, not whole.
    expect(maxAhead).toBeLessThan(total / 8);
  });
});
