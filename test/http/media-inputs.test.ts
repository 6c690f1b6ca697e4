/**
 * Large media inputs through the public API (design §7, §9): video creation and JSON edits are read
 * as a stream, data URLs go to the media store while they arrive, and the limits hold while reading
 * (exact limit passes, one more byte or input fails at once); a truncated, invalid, dripping or
 * abandoned body leaves no file and no hold; uploads (POST /v1/files) are reusable by id, by their
 * owner only, until they expire; https URL inputs are fetched SSRF-safely with size and time limits.
 * Memory under large bodies is measured by `npm run bench -- bigbody`, not here.
 */
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { TEST_CA, startHttpsReceiver, type HttpsReceiver } from '../support/tls.ts';
import { accountState, until } from '../support/tasks.ts';
import { noisePng } from '../support/noise-png.ts';

type Json = Record<string, any>;
let server: TestServer;
let receiver: HttpsReceiver;
let imageA: Buffer;
let imageB: Buffer; // imageA and imageB fill the byte limit exactly
let LIMIT: number;
/** Requests to /hang are never answered. */
const dns: Record<string, string> = { 'receiver.test': '127.0.0.1', 'internal.example': '10.0.0.7' };


beforeAll(async () => {
  imageA = await noisePng(120, 100, 1);
  imageB = await noisePng(120, 100, 2);
  LIMIT = imageA.length + imageB.length;
  receiver = await startHttpsReceiver((req, res) => {
    const path = req.path.split('?')[0];
    if (path === '/hang') return; // never answered
    if (path === '/a.png') {
      res.writeHead(200, { 'content-type': 'image/png', 'content-length': imageA.length });
      return void res.end(imageA);
    }
    if (path === '/big.png') {
      res.writeHead(200, { 'content-type': 'image/png' }); // chunked: no length to refuse early
      return void res.end(Buffer.concat([imageA, imageA, imageA]));
    }
    if (path === '/redirect-ok') {
      res.writeHead(302, { location: '/a.png' });
      return void res.end();
    }
    if (path === '/redirect-private') {
      res.writeHead(302, { location: `https://internal.example:${receiver.port}/a.png` });
      return void res.end();
    }
    res.writeHead(404);
    res.end();
  });
  server = await startTestServer({
    env: {
      MAX_MEDIA_INPUT_BYTES: String(LIMIT),
      MAX_MEDIA_INPUT_COUNT: '4',
      BODY_IDLE_TIMEOUT_MS: '400',
      BODY_TIMEOUT_MS: '2500',
      MEDIA_URL_TIMEOUT_MS: '600',
      UPLOAD_MAX_BYTES: String(LIMIT),
      EDIT_MAX_FILE_BYTES: String(imageA.length),
    },
    overrides: {
      outboundFetch: {
        ca: TEST_CA,
        // The loopback receiver plays a public host; internal.example is a private one.
        treatAsPublic: ['127.0.0.1'],
        resolve: async (host) => {
          const address = dns[host];
          if (!address) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
          return [{ address, family: 4 }];
        },
      },
    },
  });
  await seedCatalog(server.db);
});
afterAll(async () => {
  await server?.close();
  await receiver?.close();
});

const dataUrl = (buf: Buffer) => `data:image/png;base64,${buf.toString('base64')}`;
const video = (extra: Json = {}) => ({ client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', ...extra });

async function post(key: string, path: string, payload: unknown) {
  const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(payload) });
  return { status: res.status, body: (await res.json()) as Json };
}

async function upload(key: string, file: Buffer, fields: Record<string, string> = { purpose: 'input' }, name = 'frame.png') {
  const form = new FormData();
  for (const [k, v] of Object.entries(fields)) form.append(k, v);
  form.append('file', new Blob([file], { type: 'image/png' }), name);
  const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: form });
  return { status: res.status, body: (await res.json()) as Json };
}

/** Input files of the account that no task adopted. */
const strayInputs = (accountId: string) =>
  server.db.selectFrom('files').select(['id', 'storageKey']).where('accountId', '=', accountId).where('purpose', '=', 'input').where('taskId', 'is', null).execute();

/** Asserts that nothing of a request that created no task is left: no stray input, no hold, no task. */
async function expectNothingLeft(c: { accountId: string; apiKeyId: string }) {
  await until(async () => (await strayInputs(c.accountId)).length === 0, 3000, 'stray inputs to be removed');
  const state = await accountState(server.db, c.accountId, c.apiKeyId);
  expect([state.tasks, state.holds.length]).toEqual([0, 0]);
}

