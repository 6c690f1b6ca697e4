/**
 * `POST /v1/files` costs no credit, and each upload ends in a whole decode of its image on libuv's
 * threads, which the media store's reads and writes share. So an upload takes a token of the key's
 * and the account's requests per minute, as a generation does (429 rate_limited before the body is
 * read); a key has at most UPLOADS_IN_FLIGHT_PER_KEY uploads in flight on an instance (429
 * too_many_in_flight, its body unread); and the process decodes at most MAX_FULL_DECODES images at
 * once (`fullDecodes`), the rest waiting for a turn, which a client gone meanwhile gives up. The
 * test holds decode turns itself to see who waits: no timing.
 */
import { request, type ClientRequest, type IncomingMessage } from 'node:http';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { UPLOADS_IN_FLIGHT_PER_KEY } from '../../server/http/file-upload.ts';
import { fullDecodes, inspectImage, MAX_FULL_DECODES } from '../../server/lib/image-inspect.ts';
import type { FileService } from '../../server/services/file.service.ts';
import { createApiKey, createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

let server: TestServer;
let png: Buffer;
beforeAll(async () => {
  server = await startTestServer({ workers: false });
  await seedCatalog(server.db);
  png = await sharp({ create: { width: 64, height: 64, channels: 3, background: '#0a0' } }).png().toBuffer();
});
afterAll(async () => server?.close());

function uploadForm(bytes: Buffer): FormData {
  const form = new FormData();
  form.append('purpose', 'input');
  form.append('file', new Blob([bytes], { type: 'image/png' }), 'x.png');
  return form;
}

async function upload(key: string, signal?: AbortSignal) {
  const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: uploadForm(png), signal });
  const body = (await res.json()) as { id?: string; error?: { code: string; message: string } };
  return { status: res.status, body, retryAfter: res.headers.get('retry-after'), limit: res.headers.get('x-ratelimit-limit-requests') };
}

const BOUNDARY = 'b0undary';
const FILE_PART_HEAD = `--${BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ninput\r\n--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="x.png"\r\nContent-Type: image/png\r\n\r\n`;

/** An upload declaring a 1 MB body of which `sent` is sent, and no more until the test destroys it. */
function heldUpload(key: string, sent = ''): { req: ClientRequest; response: Promise<IncomingMessage> } {
  const url = new URL(`${server.directUrl}/v1/files`);
  const req = request({
    host: url.hostname,
    port: url.port,
    path: url.pathname,
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': `multipart/form-data; boundary=${BOUNDARY}`, 'Content-Length': '1000000' },
  });
  req.on('error', () => undefined);
  const response = new Promise<IncomingMessage>((resolve) => req.on('response', resolve));
  if (sent) req.write(sent);
  else req.flushHeaders();
  return { req, response };
}

/** Counts the uploads of `accountId` whose file part the server has started storing. */
function countSaves(files: FileService, accountId: string): { count: () => number; restore: () => void } {
  let saves = 0;
  const save = files.save.bind(files);
  files.save = (input, data, opts) => {
    if (input.accountId === accountId) saves++;
    return save(input, data, opts);
  };
  return { count: () => saves, restore: () => void Reflect.deleteProperty(files, 'save') };
}

