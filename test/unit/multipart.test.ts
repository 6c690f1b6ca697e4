import { request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express, { type Request, type Response } from 'express';
import * as OpenApiValidator from 'express-openapi-validator';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { errorMiddleware } from '../../server/http/error-middleware.ts';
import { coerceField, DEFAULT_MULTIPART_LIMITS, imageEditMultipart, uploadedFiles, type MultipartLimits } from '../../server/http/multipart.ts';
import { createLogger } from '../../server/logger.ts';
import { loadOpenApiDocument } from '../../server/openapi.ts';

const PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==',
  'base64',
);
const log = createLogger('silent');

interface Echo {
  body: Record<string, unknown>;
  images: { fieldname: string; filename: string; mimeType: string; size: number; first: number }[];
  mask: { fieldname: string; filename: string; size: number } | null;
  filesLength: number | null;
}

function echo(req: Request, res: Response): void {
  const { images, mask } = uploadedFiles(req);
  const files = (req as unknown as { files?: unknown[] }).files;
  res.json({
    body: req.body ?? null,
    images: images.map((f) => ({ fieldname: f.fieldname, filename: f.filename, mimeType: f.mimeType, size: f.buffer.length, first: f.buffer[0] ?? -1 })),
    mask: mask ? { fieldname: mask.fieldname, filename: mask.filename, size: mask.buffer.length } : null,
    filesLength: Array.isArray(files) ? files.length : null,
  });
}

