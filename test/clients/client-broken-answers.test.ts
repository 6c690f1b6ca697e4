/**
 * The helpers when the answer is not the gateway's whole answer: an image stream whose connection
 * is refused or cut after a frame (and one that ends short on purpose: the upstream returned fewer
 * images, which is the whole answer); a video read answered 502/504 by a proxy in front of a restarting gateway; a webhook
 * that does not verify. The streams run against a real HTTP server on a loopback port, so the
 * errors are the ones Node's fetch really throws; the reads use the strict fake fetch on a fake clock.
 */
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook, WebhookVerificationError as LibraryVerificationError } from 'standardwebhooks';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  createMediagateClient,
  MediagateError,
  MediagateNetworkError,
  verifyWebhook,
  WebhookVerificationError,
} from '../../clients/typescript/index.ts';
import { completedImageEvent, errorBody, partialImageEvent, videoTask } from './factories.ts';
import { API_KEY, BASE_URL, jsonResponse, sseFrame, strictFetch, type Exchange } from './fake-fetch.ts';

/** How the loopback server answers the next stream request. */
let answer: (res: ServerResponse) => void = () => undefined;
let server: Server;
let baseUrl: string;

beforeAll(async () => {
  server = createServer((req, res) => {
    req.resume();
    req.on('end', () => answer(res));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

afterEach(() => {
  vi.useRealTimers();
});

/** The head of a stream as the gateway writes it, then `frames`. */
function startStream(res: ServerResponse, frames: { type: string }[]): void {
  res.writeHead(200, { 'Content-Type': 'text/event-stream; charset=utf-8', 'X-Request-Id': 'req_s1', 'X-Task-Id': 'img_s1' });
  for (const frame of frames) res.write(sseFrame(frame));
}

/** Runs the loop as a caller writes it: the events it saw, and what it threw. */
async function drain<E>(events: AsyncIterable<E>): Promise<{ seen: E[]; error: unknown }> {
  const seen: E[] = [];
  try {
    for await (const event of events) seen.push(event);
    return { seen, error: undefined };
  } catch (error) {
    return { seen, error };
  }
}

const imageBody = { prompt: 'A red fox in fresh snow', model: 'local-image-1', partial_images: 1 };
const secondImage = { ...completedImageEvent(), image_index: 1 };

describe('image streams that get no answer, or only part of one', () => {
  it('throws a MediagateNetworkError when the connection is refused', async () => {
    // A port that was just listened on and closed refuses connections.
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const { port } = closed.address() as AddressInfo;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const mg = createMediagateClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: API_KEY });

    const { seen, error } = await drain(mg.streamImage(imageBody));

    expect(seen).toEqual([]);
    expect(error).toBeInstanceOf(MediagateNetworkError);
    expect(error).toMatchObject({ name: 'MediagateNetworkError', message: expect.stringContaining('ECONNREFUSED'), cause: expect.any(TypeError) });
  });

  it('throws a MediagateNetworkError after the events that arrived when the connection is cut', async () => {
    answer = (res) => {
      startStream(res, [partialImageEvent(0)]);
      setTimeout(() => res.socket?.destroy(), 50);
    };
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

    const { seen, error } = await drain(mg.streamImage(imageBody));

    expect(seen).toEqual([partialImageEvent(0)]);
    expect(error).toBeInstanceOf(MediagateNetworkError);
    expect(error).toMatchObject({ message: expect.stringMatching(/^The answer from Mediagate broke off: /), cause: expect.any(TypeError) });
  });

  it('ends without an error when the stream ends cleanly after fewer completed events than n (the upstream returned fewer, only those charged)', async () => {
    answer = (res) => {
      startStream(res, [completedImageEvent()]);
      res.end();
    };
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

    const { seen, error } = await drain(mg.streamImage({ ...imageBody, n: 2 }));

    expect(seen).toEqual([completedImageEvent()]);
    expect(error).toBeUndefined();
  });

  it('ends without an error when all n images completed', async () => {
    answer = (res) => {
      startStream(res, [partialImageEvent(0), completedImageEvent(), secondImage]);
      res.end();
    };
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

    const { seen, error } = await drain(mg.streamImage({ ...imageBody, n: 2 }));

    expect(error).toBeUndefined();
    expect(seen).toEqual([partialImageEvent(0), completedImageEvent(), secondImage]);
  });

  it('throws the error frame, not a broken-off answer, when the server ends with one before all images', async () => {
    const frame = { type: 'error', error: { ...errorBody('upstream_error').error, type: 'server_error' } };
    answer = (res) => {
      startStream(res, [completedImageEvent(), frame]);
      res.end();
    };
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });

    const { seen, error } = await drain(mg.streamImage({ ...imageBody, n: 2 }));

    expect(seen).toEqual([completedImageEvent()]);
    expect(error).toBeInstanceOf(MediagateError);
    expect(error).toMatchObject({ status: 200, code: 'upstream_error', requestId: 'req_s1' });
  });

  it('yields image_edit events for an edit stream', async () => {
    const completed = { ...completedImageEvent(), type: 'image_edit.completed' as const };
    answer = (res) => {
      startStream(res, [completed]);
      res.end();
    };
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });
    const edit = { prompt: 'Replace the sky', model: 'local-image-1', images: ['file_1'] };

    expect(await drain(mg.streamImageEdit(edit))).toEqual({ seen: [completed], error: undefined });
  });

  it("throws the signal's reason, not a network error, when the caller aborts mid-stream", async () => {
    answer = (res) => startStream(res, [partialImageEvent(0)]);
    const mg = createMediagateClient({ baseUrl, apiKey: API_KEY });
    const controller = new AbortController();
    const reason = new Error('the caller gave up');

    const { seen, error } = await drain(
      (async function* () {
        for await (const event of mg.streamImage(imageBody, { signal: controller.signal })) {
          yield event;
          controller.abort(reason);
        }
      })(),
    );

    expect(seen).toEqual([partialImageEvent(0)]);
    expect(error).toBe(reason);
  });
});

