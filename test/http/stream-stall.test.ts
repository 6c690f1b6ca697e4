/**
 * A client that stops reading its image stream (an app sent to the background, or on purpose)
 * while keeping its socket open: Node has no write timeout, so without a bound the stream's next
 * frame waited for a 'drain' that never came, inside the task's upstream call — the task stayed
 * `processing`, its lease kept alive, its member's slot and its credits held for as long as the
 * socket stayed open. With STREAM_WRITE_IDLE_MS the stalled client is cut off as one that left:
 * the images whose events reached its socket are charged, the rest released, and the member (one
 * slot) serves the next request. The same bound cuts off a JSON answer carrying images (the
 * synchronous answer, written while its task settles, and GET /v1/images/{task_id}) whose client
 * reads none of it: its socket, its images' bytes and its request are not held for as long.
 */
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Base64Bytes, jsonParts, StalledClient, writeJsonParts } from '../../server/lib/base64-json.ts';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';
import { IMAGE_PRO, addUpstreamMember } from '../support/upstreams.ts';

let server: TestServer;
let fake: OpenAIImagesFake;

beforeAll(async () => {
  // Noise images weigh what photos do (MBs of base64 per event): four of them fill the socket's buffers.
  fake = await startOpenAIImagesFake({ apiKeys: ['sk-a'], texture: 'noise' });
  server = await startTestServer({ env: { STREAM_WRITE_IDLE_MS: '1000', IMAGE_CAPACITY_WAIT_MS: '1000' } });
  await seedCatalog(server.db, [IMAGE_PRO]);
});

afterAll(async () => {
  await server?.close();
  await fake?.close();
});

/** The body of a chunked HTTP response as far as it arrived (its last chunk may be cut short). */
function dechunk(raw: Buffer): string {
  let at = raw.indexOf('\r\n\r\n') + 4;
  const body: Buffer[] = [];
  while (at < raw.length) {
    const eol = raw.indexOf('\r\n', at);
    if (eol < 0) break;
    const size = parseInt(raw.subarray(at, eol).toString('latin1'), 16);
    if (!size) break;
    body.push(raw.subarray(eol + 2, Math.min(raw.length, eol + 2 + size)));
    at = eol + 2 + size + 2;
  }
  return Buffer.concat(body).toString('utf8');
}