async function listen(app: express.Express): Promise<{ server: Server; url: string }> {
  const server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

function plainApp(limits: Partial<MultipartLimits>): express.Express {
  const app = express();
  app.use(express.json());
  app.post('/edit', imageEditMultipart(limits), echo);
  app.use(errorMiddleware(log));
  return app;
}

function png(fill = 0x89, size = PNG.length): Blob {
  const bytes = size === PNG.length ? Buffer.from(PNG) : Buffer.alloc(size, fill);
  if (size !== PNG.length) bytes[0] = fill;
  return new Blob([bytes], { type: 'image/png' });
}

function form(fields: Record<string, string>, files: [string, Blob, string][] = []): FormData {
  const fd = new FormData();
  for (const [k, v] of Object.entries(fields)) fd.append(k, v);
  for (const [name, blob, filename] of files) fd.append(name, blob, filename);
  return fd;
}

const SMALL: Partial<MultipartLimits> = { maxFileBytes: 64 * 1024, maxTotalBytes: 1024 * 1024 };

describe('imageEditMultipart', () => {
  let server: Server;
  let url: string;
  let close: (() => Promise<void>)[] = [];

  async function start(limits: Partial<MultipartLimits>): Promise<string> {
    const s = await listen(plainApp(limits));
    close.push(() => new Promise((r) => { s.server.closeAllConnections(); s.server.close(() => r()); }));
    return s.url;
  }

  beforeAll(async () => {
    const s = await listen(plainApp(SMALL));
    server = s.server;
    url = s.url;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
    await Promise.all(close.map((c) => c()));
    close = [];
  });

  async function post(fd: FormData | string, headers: Record<string, string> = {}, base = url): Promise<{ status: number; json: any; headers: Headers }> {
    const res = await fetch(`${base}/edit`, { method: 'POST', body: fd, headers });
    return { status: res.status, json: await res.json(), headers: res.headers };
  }

  it('has the documented defaults', () => {
    expect(DEFAULT_MULTIPART_LIMITS).toEqual({
      maxFiles: 16,
      maxFileBytes: 50 * 1024 * 1024,
      maxTotalBytes: 200 * 1024 * 1024,
      maxFields: 64,
      maxFieldBytes: 256 * 1024,
      // BODY_IDLE_TIMEOUT_MS and BODY_TIMEOUT_MS's defaults (app.ts passes the configured ones).
      idleTimeoutMs: 30_000,
      timeoutMs: 900_000,
    });
  });

  it('parses a single `image` file and the text fields', async () => {
    const { status, json } = await post(form({ prompt: 'make it blue', model: 'local-image-1' }, [['image', png(), 'cat.png']]));
    expect(status).toBe(200);
    const e = json as Echo;
    expect(e.body).toEqual({ prompt: 'make it blue', model: 'local-image-1' });
    expect(e.images).toEqual([{ fieldname: 'image', filename: 'cat.png', mimeType: 'image/png', size: PNG.length, first: 0x89 }]);
    expect(e.mask).toBeNull();
    expect(e.filesLength).toBe(1);
  });

  it('keeps repeated `image[]` parts in arrival order', async () => {
    const fd = form({ prompt: 'p', model: 'm' }, [
      ['image[]', png(1, 100), 'a.png'],
      ['image[]', png(2, 200), 'b.png'],
      ['image[]', png(3, 300), 'c.png'],
    ]);
    const { status, json } = await post(fd);
    expect(status).toBe(200);
    expect((json as Echo).images.map((f) => [f.fieldname, f.filename, f.size, f.first])).toEqual([
      ['image[]', 'a.png', 100, 1],
      ['image[]', 'b.png', 200, 2],
      ['image[]', 'c.png', 300, 3],
    ]);
  });

  it('accepts `image_<suffix>` files and keeps the mask apart', async () => {
    const fd = form({ prompt: 'p', model: 'm' }, [
      ['image_1', png(1, 10), 'one.webp'],
      ['mask', png(9, 50), 'mask.png'],
      ['image_2', png(2, 20), 'two.jpg'],
    ]);
    const { status, json } = await post(fd);
    expect(status).toBe(200);
    const e = json as Echo;
    expect(e.images.map((f) => f.fieldname)).toEqual(['image_1', 'image_2']);
    expect(e.mask).toEqual({ fieldname: 'mask', filename: 'mask.png', size: 50 });
    expect(e.filesLength).toBe(2);
  });

  it('coerces integer and boolean fields only when the text is exact', async () => {
    const ok = await post(form({ prompt: 'p', model: 'm', n: '2', output_compression: '80', partial_images: '0', stream: 'true', user: '42' }, [['image', png(), 'a.png']]));
    expect(ok.status).toBe(200);
    expect((ok.json as Echo).body).toEqual({ prompt: 'p', model: 'm', n: 2, output_compression: 80, partial_images: 0, stream: true, user: '42' });

    const raw = await post(form({ prompt: 'p', n: '1.5', output_compression: 'abc', partial_images: '', stream: 'yes' }, [['image', png(), 'a.png']]));
    expect((raw.json as Echo).body).toEqual({ prompt: 'p', n: '1.5', output_compression: 'abc', partial_images: '', stream: 'yes' });

    expect(coerceField('stream', '0')).toBe(false);
    expect(coerceField('stream', '1')).toBe(true);
    expect(coerceField('stream', 'FALSE')).toBe(false);
    expect(coerceField('n', '-3')).toBe(-3);
    expect(coerceField('n', '99999999999999999999')).toBe('99999999999999999999');
    expect(coerceField('model', '7')).toBe('7');
  });

  it('rejects a duplicate text field', async () => {
    const fd = form({ prompt: 'p' }, [['image', png(), 'a.png']]);
    fd.append('prompt', 'again');
    const { status, json } = await post(fd);
    expect(status).toBe(400);
    expect(json.error).toMatchObject({ code: 'invalid_request', param: 'prompt', type: 'invalid_request_error' });
  });

  it('rejects a text part under a file field name', async () => {
    const { status, json } = await post(form({ prompt: 'p', image: 'https://example.com/a.png' }));
    expect(status).toBe(400);
    expect(json.error).toMatchObject({ code: 'invalid_request', param: 'image' });
  });

  it('rejects an unknown file field, naming it', async () => {
    const { status, json } = await post(form({ prompt: 'p' }, [['image', png(), 'a.png'], ['photo', png(), 'b.png']]));
    expect(status).toBe(400);
    expect(json.error).toMatchObject({ code: 'invalid_request', param: 'photo' });
  });

  it('rejects a second mask', async () => {
    const { status, json } = await post(form({ prompt: 'p' }, [['image', png(), 'a.png'], ['mask', png(), 'm.png'], ['mask', png(), 'n.png']]));
    expect(status).toBe(400);
    expect(json.error).toMatchObject({ code: 'invalid_request', param: 'mask' });
  });

  it('leaves files empty when no image is sent', async () => {
    const { status, json } = await post(form({ prompt: 'p', model: 'm' }));
    expect(status).toBe(200);
    expect((json as Echo).images).toEqual([]);
    expect((json as Echo).mask).toBeNull();
  });

  it('accepts 16 images and a mask, rejects a 17th image with too_many_images', async () => {
    const sixteen: [string, Blob, string][] = Array.from({ length: 16 }, (_, i) => ['image[]', png(i, 10), `${i}.png`]);
    const ok = await post(form({ prompt: 'p' }, [...sixteen, ['mask', png(), 'm.png']]));
    expect(ok.status).toBe(200);
    expect((ok.json as Echo).images).toHaveLength(16);
    expect((ok.json as Echo).mask).not.toBeNull();

    const tooMany = await post(form({ prompt: 'p' }, [...sixteen, ['image[]', png(), '17.png']]));
    expect(tooMany.status).toBe(400);
    expect(tooMany.json.error).toMatchObject({ code: 'too_many_images', type: 'invalid_request_error' });

    const mixed = await post(form({ prompt: 'p' }, [...sixteen, ['mask', png(), 'm.png'], ['image_x', png(), 'x.png']]));
    expect(mixed.status).toBe(400);
    expect(mixed.json.error.code).toBe('too_many_images');
  });

  it('honours a configured maxFiles', async () => {
    const base = await start({ maxFiles: 2 });
    const files: [string, Blob, string][] = [['image', png(), 'a.png'], ['image_2', png(), 'b.png'], ['image_3', png(), 'c.png']];
    const { status, json } = await post(form({ prompt: 'p' }, files), {}, base);
    expect(status).toBe(400);
    expect(json.error.code).toBe('too_many_images');
  });

  it('answers 413 media_too_large naming the field of a file over maxFileBytes; a file at the limit passes', async () => {
    const max = SMALL.maxFileBytes!;
    const atLimit = await post(form({ prompt: 'p' }, [['image[]', png(1, max), 'a.png']]));
    expect(atLimit.status).toBe(200);
    expect((atLimit.json as Echo).images[0]?.size).toBe(max);

    const over = await post(form({ prompt: 'p' }, [['image', png(), 'ok.png'], ['image[]', png(1, max + 1), 'big.png']]));
    expect(over.status).toBe(413);
    expect(over.json.error).toMatchObject({ code: 'media_too_large', param: 'image[]', type: 'invalid_request_error' });

    const mask = await post(form({ prompt: 'p' }, [['image', png(), 'ok.png'], ['mask', png(1, max + 1), 'm.png']]));
    expect(mask.status).toBe(413);
    expect(mask.json.error).toMatchObject({ code: 'media_too_large', param: 'mask' });
  });

  it('answers 413 body_too_large for a body over maxTotalBytes', async () => {
    const files: [string, Blob, string][] = Array.from({ length: 20 }, (_, i) => ['image[]', png(i, 60 * 1024), `${i}.png`]);
    const base = await start({ ...SMALL, maxFiles: 30 });
    const { status, json, headers } = await post(form({ prompt: 'p' }, files), {}, base);
    expect(status).toBe(413);
    expect(json.error).toMatchObject({ code: 'body_too_large', param: null });
    expect(headers.get('connection')).toBe('close');
  });

  it('rejects a field over maxFieldBytes and accepts a 32,000-character multi-byte prompt by default', async () => {
    const base = await start({ maxFieldBytes: 1000 });
    const small = await post(form({ prompt: 'x'.repeat(1001) }), {}, base);
    expect(small.status).toBe(400);
    expect(small.json.error).toMatchObject({ code: 'invalid_request', param: 'prompt' });

    const defaults = await start({});
    const prompt = '😀'.repeat(16_000); // 32,000 UTF-16 units, 64 KiB of UTF-8
    const ok = await post(form({ prompt }), {}, defaults);
    expect(ok.status).toBe(200);
    expect((ok.json as Echo).body.prompt).toBe(prompt);
  });

  it('rejects too many fields and malformed bodies with 400', async () => {
    const base = await start({ maxFields: 3 });
    const fields = await post(form({ a: '1', b: '2', c: '3', d: '4' }), {}, base);
    expect(fields.status).toBe(400);
    expect(fields.json.error.code).toBe('invalid_request');

    const noBoundary = await post('x', { 'content-type': 'multipart/form-data' });
    expect(noBoundary.status).toBe(400);
    expect(noBoundary.json.error.code).toBe('invalid_request');

    const truncated = await post('--abc\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nhello', { 'content-type': 'multipart/form-data; boundary=abc' });
    expect(truncated.status).toBe(400);
    expect(truncated.json.error.code).toBe('invalid_request');
  });

  it('passes a non-multipart request through untouched', async () => {
    const res = await fetch(`${url}/edit`, { method: 'POST', body: JSON.stringify({ prompt: 'p', n: '2', images: ['file_1'] }), headers: { 'content-type': 'application/json' } });
    expect(res.status).toBe(200);
    const e = (await res.json()) as Echo;
    expect(e.body).toEqual({ prompt: 'p', n: '2', images: ['file_1'] });
    expect(e.images).toEqual([]);
    expect(e.filesLength).toBeNull();
  });

  /** A multipart body of one file part of `fileBytes` bytes, produced lazily; counts what fetch pulled. */
  function hugeUpload(fileBytes: number, field = 'image') {
    const boundary = 'mediagate-test-boundary';
    const head = Buffer.from(
      `--${boundary}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nhello\r\n` +
        `--${boundary}\r\nContent-Disposition: form-data; name="${field}"; filename="big.png"\r\nContent-Type: image/png\r\n\r\n`,
    );
    const chunk = Buffer.alloc(64 * 1024, 0x42);
    let sent = 0;
    let headSent = false;
    const stream = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (!headSent) {
          headSent = true;
          controller.enqueue(head);
          return;
        }
        if (sent >= fileBytes) {
          controller.enqueue(Buffer.from(`\r\n--${boundary}--\r\n`));
          controller.close();
          return;
        }
        sent += chunk.length;
        controller.enqueue(chunk);
      },
    });
    return { stream, contentType: `multipart/form-data; boundary=${boundary}`, pulled: () => sent };
  }

  /** Streams the upload; `pulled` is how much of the file fetch had taken when the answer came. */
  async function streamedUpload(base: string, fileBytes: number, field?: string) {
    const up = hugeUpload(fileBytes, field);
    const res = await fetch(`${base}/edit`, {
      method: 'POST',
      body: up.stream,
      headers: { 'content-type': up.contentType },
      duplex: 'half',
    } as RequestInit);
    const pulled = up.pulled();
    const json = (await res.json()) as { error: { code: string; param: string | null } };
    return { status: res.status, json, pulled };
  }

  it('answers 413 body_too_large while the client is still streaming 50 MB (chunked)', async () => {
    const base = await start({ maxTotalBytes: 1024 * 1024, maxFileBytes: 100 * 1024 * 1024 });
    const r = await streamedUpload(base, 50 * 1024 * 1024);
    expect(r.status).toBe(413);
    expect(r.json.error.code).toBe('body_too_large');
    expect(r.pulled).toBeLessThan(50 * 1024 * 1024);
    // The server still serves the next request.
    const next = await post(form({ prompt: 'p' }, [['image', png(), 'a.png']]), {}, base);
    expect(next.status).toBe(200);
  });

  it('answers 413 media_too_large for a 50 MB file over maxFileBytes before the client has sent it', async () => {
    const base = await start({ maxTotalBytes: 200 * 1024 * 1024, maxFileBytes: 1024 * 1024 });
    const r = await streamedUpload(base, 50 * 1024 * 1024, 'image_big');
    expect(r.status).toBe(413);
    expect(r.json.error).toMatchObject({ code: 'media_too_large', param: 'image_big' });
    // Answered while the client was still sending the file.
    expect(r.pulled).toBeLessThan(50 * 1024 * 1024);
  });

  it('rejects a declared Content-Length over the limit before reading, and the client gets the answer while writing', async () => {
    const base = await start({ maxTotalBytes: 1024 * 1024 });
    const { port } = new URL(base);
    const declared = 50 * 1024 * 1024;
    const result = await new Promise<{ status: number; body: string; written: number }>((resolve, reject) => {
      let written = 0;
      let done = false;
      const req = httpRequest({
        host: '127.0.0.1',
        port: Number(port),
        method: 'POST',
        path: '/edit',
        headers: { 'content-type': 'multipart/form-data; boundary=zzz', 'content-length': String(declared) },
      });
      const chunk = Buffer.alloc(64 * 1024, 0x41);
      const pump = () => {
        while (!done && written < declared) {
          written += chunk.length;
          if (!req.write(chunk)) {
            req.once('drain', pump);
            return;
          }
        }
      };
      req.on('response', (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (body += d));
        res.on('end', () => {
          done = true;
          resolve({ status: res.statusCode ?? 0, body, written });
          req.destroy();
        });
      });
      req.on('error', (err) => {
        if (!done) reject(err);
      });
      pump();
    });
    expect(result.status).toBe(413);
    expect(JSON.parse(result.body).error.code).toBe('body_too_large');
    // The answer came while the client was still writing the declared body.
    expect(result.written).toBeLessThan(declared);
  });
});