describe('waitForVideo behind a reverse proxy', () => {
  const read = (respond: Exchange['respond'], repeat = false): Exchange => ({ method: 'GET', path: '/v1/videos/vid_1', respond, repeat });
  const proxyPage = (status: 502 | 504) => () =>
    new Response(`<html><body><h1>${status} Bad Gateway</h1>nginx</body></html>`, { status, headers: { 'Content-Type': 'text/html' } });
  const done = videoTask({ status: 'completed', video_url: 'https://files.test/v.mp4', data: [{ url: 'https://files.test/v.mp4' }] });

  it("reads again after a proxy's 502 and 504 pages, after a growing pause", async () => {
    vi.useFakeTimers({ toFake: ['Date', 'setTimeout', 'clearTimeout'] });
    const fake = strictFetch([read(proxyPage(502)), read(proxyPage(504)), read(() => jsonResponse(200, done))]);
    const mg = createMediagateClient({ baseUrl: BASE_URL, apiKey: API_KEY, fetch: fake.fetch });
    let result: unknown;
    void mg.waitForVideo('vid_1', { intervalMs: 10 }).then((task) => (result = task), (e: unknown) => (result = e));

    // Not at once: the pause after the first failure is at least 250 ms (500 ms, jittered).
    await vi.advanceTimersByTimeAsync(200);
    expect([fake.calls, result]).toEqual([1, undefined]);
    await vi.advanceTimersByTimeAsync(5_000);
    expect(result).toEqual(done);
    fake.assertDone();
  });

  it.each([502, 504] as const)("rejects at once on a %i that carries a Mediagate error code (the gateway's own answer)", async (status) => {
    const fake = strictFetch([read(() => jsonResponse(status, errorBody('upstream_error')), true)]);
    const mg = createMediagateClient({ baseUrl: BASE_URL, apiKey: API_KEY, fetch: fake.fetch });

    const error = await mg.waitForVideo('vid_1', { intervalMs: 1 }).catch((e: unknown) => e);

    expect(error).toBeInstanceOf(MediagateError);
    expect(error).toMatchObject({ status, code: 'upstream_error' });
    expect(fake.calls).toBe(1);
  });
});

describe('verifyWebhook', () => {
  const secret = 'whsec_c2VjcmV0LWZvci10ZXN0aW5nLXdlYmhvb2tz';
  const body = JSON.stringify(videoTask({ status: 'completed', video_url: 'https://files.test/v.mp4' }));
  const signed = (payload: string) => {
    const at = new Date();
    return {
      'webhook-id': 'msg_1',
      'webhook-timestamp': String(Math.floor(at.getTime() / 1_000)),
      'webhook-signature': new Webhook(secret).sign('msg_1', at, payload),
    };
  };

  it('returns the task of an authentic delivery', () => {
    expect(verifyWebhook(new TextEncoder().encode(body), signed(body), secret)).toMatchObject({ id: 'vid_1', status: 'completed' });
  });

  it("throws the package's own WebhookVerificationError, with the library's error as cause, when the body was altered", () => {
    const headers = signed(body);
    let error: unknown;
    try {
      verifyWebhook(body.replace('completed', 'failed'), headers, secret);
    } catch (err) {
      error = err;
    }

    expect(error).toBeInstanceOf(WebhookVerificationError);
    expect(error).not.toBeInstanceOf(LibraryVerificationError);
    expect(error).toMatchObject({ name: 'WebhookVerificationError', message: 'No matching signature found', cause: expect.any(LibraryVerificationError) });
  });

  it('throws a WebhookVerificationError when the headers are missing', () => {
    expect(() => verifyWebhook(body, {}, secret)).toThrow(WebhookVerificationError);
  });
});