describe('POST /v1/files limits', () => {
  it("takes a token of the key's requests per minute, refusing the next upload before its body is read", async () => {
    const c = await createCustomer(server.db, { balance: 0 });
    await server.db.updateTable('apiKeys').set({ requestsPerMinute: 1 }).where('id', '=', c.apiKeyId).execute();

    expect(await upload(c.key)).toMatchObject({ status: 201, limit: '1' });
    const refused = await upload(c.key);
    expect([refused.status, refused.body.error?.code, refused.limit]).toEqual([429, 'rate_limited', '1']);
    expect(refused.body.error?.message).toMatch(/^This API key has used its 1 request per minute \(generations, uploads and webhook tests\); retry in \d+ s\.$/);
    expect(Number(refused.retryAfter)).toBeGreaterThanOrEqual(1);
    const stored = await server.db.selectFrom('files').select('id').where('accountId', '=', c.accountId).execute();
    expect(stored).toHaveLength(1);
  });

  it(`refuses a key's upload past ${UPLOADS_IN_FLIGHT_PER_KEY} in flight with 429 too_many_in_flight, before its body is read`, async () => {
    const c = await createCustomer(server.db, { balance: 0 });
    const saves = countSaves(server.ctx.services.files, c.accountId);
    const held = Array.from({ length: UPLOADS_IN_FLIGHT_PER_KEY }, () => heldUpload(c.key, `${FILE_PART_HEAD}\x89PNG`));
    try {
      // Every one of them is past the cap's check: its file part is being stored.
      await until(() => saves.count() === UPLOADS_IN_FLIGHT_PER_KEY, 10_000, `${UPLOADS_IN_FLIGHT_PER_KEY} uploads storing`);

      const refused = await upload(c.key);
      expect([refused.status, refused.body.error?.code, refused.retryAfter]).toEqual([429, 'too_many_in_flight', '1']);
      expect(refused.body.error?.message).toBe(`This API key already has ${UPLOADS_IN_FLIGHT_PER_KEY} uploads in flight, its limit; retry when one of them has been answered.`);
      // Answered with nothing of its body sent.
      const unread = heldUpload(c.key);
      const answer = await unread.response;
      expect(answer.statusCode).toBe(429);
      answer.resume();
      unread.req.destroy();
      expect(saves.count()).toBe(UPLOADS_IN_FLIGHT_PER_KEY);

      // The cap is the key's: another key, of the same account or not, uploads meanwhile.
      const sibling = await createApiKey(server.db, { accountId: c.accountId, groupId: c.groupId });
      expect((await upload(sibling.key)).status).toBe(201);
      expect((await upload((await createCustomer(server.db)).key)).status).toBe(201);

      // An upload whose client left gives its place back.
      held.shift()!.req.destroy();
      await until(async () => (await upload(c.key)).status === 201, 10_000, 'a place given back');
    } finally {
      saves.restore();
      for (const h of held) h.req.destroy();
    }
  });

  it(`decodes at most ${MAX_FULL_DECODES} images at once in the process; the others wait for a turn`, async () => {
    // The test holds every turn: an inspection that checked the header and waits is queued.
    const turns = [await fullDecodes.acquire(), await fullDecodes.acquire()];
    expect(fullDecodes.inUse).toBe(MAX_FULL_DECODES);
    const inspections = [inspectImage(png, 'a'), inspectImage(png, 'b'), inspectImage(png, 'c')];
    try {
      await until(() => fullDecodes.queued === 3, 5_000, 'three inspections waiting for a turn');
      for (const give of turns.splice(0)) give();
      // Two of them decode, the third waits for one of them.
      expect([fullDecodes.inUse, fullDecodes.queued]).toEqual([MAX_FULL_DECODES, 1]);
      for (const inspected of await Promise.all(inspections)) expect(inspected).toMatchObject({ format: 'png', width: 64, height: 64 });
      expect([fullDecodes.inUse, fullDecodes.queued]).toEqual([0, 0]);
    } finally {
      for (const give of turns) give();
      await Promise.allSettled(inspections);
    }
  });

  it('makes an upload wait for a decode turn, and gives the turn up when its client leaves meanwhile', async () => {
    const c = await createCustomer(server.db, { balance: 0 });
    const turns = [await fullDecodes.acquire(), await fullDecodes.acquire()];
    try {
      // Stored, its header checked, waiting for its turn to be decoded.
      const waiting = upload(c.key);
      await until(() => fullDecodes.queued === 1, 10_000, 'the upload waiting for a decode turn');
      turns.pop()!();
      expect((await waiting).status).toBe(201);

      // A client gone while its upload waits leaves the queue, and its file is removed.
      turns.push(await fullDecodes.acquire());
      const leaving = new AbortController();
      const gone = upload(c.key, leaving.signal).catch(() => 'aborted');
      await until(() => fullDecodes.queued === 1, 10_000, 'the second upload waiting for a decode turn');
      leaving.abort();
      expect(await gone).toBe('aborted');
      await until(() => fullDecodes.queued === 0, 10_000, 'the gone upload leaving the queue');
      expect(fullDecodes.inUse).toBe(MAX_FULL_DECODES);
      await until(async () => (await server.db.selectFrom('files').select('id').where('accountId', '=', c.accountId).execute()).length === 1, 10_000, 'the gone upload discarded');
    } finally {
      for (const give of turns) give();
    }
  });
});