it('a client that stops reading its stream is cut off: the images it got are charged, the rest released, the member slot freed', async () => {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  await addUpstreamMember(server.db, server.secretKey, {
    groupId: group.id,
    provider: 'openai',
    baseUrl: `${fake.url}/v1`,
    credentials: { api_key: 'sk-a' },
    models: [IMAGE_PRO.id],
    modelMap: { [IMAGE_PRO.id]: 'gpt-image-1.5' },
    concurrencyLimit: 1,
  });
  const stalling = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  const other = await createApiKey(server.db, { accountId: account.id, groupId: group.id });

  // A raw client: it reads until it holds its first image's `completed` event, then stops reading, socket open.
  const body = JSON.stringify({ model: IMAGE_PRO.id, prompt: 'a lighthouse', size: '1024x1024', n: 4, stream: true });
  const url = new URL(server.directUrl);
  const sock = net.connect(Number(url.port), url.hostname);
  await new Promise((resolve) => sock.once('connect', resolve));
  const chunks: Buffer[] = [];
  const firstImage = new Promise<void>((resolve) => {
    const onData = (d: Buffer) => {
      chunks.push(d);
      if (!/event: image_generation\.completed\ndata: [^\n]*\n\n/.test(dechunk(Buffer.concat(chunks)))) return;
      sock.off('data', onData);
      sock.pause();
      resolve();
    };
    sock.on('data', onData);
  });
  sock.write(`POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${stalling.key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  await firstImage;
  const head = Buffer.concat(chunks).toString('latin1');
  const taskId = /\r\nx-task-id: (\S+)\r\n/i.exec(head)![1]!;

  // Cut off after STREAM_WRITE_IDLE_MS: the task ends (it stayed `processing` for as long as the socket was open).
  const task = await until(
    async () => {
      const row = await server.db.selectFrom('imageTasks').selectAll().where('id', '=', taskId).executeTakeFirstOrThrow();
      return row.status !== 'processing' && row;
    },
    20_000,
    'the stalled stream’s task to end',
  );
  const unit = IMAGE_PRO.prices[0]!.unitPrice;
  expect(task.status).toBe('completed');
  expect(task.delivered).toBeGreaterThanOrEqual(1);
  expect(task.delivered).toBeLessThan(4);
  expect(task.actualCredits).toBe(task.delivered * unit);
  expect(await holdOf(server.db, taskId)).toEqual({ amount: 4 * unit, status: 'captured', captured: task.delivered * unit });

  // What reached the client's socket before it was closed: exactly the charged images' events, whole.
  sock.resume();
  sock.on('data', (d: Buffer) => chunks.push(d));
  await new Promise((resolve) => sock.once('close', resolve));
  const frames = dechunk(Buffer.concat(chunks)).split('\n\n').slice(0, -1);
  expect(frames.every((f) => f.startsWith('event: image_generation.completed\ndata: '))).toBe(true);
  expect(frames).toHaveLength(task.delivered);

  // The member's one slot is free: another key's request is served.
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${other.key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: IMAGE_PRO.id, prompt: 'another', size: '1024x1024', response_format: 'url' }),
  });
  expect(res.status, await res.clone().text()).toBe(200);
  expect(((await res.json()) as { data: unknown[] }).data).toHaveLength(1);
}, 60_000);

/** The server's access-log lines for `path` that say its client went away before the answer ended. */
const cutLines = (path: string) =>
  server.logs.filter((l) => {
    const line = JSON.parse(l) as { msg?: string; path?: string };
    return line.msg === 'client went away before the response ended' && line.path === path;
  }).length;

/**
 * Sends `request` for `path` on a raw socket that reads nothing (its buffers fill, the server's
 * writes wait) until the server has ended the answer, as its access log says (at most `maxStallMs`),
 * then reads what comes until the server's close arrives, or for at most `waitMs`. Waiting for the
 * server's own record rather than a fixed time: under load the answer may start late, and a client
 * that read before the bound ran out would drain the socket and get it whole. `stalledMs`: from the
 * request sent to the cut.
 */
async function stalledRequest(request: string, path: string, maxStallMs: number, waitMs = 5000): Promise<{ head: string; body: Buffer; closed: boolean; stalledMs: number }> {
  const url = new URL(server.directUrl);
  const cutsBefore = cutLines(path);
  const sock = net.connect(Number(url.port), url.hostname);
  await new Promise((resolve) => sock.once('connect', resolve));
  const sent = Date.now();
  sock.write(request);
  await until(async () => cutLines(path) > cutsBefore || undefined, maxStallMs, `the server to cut off the answer to ${path}`);
  const stalledMs = Date.now() - sent;
  const chunks: Buffer[] = [];
  sock.on('data', (d: Buffer) => chunks.push(d));
  const closed = await new Promise<boolean>((resolve) => {
    const timer = setTimeout(() => resolve(false), waitMs);
    sock.once('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
  sock.destroy();
  const raw = Buffer.concat(chunks);
  const end = raw.indexOf('\r\n\r\n');
  return { head: raw.subarray(0, end).toString('latin1'), body: raw.subarray(end + 4), closed, stalledMs };
}

const contentLength = (head: string) => Number(/\r\ncontent-length: (\d+)/i.exec(head)![1]);

describe('a JSON answer carrying images whose client reads none of it', () => {
  it('is cut off after ten times STREAM_WRITE_IDLE_MS: the synchronous answer (charged once its task settled) and the task lookup alike', async () => {
    const account = await createAccount(server.db, { balance: 100 });
    const group = await createGroup(server.db);
    await addUpstreamMember(server.db, server.secretKey, { groupId: group.id, provider: 'openai', baseUrl: `${fake.url}/v1`, credentials: { api_key: 'sk-a' }, models: [IMAGE_PRO.id], modelMap: { [IMAGE_PRO.id]: 'gpt-image-1.5' } });
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    const body = JSON.stringify({ model: IMAGE_PRO.id, prompt: 'a lighthouse', size: '1024x1024', n: 4, response_format: 'b64_json' });
    const settled = () =>
      until(
        () => server.db.selectFrom('imageTasks').selectAll().where('apiKeyId', '=', key.id).where('status', '!=', 'processing').executeTakeFirst(),
        20_000,
        'the task to settle',
      );
    const answer = await stalledRequest(
      `POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key.key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      '/v1/images/generations',
      40_000,
    );
    expect(answer.head).toMatch(/^HTTP\/1\.1 200 /);
    // Cut short and closed, where it would have waited for the client for as long as it kept its socket open;
    // not before ten times STREAM_WRITE_IDLE_MS (1 s here) of waiting for it.
    expect(answer.stalledMs).toBeGreaterThanOrEqual(9_900);
    expect(answer.closed).toBe(true);
    expect(answer.body.length).toBeLessThan(contentLength(answer.head));
    // Settled before the answer's last byte, as an answer whose client leaves while its task settles.
    const task = await settled();
    expect(task).toMatchObject({ status: 'completed', delivered: 4 });

    // The lookup that carries the same images: cut off too.
    const lookup = await stalledRequest(`GET /v1/images/${task.id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key.key}\r\n\r\n`, `/v1/images/${task.id}`, 40_000);
    expect(lookup.head).toMatch(/^HTTP\/1\.1 200 /);
    expect(lookup.stalledMs).toBeGreaterThanOrEqual(9_900);
    expect(lookup.closed).toBe(true);
    expect(lookup.body.length).toBeLessThan(contentLength(lookup.head));
    // A client that reads gets them whole.
    const res = await fetch(`${server.directUrl}/v1/images/${task.id}`, { headers: { Authorization: `Bearer ${key.key}` } });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { data: unknown[] }).data).toHaveLength(4);
  }, 90_000);
});

