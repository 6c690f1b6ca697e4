/**
 * What a review of the client found (each was a failing test first): a stream refused before it
 * began, for a reason that charged nothing, is sent again after its Retry-After; a stream whose lines
 * end with a lone CR keeps its last frame; createVideo sends again (same client_request_id) after a
 * reverse proxy's own 502/503/504 page; verifyWebhook takes another fetch implementation's Headers.
 * Real HTTP over loopback (node:http), so the errors and headers are the ones Node's fetch produces.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Headers as UndiciHeaders } from 'undici';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createMediagateClient, MediagateError, verifyWebhook } from '../../clients/typescript/index.ts';
import { completedImageEvent, errorBody, videoTask, videoTaskCreated } from './factories.ts';
import { API_KEY, sseFrame } from './fake-fetch.ts';

type Handler = (req: IncomingMessage, body: string, res: ServerResponse) => void;
let handlers: Handler[] = [];
const seen: { method: string; url: string; body: string; at: number }[] = [];
let server: Server;
let baseUrl: string;

beforeAll(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString();
      seen.push({ method: req.method!, url: req.url!, body, at: Date.now() });
      const next = handlers.shift();
      if (!next) {
        res.writeHead(599).end('unexpected request');
        return;
      }
      next(req, body, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

function reset(...next: Handler[]): void {
  handlers = next;
  seen.length = 0;
}

const json =
  (status: number, body: unknown, headers: Record<string, string> = {}): Handler =>
  (_req, _body, res) => {
    res.writeHead(status, { 'Content-Type': 'application/json', 'X-Request-Id': `req_${status}`, ...headers });
    res.end(JSON.stringify(body));
  };

const imageBody = { prompt: 'A red fox in fresh snow', model: 'local-image-1' };
const videoBody = { prompt: 'A paper boat', model: 'local-video-1', seconds: 4, aspectRatio: '16:9', resolution: '720p' };

async function drain<E>(events: AsyncIterable<E>): Promise<{ events: E[]; error: unknown }> {
  const out: E[] = [];
  try {
    for await (const e of events) out.push(e);
    return { events: out, error: undefined };
  } catch (error) {
    return { events: out, error };
  }
}

describe('image streams', () => {
  it('exposes a JSON 503 no_upstream_capacity answered before the stream (retries off): status, code, request id, Retry-After', async () => {
    reset(json(503, { error: { message: 'No capacity', type: 'server_error', code: 'no_upstream_capacity', param: null } }, { 'Retry-After': '1' }));
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

    const { events, error } = await drain(mg.streamImage(imageBody, { maxRetries: 0 }));

    expect(events).toEqual([]);
    expect(seen).toHaveLength(1);
    expect(error).toBeInstanceOf(MediagateError);
    expect(error).toMatchObject({ status: 503, code: 'no_upstream_capacity', requestId: 'req_503', retryAfterMs: 1_000 });
  });

  it('sends a stream again after refusals that created and charged nothing (503 no_upstream_capacity, 429), after their Retry-After', async () => {
    reset(
      json(503, { error: { message: 'No capacity', type: 'server_error', code: 'no_upstream_capacity', param: null } }, { 'Retry-After': '1' }),
      json(429, { error: { message: 'Slow down', type: 'rate_limit_error', code: 'too_many_in_flight', param: null } }, { 'Retry-After': '1' }),
      (_req, _body, res) => {
        res.writeHead(200, { 'Content-Type': 'text/event-stream; charset=utf-8' });
        res.end(sseFrame(completedImageEvent()));
      },
    );
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

    const { events, error } = await drain(mg.streamImage(imageBody));

    expect(error).toBeUndefined();
    expect(events).toEqual([completedImageEvent()]);
    expect(seen).toHaveLength(3);
  });

  it('delivers the last frame of a stream whose lines end with CR only (SSE allows CR, LF or CRLF)', async () => {
    reset((_req, _body, res) => {
      res.writeHead(200, { 'Content-Type': 'text/event-stream; charset=utf-8' });
      res.end(sseFrame(completedImageEvent()).replaceAll('\n', '\r'));
    });
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

    const { events, error } = await drain(mg.streamImage(imageBody));

    expect(error).toBeUndefined();
    expect(events).toEqual([completedImageEvent()]);
  });

  it('parses comments, multi-line data, CRLF and an error frame', async () => {
    const completed = JSON.stringify(completedImageEvent(), null, 1).split('\n');
    const sse =
      ': keep-alive\r\n\r\n' +
      'event: image_generation.completed\r\n' +
      completed.map((l) => `data: ${l}\r\n`).join('') +
      '\r\n' +
      ': keep-alive\n\n' +
      'event: error\ndata: {"type":"error","error":{"message":"Upstream failed","type":"server_error","code":"upstream_error","param":null,"request_id":"req_b"}}\n\n';
    reset((_req, _body, res) => {
      res.writeHead(200, { 'Content-Type': 'text/event-stream; charset=utf-8', 'X-Request-Id': 'req_sse' });
      res.end(sse);
    });
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

    const { events, error } = await drain(mg.streamImage(imageBody));

    expect(events).toEqual([completedImageEvent()]);
    expect(error).toMatchObject({ name: 'MediagateError', status: 200, code: 'upstream_error', requestId: 'req_sse' });
  });

  it('does not send again a refusal that lasts (400, 503 no_reachable_member), nor after a stream began with an error frame', async () => {
    for (const answer of [
      json(400, { error: { message: 'Bad', type: 'invalid_request_error', code: 'invalid_request', param: null } }),
      json(503, { error: { message: 'None', type: 'server_error', code: 'no_reachable_member', param: null } }, { 'Retry-After': '1' }),
      (_req: IncomingMessage, _body: string, res: ServerResponse) => {
        res.writeHead(200, { 'Content-Type': 'text/event-stream; charset=utf-8' });
        res.end('event: error\ndata: {"type":"error","error":{"message":"No capacity","type":"server_error","code":"no_upstream_capacity","param":null}}\n\n');
      },
    ]) {
      reset(answer);
      const { error } = await drain(createMediagateClient({ baseUrl, apiKey: API_KEY }).streamImage(imageBody));
      expect(error).toBeInstanceOf(MediagateError);
      expect(seen).toHaveLength(1);
    }
  });
});

describe('createVideo behind a reverse proxy', () => {
  it.each([502, 503, 504])(
    'sends the create again, with the same client_request_id, after a proxy %s page (no Mediagate code), as waitForVideo does',
    async (status) => {
      reset(
        (_req, _body, res) => {
          res.writeHead(status, { 'Content-Type': 'text/html', 'Retry-After': '0' });
          res.end(`<html><body><h1>${status}</h1>nginx</body></html>`);
        },
        json(202, videoTaskCreated()),
      );
      const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

      const result = await mg.createVideo(videoBody);

      expect(result.error).toBeUndefined();
      expect(result.data).toEqual(videoTaskCreated());
      expect(seen).toHaveLength(2);
      expect(new Set(seen.map((s) => (JSON.parse(s.body) as { client_request_id: string }).client_request_id)).size).toBe(1);
    },
  );

  it('waitForVideo reads again after the same proxy pages', async () => {
    reset(
      (_req, _body, res) => {
        res.writeHead(503, { 'Content-Type': 'text/html', 'Retry-After': '0' });
        res.end('<html>503</html>');
      },
      json(200, videoTask({ status: 'completed', video_url: 'https://files.test/v.mp4', data: [{ url: 'https://files.test/v.mp4' }] })),
    );
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

    const task = await mg.waitForVideo('vid_1', { intervalMs: 10, timeoutMs: 5_000 });

    expect(task.status).toBe('completed');
  });
});

describe('verifyWebhook', () => {
  const secret = 'whsec_c2VjcmV0LWZvci10ZXN0aW5nLXdlYmhvb2tz';
  const body = JSON.stringify(videoTask({ status: 'completed', video_url: 'https://files.test/v.mp4' }));

  it("verifies a delivery whose headers come as another fetch implementation's Headers (undici's, node-fetch's, a ponyfill's)", () => {
    const at = new Date();
    const headers = new UndiciHeaders({
      'webhook-id': 'msg_1',
      'webhook-timestamp': String(Math.floor(at.getTime() / 1_000)),
      'webhook-signature': new Webhook(secret).sign('msg_1', at, body),
    });

    expect(verifyWebhook(body, headers as unknown as Headers, secret)).toMatchObject({ id: 'vid_1', status: 'completed' });
  });
});

describe('errors', () => {
  it('an error envelope keeps status, code, message, param, type, request id and Retry-After', async () => {
    reset(json(402, { error: { ...errorBody('insufficient_balance').error, type: 'insufficient_credits', request_id: 'req_body' } }, { 'Retry-After': '3' }));
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

    const result = await mg.createVideo(videoBody);

    expect(result.error).toMatchObject({ status: 402, code: 'insufficient_balance', type: 'insufficient_credits', requestId: 'req_402', retryAfterMs: 3_000, message: 'failed: insufficient_balance' });
    expect(result.error?.clientRequestId).toMatch(/^[0-9a-f-]{36}$/);
  });
});