/**
 * A raw POST whose body is written by `write` (which may stall, drip or stop); resolves with the
 * status and body of the answer, or 'closed' when the connection ended without one.
 */
function rawPost(key: string, path: string, headers: Record<string, string | number>, write: (req: ReturnType<typeof request>) => void | Promise<void>) {
  const url = new URL(`${server.directUrl}${path}`);
  return new Promise<{ status: number; body: Json; at: number } | 'closed'>((resolve) => {
    const req = request({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString() || '{}') as Json, at: Date.now() }));
      res.on('error', () => resolve('closed'));
    });
    req.on('error', () => resolve('closed'));
    void write(req);
  });
}

describe('media limits while the body is read', () => {
  it('accepts media inputs of exactly maxMediaInputBytes and refuses one byte more with 413 media_total_too_large', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const exact = await post(c.key, '/v1/videos/generations', video({ referenceImages: [dataUrl(imageA), dataUrl(imageB)] }));
    expect(exact.status).toBe(202);
    const over = await post(c.key, '/v1/videos/generations', video({ referenceImages: [dataUrl(imageA), dataUrl(Buffer.concat([imageB, Buffer.from([0])]))] }));
    expect([over.status, over.body.error.code, over.body.error.param]).toEqual([413, 'media_total_too_large', 'referenceImages[1]']);
    // The accepted task adopted its inputs (kept for its lifetime, a day and INPUT_RETENTION_DAYS); the refused request left nothing.
    const task = await server.db.selectFrom('videoTasks').select(['id', 'inputFileIds']).where('accountId', '=', c.accountId).executeTakeFirstOrThrow();
    const inputs = await server.db.selectFrom('files').select(['taskId', 'expiresAt', 'bytes', 'contentType', 'width']).where('id', 'in', task.inputFileIds).execute();
    expect(inputs).toEqual([
      { taskId: task.id, expiresAt: expect.any(Date), bytes: imageA.length, contentType: 'image/png', width: 120 },
      { taskId: task.id, expiresAt: expect.any(Date), bytes: imageB.length, contentType: 'image/png', width: 120 },
    ]);
    const kept = (server.config.taskMaxLifetimeSeconds + 86_400) * 1000 + server.config.inputRetentionDays * 86_400_000;
    for (const input of inputs) expect(Math.abs(input.expiresAt!.getTime() - (Date.now() + kept))).toBeLessThan(60_000);
    await until(async () => (await strayInputs(c.accountId)).length === 0, 3000, 'stray inputs to be removed');
  });

  it('accepts exactly maxMediaInputCount inputs and refuses one more, counting reference videos too', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const tiny = await noisePng(16, 16, 2);
    const four = await post(c.key, '/v1/videos/generations', video({ referenceImages: [dataUrl(tiny), dataUrl(tiny), dataUrl(tiny), dataUrl(tiny)] }));
    expect(four.status).toBe(202);
    const five = await post(c.key, '/v1/videos/generations', video({ referenceImages: Array(5).fill(dataUrl(tiny)) }));
    expect([five.status, five.body.error.code, five.body.error.param]).toEqual([413, 'too_many_media_inputs', 'referenceImages[4]']);
    const mixed = await post(c.key, '/v1/videos/generations', video({ referenceImages: Array(3).fill(dataUrl(tiny)), reference_videos: ['https://example.com/a.mp4', 'https://example.com/b.mp4'] }));
    expect([mixed.status, mixed.body.error.code]).toEqual([413, 'too_many_media_inputs']);
    await until(async () => (await strayInputs(c.accountId)).length === 0, 3000, 'stray inputs to be removed');
  });

  it('answers 413 as soon as the limit is passed, without waiting for the rest of the body', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const json = Buffer.from(JSON.stringify(video({ firstFrame: dataUrl(Buffer.concat([imageA, imageA, imageA])) })));
    let sentAll = false;
    const answer = await rawPost(c.key, '/v1/videos/generations', { 'Content-Length': json.length + 1_000_000 }, (req) => {
      req.write(json.subarray(0, json.length - 10)); // past the limit, then the client stalls
      setTimeout(() => {
        sentAll = true;
        req.destroy();
      }, 1500);
    });
    expect(answer).not.toBe('closed');
    expect(sentAll).toBe(false);
    const { status, body } = answer as { status: number; body: Json };
    expect([status, body.error.code]).toEqual([413, 'media_total_too_large']);
    await expectNothingLeft(c);
  });

  it('refuses invalid base64 in the middle of a data URL with 400 invalid_data_url, leaving nothing', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const b64 = imageA.toString('base64');
    const broken = `data:image/png;base64,${b64.slice(0, 4000)}*${b64.slice(4001)}`;
    const res = await post(c.key, '/v1/videos/generations', video({ referenceImages: [dataUrl(imageA), broken] }));
    expect([res.status, res.body.error.code, res.body.error.param]).toEqual([400, 'invalid_data_url', 'referenceImages[1]']);
    await expectNothingLeft(c);
  });

  it('a truncated body (the client closes before Content-Length bytes) leaves no file and no hold', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const json = Buffer.from(JSON.stringify(video({ firstFrame: dataUrl(imageA) })));
    const answer = await rawPost(c.key, '/v1/videos/generations', { 'Content-Length': json.length }, (req) => {
      req.write(json.subarray(0, Math.floor(json.length * 0.8)));
      setTimeout(() => req.destroy(), 200);
    });
    expect(answer).toBe('closed');
    await expectNothingLeft(c);
  });

  it('a body that ends inside a data URL is 400 invalid_json, leaving nothing', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const json = JSON.stringify(video({ firstFrame: dataUrl(imageA) }));
    const res = await fetch(`${server.directUrl}/v1/videos/generations`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' }, body: json.slice(0, json.length / 2) });
    expect([res.status, ((await res.json()) as Json).error.code]).toEqual([400, 'invalid_json']);
    await expectNothingLeft(c);
  });

  it('cuts off a body that stalls (idle) or drips (total) with 408 body_timeout', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const json = Buffer.from(JSON.stringify(video({ firstFrame: dataUrl(imageA) })));
    const stalled = await rawPost(c.key, '/v1/videos/generations', { 'Content-Length': json.length }, (req) => void req.write(json.subarray(0, 5000)));
    expect(stalled !== 'closed' && [stalled.status, stalled.body.error.code]).toEqual([408, 'body_timeout']);
    const drips = 100;
    expect(json.length).toBeGreaterThan(drips * 100); // the drips never complete the body
    let written = 0;
    const dripped = await rawPost(c.key, '/v1/videos/generations', { 'Content-Length': json.length }, async (req) => {
      for (let i = 0; i < drips && !req.destroyed; i++) {
        req.write(json.subarray(i * 100, (i + 1) * 100)); // 100 bytes every 150 ms: never idle for 400 ms
        written++;
        await new Promise((r) => setTimeout(r, 150));
      }
    });
    const writtenWhenAnswered = written;
    expect(dripped !== 'closed' && [dripped.status, dripped.body.error.code]).toEqual([408, 'body_timeout']);
    // Cut off while still dripping (by the total limit): the idle limit alone would answer only
    // once the drips stop.
    expect(writtenWhenAnswered).toBeLessThan(drips);
    await expectNothingLeft(c);
  });

  it('cuts off a multipart image edit that stalls or drips the same way (it holds a share of the large-body budget others wait for)', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const boundary = 'mediagateTestBoundary';
    const body = Buffer.concat([
      Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nlocal-image-1\r\n--${boundary}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nadd a hat\r\n`),
      Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\nContent-Type: image/png\r\n\r\n`),
      imageA,
      Buffer.from(`\r\n--${boundary}--\r\n`),
    ]);
    const headers = { 'Content-Type': `multipart/form-data; boundary=${boundary}`, 'Content-Length': body.length };
    const stalled = await rawPost(c.key, '/v1/images/edits', headers, (req) => void req.write(body.subarray(0, 300)));
    expect(stalled !== 'closed' && [stalled.status, stalled.body.error.code]).toEqual([408, 'body_timeout']);
    const dripped = await rawPost(c.key, '/v1/images/edits', headers, async (req) => {
      for (let i = 0; i * 20 < body.length - 1 && !req.destroyed; i++) {
        req.write(body.subarray(i * 20, Math.min((i + 1) * 20, body.length - 1))); // never idle for 400 ms, never complete
        await new Promise((r) => setTimeout(r, 150));
      }
    });
    expect(dripped !== 'closed' && [dripped.status, dripped.body.error.code]).toEqual([408, 'body_timeout']);
    await expectNothingLeft(c);
  });

  it('a client that goes away mid-body leaves no file and no hold', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const json = Buffer.from(JSON.stringify(video({ referenceImages: [dataUrl(imageA), dataUrl(imageA)] })));
    await rawPost(c.key, '/v1/videos/generations', { 'Content-Length': json.length }, (req) => {
      req.write(json.subarray(0, Math.floor(json.length * 0.75))); // the first image is complete and stored
      setTimeout(() => req.destroy(), 150);
    });
    await expectNothingLeft(c);
  });

  it('holds the per-file limit of JSON edits while reading (413 media_too_large)', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await post(c.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'x', images: [dataUrl(Buffer.concat([imageA, Buffer.from([0])]))] });
    expect([res.status, res.body.error.code, res.body.error.param]).toEqual([413, 'media_too_large', 'images[0]']);
    const ok = await post(c.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'x', images: [dataUrl(imageA)], response_format: 'url' });
    expect(ok.status).toBe(200);
  });
});

