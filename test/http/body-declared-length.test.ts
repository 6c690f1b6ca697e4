/**
 * A body whose declared Content-Length no accepted request can have is refused at once, before any
 * of it is read or stored and before it waits for anything: an upload (`POST /v1/files`) declared
 * longer than the upload limit plus what its fields and framing can take is 413 media_too_large
 * with nothing written to the store; a multipart edit declared longer than its route's limit is
 * 413 body_too_large without queueing for the large-body budget (where it would wait, to be
 * answered 503 server_busy, and hold up every large edit behind it).
 */
import { request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { errorMiddleware } from '../../server/http/error-middleware.ts';
import { imageEditMultipart } from '../../server/http/multipart.ts';
import { largeBodySlots } from '../../server/http/request-guards.ts';
import { createLogger } from '../../server/logger.ts';
import { LargeBodyBudget } from '../../server/services/media/large-body-budget.ts';
import { createCustomer } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { noisePng } from '../support/noise-png.ts';

const BOUNDARY = 'mg-declared';

interface Answer {
  status: number;
  body: Record<string, any>;
  headers: Record<string, string | string[] | undefined>;
}

/**
 * Sends the head of a multipart body declared `declared` bytes long and the first `prefix` of it,
 * never the rest, and resolves with the answer (which must come without the rest).
 */
function declare(url: string, path: string, declared: number, prefix: string, headers: Record<string, string> = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}${path}`, {
      method: 'POST',
      headers: { ...headers, 'Content-Type': `multipart/form-data; boundary=${BOUNDARY}`, 'Content-Length': String(declared) },
    });
    req.on('error', reject);
    req.on('response', (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => {
        req.destroy();
        resolve({ status: res.statusCode!, body: JSON.parse(text) as Record<string, any>, headers: res.headers });
      });
    });
    req.write(prefix);
  });
}

const fieldPart = (name: string, value: string) => `--${BOUNDARY}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`;
const filePartHead = (name: string) => `--${BOUNDARY}\r\nContent-Disposition: form-data; name="${name}"; filename="a.png"\r\nContent-Type: image/png\r\n\r\n`;

describe('POST /v1/files: the declared length', () => {
  let server: TestServer;
  let png: Buffer;
  let saves = 0;

  beforeAll(async () => {
    png = await noisePng(120, 100, 3);
    // The upload limit is this PNG's size exactly. A body that stalls is cut after 3 s: an upload
    // refused only once its limit's worth had arrived would be answered that, not 413.
    server = await startTestServer({ env: { UPLOAD_MAX_BYTES: String(png.length), BODY_IDLE_TIMEOUT_MS: '3000' } });
    const files = server.ctx.services.files;
    const save = files.save.bind(files);
    files.save = (...args) => {
      saves++;
      return save(...args);
    };
  });
  afterAll(async () => server?.close());

  it('a body declared far over the upload limit is 413 media_too_large at once, and nothing is stored', async () => {
    const c = await createCustomer(server.db);
    const before = saves;
    const res = await declare(server.directUrl, '/v1/files', 1_000_000_000, fieldPart('purpose', 'input') + filePartHead('file'), { Authorization: `Bearer ${c.key}` });
    expect([res.status, res.body.error]).toEqual([
      413,
      { type: 'invalid_request_error', code: 'media_too_large', param: 'file', message: `The file exceeds the limit of ${png.length} bytes.` },
    ]);
    expect(res.headers.connection).toBe('close');
    expect(saves).toBe(before);
    expect(await server.db.selectFrom('files').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
  });

  it('a file of exactly the limit, with its fields, is still taken (201)', async () => {
    const c = await createCustomer(server.db);
    const form = new FormData();
    form.append('purpose', 'input');
    form.append('expires_after[anchor]', 'created_at');
    form.append('expires_after[seconds]', '3600');
    form.append('file', new Blob([png], { type: 'image/png' }), 'noise.png');
    const res = await fetch(`${server.directUrl}/v1/files`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    const body = (await res.json()) as Record<string, any>;
    expect([res.status, body.bytes]).toEqual([201, png.length]);
  });
});

describe('a multipart edit declared over its limit does not queue for the large-body budget', () => {
  const LIMIT = 5_000_000;
  const budget = new LargeBodyBudget({ largeBodyBytes: 2048, budgetBytes: 1_000_000, waitMs: 1000 });
  let server: Server;
  let url: string;

  beforeAll(async () => {
    // The edit route's own pipeline (app.ts): the budget, then the parser, under the same limit.
    const app = express();
    app.post('/v1/images/edits', largeBodySlots(budget, LIMIT), imageEditMultipart({ maxTotalBytes: LIMIT }), (_req, res) => void res.json({ read: true }));
    app.use(errorMiddleware(createLogger('silent')));
    server = await new Promise<Server>((resolve) => {
      const s = app.listen(0, '127.0.0.1', () => resolve(s));
    });
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
  });

  it('is 413 body_too_large at once while other large edits hold the whole budget, and takes none of it', async () => {
    const release = await budget.acquire(1_000_000);
    try {
      const res = await declare(url, '/v1/images/edits', LIMIT + 1, fieldPart('prompt', 'make it red'));
      expect([res.status, res.body.error]).toEqual([
        413,
        { type: 'invalid_request_error', code: 'body_too_large', param: null, message: `The request body exceeds the limit of ${LIMIT} bytes.` },
      ]);
      expect(budget.inUse).toBe(1_000_000);
      // A body within the limit still waits for its share (here in vain: 503 server_busy).
      const within = await declare(url, '/v1/images/edits', LIMIT, fieldPart('prompt', 'make it red'));
      expect([within.status, within.body.error?.code]).toEqual([503, 'server_busy']);
    } finally {
      release();
    }
    expect(budget.inUse).toBe(0);
  });
});

describe('the same through the server: the edit route is wired with its limit', () => {
  let server: TestServer;
  const LIMIT = 3_000_000;

  beforeAll(async () => {
    server = await startTestServer({ env: { EDIT_MAX_BODY_BYTES: String(LIMIT), LARGE_BODY_BYTES: '2048', LARGE_BODY_BUDGET_BYTES: '1000000', LARGE_BODY_WAIT_MS: '60000' } });
  });
  afterAll(async () => server?.close());

  it('answers 413 body_too_large at once while the whole budget is held, instead of queueing behind it', async () => {
    const c = await createCustomer(server.db);
    const budget = server.ctx.services.largeBodies;
    const release = await budget.acquire(1_000_000);
    try {
      const started = Date.now();
      const res = await declare(server.directUrl, '/v1/images/edits', LIMIT + 1, fieldPart('prompt', 'make it red'), { Authorization: `Bearer ${c.key}` });
      expect([res.status, res.body.error?.code]).toEqual([413, 'body_too_large']);
      // The budget's wait is a minute: an answer this soon did not queue for it.
      expect(Date.now() - started).toBeLessThan(30_000);
      expect(budget.inUse).toBe(1_000_000);
    } finally {
      release();
    }
  });
});
