/**
 * Upload names and HEAD on downloads: a name the gateway cuts to 255 characters never ends in half
 * an emoji, and control characters in a name (a NUL decoded from `filename*`) become `_`, so both
 * uploads are stored (201) and download under their names; HEAD on both download paths (the key's
 * and a signed URL) answers GET's status and header fields without a body and without reading the
 * store; a method the contract lacks is 405 with `Allow`; a store that cannot be read is a 503
 * whose message does not speak of writing.
 */
import sharp from 'sharp';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { uploadFileName } from '../../server/http/file-upload.ts';
import { StorageUnavailable } from '../../server/storage/storage-error.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let server: TestServer;
let customer: Awaited<ReturnType<typeof createCustomer>>;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
  customer = await createCustomer(server.db, { balance: 100 });
});
afterAll(async () => server?.close());
afterEach(() => vi.restoreAllMocks());

const png = () => sharp({ create: { width: 16, height: 16, channels: 3, background: { r: 1, g: 2, b: 3 } } }).png().toBuffer();

/** POST /v1/files with the file part's Content-Disposition parameters exactly as given (FormData would encode the name itself). */
async function uploadNamed(dispositionParams: string): Promise<{ status: number; body: Json }> {
  const boundary = 'XyZbOuNdArY';
  const body = Buffer.concat([
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ninput\r\n`),
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; ${dispositionParams}\r\nContent-Type: image/png\r\n\r\n`),
    await png(),
    Buffer.from(`\r\n--${boundary}--\r\n`),
  ]);
  const res = await fetch(`${server.directUrl}/v1/files`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${customer.key}`, 'Content-Type': `multipart/form-data; boundary=${boundary}` },
    body,
  });
  return { status: res.status, body: (await res.json()) as Json };
}

const content = (fileId: string, init: RequestInit = {}) =>
  fetch(`${server.directUrl}/v1/files/${fileId}/content`, { ...init, headers: { Authorization: `Bearer ${customer.key}`, ...init.headers } });

describe('upload names', () => {
  it('keeps a 255-character name ending in an emoji whole, cut by characters, and downloads under it', async () => {
    const name = `${'a'.repeat(254)}😀.png`;
    const up = await uploadNamed(`filename*=UTF-8''${encodeURIComponent(name)}`);
    expect(up.status, JSON.stringify(up.body)).toBe(201);
    // 254 + 1 characters: the emoji (two UTF-16 units) stays whole, the extension is cut.
    expect(up.body.filename).toBe(`${'a'.repeat(254)}😀`);
    const res = await content(up.body.id as string);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-disposition')).toBe(`inline; filename="${'a'.repeat(254)}_"; filename*=UTF-8''${'a'.repeat(254)}%F0%9F%98%80`);
    await res.arrayBuffer();
  });

  it('stores a name with a NUL (decoded from filename*) with `_` in its place, and downloads under it', async () => {
    const up = await uploadNamed(`filename*=UTF-8''a%00b%1F%7Fc.png`);
    expect(up.status, JSON.stringify(up.body)).toBe(201);
    expect(up.body.filename).toBe('a_b__c.png');
    const res = await content(up.body.id as string);
    expect(res.headers.get('content-disposition')).toBe('inline; filename="a_b__c.png"');
    await res.arrayBuffer();
  });

  it('drops lone surrogates and cuts at 255 code points, never inside a pair', () => {
    expect(uploadFileName('a\uD800b\uDC00c.png')).toBe('abc.png');
    expect(uploadFileName('x\u0085y\u0000z')).toBe('x_y_z');
    const cut = uploadFileName(`${'a'.repeat(254)}😀😀`);
    expect([...cut]).toHaveLength(255);
    expect(cut.endsWith('a😀')).toBe(true);
    expect(uploadFileName('фото.png')).toBe('фото.png');
  });
});

describe('HEAD on downloads', () => {
  it("answers HEAD on /v1/files/{file_id}/content with GET's header fields, no body, and no read of the store", async () => {
    const up = await uploadNamed('filename="head.png"');
    expect(up.status).toBe(201);
    const read = vi.spyOn(server.ctx.mediaStore, 'read');
    // A Range is ignored on HEAD (RFC 9110 §14.2): the answer describes the whole file.
    const head = await content(up.body.id as string, { method: 'HEAD', headers: { Range: 'bytes=0-9' } });
    expect(head.status).toBe(200);
    expect(Object.fromEntries(['content-length', 'content-type', 'accept-ranges', 'etag', 'cache-control', 'content-disposition'].map((h) => [h, head.headers.get(h)]))).toEqual({
      'content-length': String(up.body.bytes),
      'content-type': 'image/png',
      'accept-ranges': 'bytes',
      etag: `"${up.body.id}"`,
      'cache-control': 'no-store',
      'content-disposition': 'inline; filename="head.png"',
    });
    expect(head.headers.get('last-modified')).toBeTruthy();
    expect((await head.arrayBuffer()).byteLength).toBe(0);
    expect(read).not.toHaveBeenCalled();

    const cached = await content(up.body.id as string, { method: 'HEAD', headers: { 'If-None-Match': `"${up.body.id}"` } });
    expect(cached.status).toBe(304);
    expect(read).not.toHaveBeenCalled();

    const other = await createCustomer(server.db);
    const foreign = await fetch(`${server.directUrl}/v1/files/${up.body.id}/content`, { method: 'HEAD', headers: { Authorization: `Bearer ${other.key}` } });
    expect(foreign.status).toBe(404);
  });

  it('answers HEAD on a signed URL like its GET, and 404 once the URL has expired', async () => {
    const up = await uploadNamed('filename="signed.png"');
    const read = vi.spyOn(server.ctx.mediaStore, 'read');
    const signed = server.ctx.services.files.signedUrl(up.body.id as string);
    const head = await fetch(signed, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(head.headers.get('content-length')).toBe(String(up.body.bytes));
    expect(head.headers.get('accept-ranges')).toBe('bytes');
    expect(head.headers.get('etag')).toBe(`"${up.body.id}"`);
    expect(head.headers.get('cache-control')).toMatch(/^private, max-age=\d+$/);
    expect((await head.arrayBuffer()).byteLength).toBe(0);
    expect(read).not.toHaveBeenCalled();

    // A URL signed two hours ago (for one hour) has expired.
    const files = server.ctx.services.files as unknown as { now: () => number };
    const past = Date.now() - 2 * 3_600_000;
    vi.spyOn(files, 'now').mockReturnValue(past);
    const stale = server.ctx.services.files.signedUrl(up.body.id as string);
    vi.mocked(files.now).mockRestore();
    const expired = await fetch(stale, { method: 'HEAD' });
    expect(expired.status).toBe(404);
    const expiredGet = await fetch(stale);
    expect([expiredGet.status, ((await expiredGet.json()) as Json).error.code]).toEqual([404, 'file_not_found']);
  });

  it('answers HEAD on /v1/files/{file_id} with the key as its GET of the file object, without a body', async () => {
    const up = await uploadNamed('filename="object.png"');
    const res = await fetch(`${server.directUrl}/v1/files/${up.body.id}`, { method: 'HEAD', headers: { Authorization: `Bearer ${customer.key}` } });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect((await res.arrayBuffer()).byteLength).toBe(0);
  });
});

describe('405 and storage errors', () => {
  it('answers a method the contract lacks with 405 and Allow', async () => {
    const up = await uploadNamed('filename="put.png"');
    const put = await content(up.body.id as string, { method: 'PUT', headers: { 'Content-Type': 'application/json' }, body: '{}' });
    expect([put.status, ((await put.json()) as Json).error.code]).toEqual([405, 'method_not_allowed']);
    expect(put.headers.get('allow')).toBe('GET, HEAD');
    const patch = await fetch(`${server.directUrl}/v1/files/${up.body.id}`, { method: 'PATCH', headers: { Authorization: `Bearer ${customer.key}`, 'Content-Type': 'application/json' }, body: '{}' });
    expect(patch.status).toBe(405);
    expect(patch.headers.get('allow')).toBe('GET, HEAD, DELETE');
    await patch.arrayBuffer();
  });

  it('says the store is unavailable, not that it cannot be written, when a download cannot read it', async () => {
    const up = await uploadNamed('filename="eio.png"');
    vi.spyOn(server.ctx.mediaStore, 'stat').mockRejectedValueOnce(new StorageUnavailable('key', Object.assign(new Error('EIO: i/o error, stat'), { code: 'EIO', syscall: 'stat' })));
    const res = await content(up.body.id as string);
    const body = (await res.json()) as Json;
    expect([res.status, body.error.code, res.headers.get('retry-after')]).toEqual([503, 'storage_unavailable', '30']);
    expect(body.error.message).toMatch(/^The gateway's media storage is unavailable right now/);
    expect(body.error.message).not.toMatch(/written/);
  });
});