describe('POST /v1/files: reusable inputs', () => {
  it('uploads an image once and uses it by id in video creation and in an image edit', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const up = await upload(c.key, imageA, { purpose: 'input', 'expires_after[anchor]': 'created_at', 'expires_after[seconds]': '7200' });
    expect(up.status).toBe(201);
    expect(up.body).toMatchObject({ object: 'file', purpose: 'input', filename: 'frame.png', bytes: imageA.length, content_type: 'image/png', width: 120, height: 100 });
    expect(Date.parse(up.body.expires_at) - Date.parse(up.body.created_at)).toBeGreaterThan(7_190_000);
    const created = await post(c.key, '/v1/videos/generations', video({ firstFrame: up.body.id }));
    expect(created.status).toBe(202);
    const task = await server.db.selectFrom('videoTasks').select('inputFileIds').where('id', '=', created.body.id).executeTakeFirstOrThrow();
    expect(task.inputFileIds).toEqual([up.body.id]);
    // The task pins the upload past its own lifetime (1 h default + a day).
    const row = await server.db.selectFrom('files').select(['expiresAt', 'taskId']).where('id', '=', up.body.id).executeTakeFirstOrThrow();
    expect(row.taskId).toBeNull();
    expect(row.expiresAt!.getTime() - Date.now()).toBeGreaterThan(86_400_000);
    const edit = await post(c.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'x', images: [up.body.id], response_format: 'url' });
    expect(edit.status).toBe(200);
  });

  it("is the owner's only: another account's id is 404 file_not_found, in video creation and in edits", async () => {
    const owner = await createCustomer(server.db, { balance: 100 });
    const other = await createCustomer(server.db, { balance: 100 });
    const up = await upload(owner.key, imageA);
    const res = await post(other.key, '/v1/videos/generations', video({ lastFrame: up.body.id, firstFrame: dataUrl(imageA) }));
    expect([res.status, res.body.error.code, res.body.error.param]).toEqual([404, 'file_not_found', 'lastFrame']);
    const edit = await post(other.key, '/v1/images/edits', { model: 'local-image-1', prompt: 'x', images: [up.body.id] });
    expect([edit.status, edit.body.error.code]).toEqual([404, 'file_not_found']);
    const unknown = await post(owner.key, '/v1/videos/generations', video({ firstFrame: 'file_doesnotexist' }));
    expect([unknown.status, unknown.body.error.code]).toEqual([404, 'file_not_found']);
    await expectNothingLeft(other);
  });

  it('an expired upload cannot be used, and the sweeper removes its row and bytes', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const up = await upload(c.key, imageA);
    const row = await server.db.selectFrom('files').select('storageKey').where('id', '=', up.body.id).executeTakeFirstOrThrow();
    const path = join(server.config.mediaDir, row.storageKey);
    expect(existsSync(path)).toBe(true);
    await server.db.updateTable('files').set({ expiresAt: new Date(Date.now() - 1000) }).where('id', '=', up.body.id).execute();
    const res = await post(c.key, '/v1/videos/generations', video({ firstFrame: up.body.id }));
    expect([res.status, res.body.error.code]).toEqual([404, 'file_not_found']);
    expect(await server.ctx.mediaSweeper.sweepExpired()).toBeGreaterThanOrEqual(1);
    expect(await server.db.selectFrom('files').select('id').where('id', '=', up.body.id).executeTakeFirst()).toBeUndefined();
    expect(existsSync(path)).toBe(false);
  });

  it('refuses a file that is not an image, one over the size limit, and bad fields, storing nothing', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const notImage = await upload(c.key, Buffer.from('hello, not an image'));
    expect([notImage.status, notImage.body.error.code]).toEqual([400, 'invalid_image']);
    const tooBig = await upload(c.key, Buffer.concat([imageA, imageA, Buffer.from([1])]));
    expect([tooBig.status, tooBig.body.error.code]).toEqual([413, 'media_too_large']);
    const purpose = await upload(c.key, imageA, { purpose: 'fine-tune' });
    expect([purpose.status, purpose.body.error.code, purpose.body.error.param]).toEqual([400, 'invalid_request', 'purpose']);
    const expiry = await upload(c.key, imageA, { purpose: 'input', 'expires_after[seconds]': '60' });
    expect([expiry.status, expiry.body.error.code]).toEqual([400, 'invalid_expires_after']);
    const noFile = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: (() => { const f = new FormData(); f.append('purpose', 'input'); return f; })() });
    expect([noFile.status, ((await noFile.json()) as Json).error.param]).toEqual([400, 'file']);
    await until(async () => (await server.db.selectFrom('files').select('id').where('accountId', '=', c.accountId).execute()).length === 0, 3000, 'refused uploads to be removed');
  });
});