describe('writeJsonParts under WriteLimits', () => {
  /** A writable whose writes never complete: a socket whose client stopped reading. */
  const stuck = () => new Writable({ highWaterMark: 16 * 1024, write: () => undefined });

  it('a client that takes nothing for idleMs is cut off (StalledClient, the writable destroyed), waiting for a drain or for the last write', async () => {
    for (const size of [2 * 1024 * 1024, 1024]) {
      const out = stuck();
      const started = Date.now();
      await expect(writeJsonParts(out, jsonParts({ b64_json: new Base64Bytes(randomBytes(size)) }), '', '', { idleMs: 100 })).rejects.toBeInstanceOf(StalledClient);
      expect(Date.now() - started).toBeGreaterThanOrEqual(90);
      expect(out.destroyed).toBe(true);
    }
  }, 5000);

  it('a client that keeps reading, however slowly, is not: the bound is on each wait, not on the whole answer', async () => {
    const chunks: Buffer[] = [];
    const out = new Writable({
      highWaterMark: 16 * 1024,
      write(chunk: Buffer, _enc, done) {
        chunks.push(chunk);
        setTimeout(done, 30);
      },
    });
    const image = randomBytes(3 * 1024 * 1024);
    const started = Date.now();
    await writeJsonParts(out, jsonParts({ b64_json: new Base64Bytes(image) }), '', '', { idleMs: 200 });
    expect(Date.now() - started).toBeGreaterThan(200);
    expect(JSON.parse(Buffer.concat(chunks).toString()).b64_json).toBe(image.toString('base64'));
  }, 10_000);

  it('follows an abort signal: the wait stops at once and the writable is destroyed', async () => {
    for (const size of [2 * 1024 * 1024, 1024]) {
      const out = stuck();
      const abort = new AbortController();
      const writing = writeJsonParts(out, jsonParts({ b64_json: new Base64Bytes(randomBytes(size)) }), '', '', { signal: abort.signal });
      setTimeout(() => abort.abort(new Error('client disconnected')), 20);
      await expect(writing).rejects.toThrow('the client went away');
      expect(out.destroyed).toBe(true);
    }
  }, 5000);
});
