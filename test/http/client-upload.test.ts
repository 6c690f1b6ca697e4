/**
 * The TypeScript client's `uploadFile` against the real server: a file on disk (`fs.openAsBlob`,
 * read as it is sent) becomes a stored input that an edit names by id; the expiry option reaches
 * the server; a refusal is returned as a `MediagateError` and not sent again; an upload refused
 * with `429 too_many_in_flight` (the key's four uploads in flight) is sent again after its
 * `Retry-After` and stored once.
 */
import { mkdtempSync, openAsBlob, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { createMediagateClient } from '../../clients/typescript/index.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

let server: TestServer;
let dir: string;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
  dir = mkdtempSync(join(tmpdir(), 'mediagate-client-upload-'));
});
afterAll(async () => {
  await server?.close();
  rmSync(dir, { recursive: true, force: true });
});

async function pngFile(name: string, width: number, height: number): Promise<string> {
  const path = join(dir, name);
  writeFileSync(path, await sharp({ create: { width, height, channels: 3, background: { r: 20, g: 120, b: 200 } } }).png().toBuffer());
  return path;
}

async function countFiles(accountId: string): Promise<number> {
  const row = await server.db.selectFrom('files').select((eb) => eb.fn.countAll<string>().as('n')).where('accountId', '=', accountId).executeTakeFirstOrThrow();
  return Number(row.n);
}

describe('uploadFile', () => {
  it('uploads a file from disk, with its name and expiry; an edit then names it by id', async () => {
    const c = await createCustomer(server.db);
    const mg = createMediagateClient({ baseUrl: server.directUrl, apiKey: c.key });
    const path = await pngFile('first-frame.png', 96, 64);

    const uploaded = await mg.uploadFile(await openAsBlob(path, { type: 'image/png' }), { expiresAfterSeconds: 7_200 });
    if (uploaded.error) throw uploaded.error;
    expect(uploaded.data).toMatchObject({ object: 'file', purpose: 'input', filename: 'upload', content_type: 'image/png', width: 96, height: 64, task_id: null });
    const created = Date.parse(uploaded.data.created_at);
    expect(Math.abs(Date.parse(uploaded.data.expires_at!) - created - 7_200_000)).toBeLessThan(1_000);

    const named = await mg.uploadFile(await openAsBlob(path), { filename: 'frame one.png' });
    if (named.error) throw named.error;
    // No type on the Blob: the server tells the image by its bytes.
    expect(named.data).toMatchObject({ filename: 'frame one.png', content_type: 'image/png' });
    expect(Math.abs(Date.parse(named.data.expires_at!) - Date.parse(named.data.created_at) - 7 * 86_400_000)).toBeLessThan(1_000); // the server's default

    const edit = await mg.api.POST('/v1/images/edits', { body: { model: 'local-image-1', prompt: 'Make the sky orange', images: [uploaded.data.id] } });
    expect(edit.response.status).toBe(200);
    expect(edit.data && 'data' in edit.data ? edit.data.data : undefined).toHaveLength(1);
  });

  it('returns a refusal as a MediagateError and does not send it again', async () => {
    const c = await createCustomer(server.db);
    let sent = 0;
    const mg = createMediagateClient({ baseUrl: server.directUrl, apiKey: c.key, fetch: (r) => ((sent += 1), fetch(r)) });
    // 400s are no passing failures: answered once, nothing stored.

    const notAnImage = await mg.uploadFile(new Blob(['this is not a picture']), { filename: 'notes.txt' });
    expect(notAnImage.error).toMatchObject({ name: 'MediagateError', status: 400, code: 'invalid_image' });
    expect(notAnImage.error?.requestId).toMatch(/\S/);
    const tooShort = await mg.uploadFile(await openAsBlob(await pngFile('short.png', 8, 8)), { expiresAfterSeconds: 60 });
    expect(tooShort.error).toMatchObject({ status: 400, code: 'invalid_expires_after' });
    expect(sent).toBe(2);
    // A refused upload's bytes and row go once its answer is out (not before it): nothing is kept.
    await until(async () => (await countFiles(c.accountId)) === 0, 5_000, 'the refused uploads removed');
  });

  it('sends again after the Retry-After of 429 too_many_in_flight, and the file is stored once', async () => {
    const c = await createCustomer(server.db);
    // The uploads of this account whose file part the server has begun storing.
    const saving = new Set<string>();
    const files = server.ctx.services.files;
    const save = files.save.bind(files);
    files.save = (input, data, opts) => {
      if (input.accountId === c.accountId) saving.add(input.filename ?? '');
      return save(input, data, opts);
    };
    onTestFinished(() => void Reflect.deleteProperty(files, 'save'));
    const url = new URL(server.directUrl);
    // Four uploads of the key in flight: a 1 MB body declared, its file part begun, then held.
    const boundary = 'held-upload-boundary';
    const held = Array.from({ length: 4 }, (_, i) => {
      const req = request({
        host: url.hostname,
        port: url.port,
        method: 'POST',
        path: '/v1/files',
        agent: false,
        headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': `multipart/form-data; boundary=${boundary}`, 'Content-Length': '1000000' },
      });
      req.on('error', () => undefined);
      req.write(`--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ninput\r\n--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="held-${i}.png"\r\nContent-Type: image/png\r\n\r\n\x89PNG`);
      return req;
    });
    onTestFinished(() => held.forEach((h) => h.destroy()));
    // Held once the four have begun storing their file parts.
    await until(() => saving.size === 4, 10_000, 'the four held uploads storing');
    const statuses: number[] = [];
    const sentAt: number[] = [];
    const mg = createMediagateClient({
      baseUrl: server.directUrl,
      apiKey: c.key,
      fetch: async (r) => {
        sentAt.push(Date.now());
        const res = await fetch(r);
        statuses.push(res.status);
        // Once the client was refused, the held uploads' clients leave, which gives their places back.
        if (res.status === 429) for (const h of held) h.destroy();
        return res;
      },
    });
    const path = await pngFile('after-wait.png', 32, 32);
    const result = await mg.uploadFile(await openAsBlob(path));
    if (result.error) throw result.error;
    expect(statuses).toEqual([429, 201]);
    expect(sentAt[1]! - sentAt[0]!).toBeGreaterThanOrEqual(950); // Retry-After: 1
    expect(await countFiles(c.accountId)).toBe(1);
  });
});