describe('https URL inputs', () => {
  const url = (path: string, host = 'receiver.test') => `https://${host}:${receiver.port}${path}`;

  it('fetches an https image (following a redirect) and stores it as the task input', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await post(c.key, '/v1/videos/generations', video({ firstFrame: url('/redirect-ok') }));
    expect(res.status).toBe(202);
    const task = await server.db.selectFrom('videoTasks').select('inputFileIds').where('id', '=', res.body.id).executeTakeFirstOrThrow();
    const file = await server.db.selectFrom('files').select(['bytes', 'taskId', 'contentType']).where('id', '=', task.inputFileIds[0]!).executeTakeFirstOrThrow();
    expect(file).toEqual({ bytes: imageA.length, taskId: res.body.id, contentType: 'image/png' });
  });

  it('refuses a URL over the byte budget with 413, whether or not the server says its length', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const chunked = await post(c.key, '/v1/videos/generations', video({ firstFrame: url('/big.png') }));
    expect([chunked.status, chunked.body.error.code, chunked.body.error.param]).toEqual([413, 'media_total_too_large', 'firstFrame']);
    // With one image staged, a second one the size of the rest fits exactly; a third does not.
    const exact = await post(c.key, '/v1/videos/generations', video({ referenceImages: [dataUrl(imageB), url('/a.png')] }));
    expect(exact.status).toBe(202);
    const over = await post(c.key, '/v1/videos/generations', video({ referenceImages: [dataUrl(imageA), url('/a.png'), url('/a.png')] }));
    expect([over.status, over.body.error.code]).toEqual([413, 'media_total_too_large']);
  });

  it('refuses private targets, directly or through a redirect, before connecting to them', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const before = receiver.requests.length;
    for (const target of [url('/a.png', 'internal.example'), `https://10.0.0.7:${receiver.port}/a.png`, `https://127.0.0.2:${receiver.port}/a.png`, 'https://localhost./a.png']) {
      const res = await post(c.key, '/v1/videos/generations', video({ firstFrame: target }));
      expect([target, res.status, res.body.error.code]).toEqual([target, 400, 'invalid_media_url']);
    }
    expect(receiver.requests.length).toBe(before);
    const redirected = await post(c.key, '/v1/videos/generations', video({ firstFrame: url('/redirect-private') }));
    expect([redirected.status, redirected.body.error.code]).toEqual([400, 'invalid_media_url']);
    // The name the redirect went to and what kind of address it has; never the address (an internal name's, the operator's).
    expect(redirected.body.error.message).toContain("'internal.example' resolves to a non-public address");
    expect(redirected.body.error.message).not.toContain('private');
    expect(redirected.body.error.message).not.toMatch(/10\.0\.0\.7/);
    // Only the first hop reached the (public) receiver.
    expect(receiver.requests.slice(before).map((r) => r.path)).toEqual(['/redirect-private']);
    await expectNothingLeft(c);
  });

  it('gives up on a URL that does not answer in time, or answers an error, with 400 media_url_unavailable', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    // The receiver never answers /hang: an answer at all is MEDIA_URL_TIMEOUT_MS at work.
    const hung = await post(c.key, '/v1/videos/generations', video({ firstFrame: url('/hang') }));
    expect([hung.status, hung.body.error.code]).toEqual([400, 'media_url_unavailable']);
    const missing = await post(c.key, '/v1/videos/generations', video({ firstFrame: url('/missing.png') }));
    expect([missing.status, missing.body.error.code]).toEqual([400, 'media_url_unavailable']);
    expect(missing.body.error.message).toMatch(/HTTP 404/);
    const unresolvable = await post(c.key, '/v1/videos/generations', video({ firstFrame: url('/a.png', 'nowhere.example') }));
    expect([unresolvable.status, unresolvable.body.error.code]).toEqual([400, 'media_url_unavailable']);
    await expectNothingLeft(c);
  });
});