describe('imageEditMultipart with the contract validator', () => {
  let server: Server;
  let url: string;
  const validatorErrors: { path?: string }[] = [];

  beforeAll(async () => {
    const app = express();
    app.use(express.json());
    app.post('/v1/images/edits', imageEditMultipart({}));
    app.use(
      OpenApiValidator.middleware({
        apiSpec: loadOpenApiDocument() as never,
        validateApiSpec: false,
        validateRequests: { allowUnknownQueryParameters: false, removeAdditional: false },
        validateResponses: false,
        validateFormats: true,
        fileUploader: false,
        validateSecurity: false,
      }),
    );
    app.post('/v1/images/edits', echo);
    app.use((err: { errors?: { path?: string }[] }, _req: Request, _res: Response, next: (err: unknown) => void) => {
      if (err.errors?.[0]) validatorErrors.push(err.errors[0]);
      next(err);
    });
    app.use(errorMiddleware(log));
    ({ server, url } = await listen(app));
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  });

  async function post(fd: FormData) {
    const res = await fetch(`${url}/v1/images/edits`, { method: 'POST', body: fd });
    return { status: res.status, json: (await res.json()) as any };
  }

  const files: [string, Blob, string][] = [
    ['image[]', png(), 'a.png'],
    ['image[]', png(), 'b.png'],
    ['image_extra', png(), 'c.png'],
    ['mask', png(), 'm.png'],
  ];

  it('lets a valid request through with the coerced fields', async () => {
    const { status, json } = await post(
      form({ prompt: 'p', model: 'local-image-1', n: '2', stream: 'false', output_compression: '50', output_format: 'webp', size: '1024x1024', aspect_ratio: '16:9' }, files),
    );
    expect(status).toBe(200);
    expect(json.body).toMatchObject({ prompt: 'p', model: 'local-image-1', n: 2, stream: false, output_compression: 50 });
    expect(json.images).toHaveLength(3);
    expect(json.mask).not.toBeNull();
  });

  it('lets the validator name a missing prompt, exactly as for a JSON body', async () => {
    const { status, json } = await post(form({ model: 'local-image-1' }, files));
    expect(status).toBe(400);
    expect(json.error.code).toBe('invalid_request');
    expect(validatorErrors.at(-1)).toMatchObject({ path: '/body/prompt' });
    expect(json.error.param).toBe('prompt');

    const viaJson = await fetch(`${url}/v1/images/edits`, {
      method: 'POST',
      body: JSON.stringify({ model: 'local-image-1', images: ['file_1'] }),
      headers: { 'content-type': 'application/json' },
    });
    expect(viaJson.status).toBe(400);
    expect(((await viaJson.json()) as any).error).toEqual(json.error);
  });

  it('lets the validator reject an uncoercible number and an unknown field', async () => {
    const bad = await post(form({ prompt: 'p', model: 'm', n: 'two' }, files));
    expect(bad.status).toBe(400);
    expect(bad.json.error).toMatchObject({ code: 'invalid_request', param: 'n' });

    const unknown = await post(form({ prompt: 'p', model: 'm', colour: 'red' }, files));
    expect(unknown.status).toBe(400);
    expect(unknown.json.error).toMatchObject({ code: 'invalid_request', param: 'colour' });
  });

  it('still rejects 17 images before the validator', async () => {
    const seventeen: [string, Blob, string][] = Array.from({ length: 17 }, (_, i) => ['image[]', png(), `${i}.png`]);
    const { status, json } = await post(form({ prompt: 'p', model: 'm' }, seventeen));
    expect(status).toBe(400);
    expect(json.error.code).toBe('too_many_images');
  });
});
