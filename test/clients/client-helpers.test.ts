import { describe, it, expect, vi } from 'vitest';
import {
  createMediagateClient,
  MediagateError,
  VideoWaitTimeoutError,
  type ImageGenerationStreamEvent,
  type VideoBillingRow,
  type VideoCreateRequest,
} from '../../clients/typescript/index.ts';
import {
  billingRow,
  completedImageEvent,
  errorBody,
  partialImageEvent,
  quoteConflictBody,
  videoTask,
  videoTaskCreated,
} from './factories.ts';
import { API_KEY, BASE_URL, chunkedResponse, jsonResponse, splitBytes, sseFrame, strictFetch, type Exchange } from './fake-fetch.ts';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

function clientWith(exchanges: Exchange[]) {
  const fake = strictFetch(exchanges);
  const client = createMediagateClient({ baseUrl: BASE_URL, apiKey: API_KEY, fetch: fake.fetch });
  return { client, fake };
}

const videoBody: VideoCreateRequest = {
  prompt: 'A paper boat drifting down a rainy street',
  model: 'local-video-1',
  seconds: 8,
  aspectRatio: '16:9',
  resolution: '720p',
  quote_token: 'q1.old.token',
};

describe('createVideo', () => {
  it('adds a generated client_request_id when the body has none', async () => {
    const { client, fake } = clientWith([
      {
        method: 'POST',
        path: '/v1/videos/generations',
        body: { ...videoBody, client_request_id: expect.stringMatching(UUID) },
        respond: () => jsonResponse(202, videoTaskCreated()),
      },
    ]);

    const result = await client.createVideo(videoBody);

    expect(result).toEqual({ data: videoTaskCreated() });
    fake.assertDone();
  });

  it('sends a caller-supplied id (either alias) unchanged', async () => {
    const body = { ...videoBody, clientRequestIdRequired: 'my-id-1' };
    const { client, fake } = clientWith([
      { method: 'POST', path: '/v1/videos/generations', body, respond: () => jsonResponse(202, videoTaskCreated()) },
    ]);

    const result = await client.createVideo(body);

    expect(result.error).toBeUndefined();
    fake.assertDone();
  });

  it('retries once with the new quote token and the same client_request_id when onQuoteChange accepts', async () => {
    const fresh = billingRow({ quoteToken: 'q1.fresh.token' });
    const body = { ...videoBody, quoteToken: 'q1.old.token' };
    const { client, fake } = clientWith([
      {
        method: 'POST',
        path: '/v1/videos/generations',
        body: { ...body, client_request_id: expect.stringMatching(UUID) },
        respond: () => jsonResponse(409, quoteConflictBody('quote_stale', fresh)),
      },
      {
        method: 'POST',
        path: '/v1/videos/generations',
        // The stale camelCase alias is gone; only the new snake_case token is sent.
        body: { ...videoBody, quote_token: 'q1.fresh.token', client_request_id: expect.stringMatching(UUID) },
        respond: () => jsonResponse(202, videoTaskCreated({ id: 'vid_2' })),
      },
    ]);
    const seen: VideoBillingRow[] = [];

    const result = await client.createVideo(body, {
      onQuoteChange: async (quote, conflict) => {
        expect(conflict.code).toBe('quote_stale');
        seen.push(quote);
        return true;
      },
    });

    expect(result).toEqual({ data: videoTaskCreated({ id: 'vid_2' }) });
    expect(seen).toEqual([fresh]);
    const [first, second] = fake.bodies as [{ client_request_id: string }, { client_request_id: string }];
    expect(second.client_request_id).toBe(first.client_request_id);
    fake.assertDone();
  });

  it('returns the conflict without retrying when onQuoteChange declines', async () => {
    const fresh = billingRow();
    const { client, fake } = clientWith([
      {
        method: 'POST',
        path: '/v1/videos/generations',
        body: { ...videoBody, client_request_id: expect.stringMatching(UUID) },
        respond: () => jsonResponse(409, quoteConflictBody('quote_expired', fresh), { 'X-Request-Id': 'req_409' }),
      },
    ]);

    const result = await client.createVideo(videoBody, { onQuoteChange: () => false });

    expect(result.data).toBeUndefined();
    expect(result.error).toBeInstanceOf(MediagateError);
    expect(result.error).toMatchObject({
      status: 409,
      code: 'quote_expired',
      type: 'conflict_error',
      param: 'quote_token',
      requestId: 'req_409',
      currentQuote: fresh,
      body: quoteConflictBody('quote_expired', fresh),
    });
    expect(fake.calls).toBe(1);
    fake.assertDone();
  });

  it('returns the conflict without retrying when no onQuoteChange is given', async () => {
    const { client, fake } = clientWith([
      {
        method: 'POST',
        path: '/v1/videos/generations',
        body: { ...videoBody, client_request_id: expect.stringMatching(UUID) },
        respond: () => jsonResponse(409, quoteConflictBody('quote_stale', billingRow())),
      },
    ]);

    const result = await client.createVideo(videoBody);

    expect(result.error?.code).toBe('quote_stale');
    fake.assertDone();
  });

  it('returns a second 409 instead of retrying again', async () => {
    const conflict = (token: string) => () => jsonResponse(409, quoteConflictBody('quote_stale', billingRow({ quoteToken: token })));
    const { client, fake } = clientWith([
      {
        method: 'POST',
        path: '/v1/videos/generations',
        body: { ...videoBody, client_request_id: expect.stringMatching(UUID) },
        respond: conflict('q1.second'),
      },
      {
        method: 'POST',
        path: '/v1/videos/generations',
        body: { ...videoBody, quote_token: 'q1.second', client_request_id: expect.stringMatching(UUID) },
        respond: conflict('q1.third'),
      },
    ]);
    let asked = 0;

    const result = await client.createVideo(videoBody, { onQuoteChange: () => (asked += 1) > 0 });

    expect(asked).toBe(1);
    expect(result.error).toMatchObject({ status: 409, code: 'quote_stale', currentQuote: { quoteToken: 'q1.third' } });
    expect(fake.calls).toBe(2);
    fake.assertDone();
  });

  it('returns other errors as typed results', async () => {
    const { client } = clientWith([
      {
        method: 'POST',
        path: '/v1/videos/generations',
        body: { ...videoBody, client_request_id: expect.stringMatching(UUID) },
        respond: () => jsonResponse(402, errorBody('insufficient_balance')),
      },
    ]);

    const result = await client.createVideo(videoBody, { onQuoteChange: () => true });

    expect(result.error).toMatchObject({ status: 402, code: 'insufficient_balance', currentQuote: undefined });
  });
});

describe('waitForVideo', () => {
  const poll = (status: 'queued' | 'in_progress', repeat = false): Exchange => ({
    method: 'GET',
    path: '/v1/videos/vid_1',
    respond: () => jsonResponse(200, videoTask({ status })),
    repeat,
  });

  it('polls until the task is completed', async () => {
    const done = videoTask({ status: 'completed', video_url: 'https://files.test/v.mp4', data: [{ url: 'https://files.test/v.mp4' }] });
    const { client, fake } = clientWith([
      poll('queued'),
      poll('in_progress'),
      { method: 'GET', path: '/v1/videos/vid_1', respond: () => jsonResponse(200, done) },
    ]);

    const task = await client.waitForVideo('vid_1', { intervalMs: 1 });

    expect(task).toEqual(done);
    expect(fake.calls).toBe(3);
    fake.assertDone();
  });

  it('resolves with a failed task instead of rejecting', async () => {
    const failed = videoTask({ status: 'failed', error: { message: 'The upstream refused the prompt.' } });
    const { client, fake } = clientWith([
      poll('in_progress'),
      { method: 'GET', path: '/v1/videos/vid_1', respond: () => jsonResponse(200, failed) },
    ]);

    const task = await client.waitForVideo('vid_1', { intervalMs: 1 });

    expect(task.status).toBe('failed');
    expect(task.error?.message).toBe('The upstream refused the prompt.');
    fake.assertDone();
  });

  it('rejects with a MediagateError on an HTTP error', async () => {
    const { client } = clientWith([
      {
        method: 'GET',
        path: '/v1/videos/vid_1',
        respond: () => jsonResponse(404, errorBody('task_not_found', {}), { 'X-Request-Id': 'req_404' }),
      },
    ]);

    const error = await client.waitForVideo('vid_1', { intervalMs: 1 }).catch((e: unknown) => e);

    expect(error).toBeInstanceOf(MediagateError);
    expect(error).toMatchObject({ status: 404, code: 'task_not_found', requestId: 'req_404' });
  });

  it('rejects with a timeout error carrying the last state after timeoutMs (on a fake clock)', async () => {
    vi.useFakeTimers({ toFake: ['Date', 'setTimeout', 'clearTimeout'] });
    try {
      const { client, fake } = clientWith([poll('in_progress', true)]);
      let error: unknown;
      void client.waitForVideo('vid_1', { intervalMs: 10, timeoutMs: 80 }).catch((e: unknown) => (error = e));

      await vi.advanceTimersByTimeAsync(79);
      expect(error).toBeUndefined(); // still polling
      await vi.advanceTimersByTimeAsync(1);
      expect(error).toBeInstanceOf(VideoWaitTimeoutError);
      expect(error).toMatchObject({ name: 'TimeoutError', taskId: 'vid_1', lastTask: { status: 'in_progress' } });
      expect(fake.calls).toBeGreaterThanOrEqual(2);
    } finally {
      vi.useRealTimers();
    }
  });

  it('rejects with an AbortError as soon as the signal aborts, cancelling the pause (on a fake clock)', async () => {
    vi.useFakeTimers({ toFake: ['Date', 'setTimeout', 'clearTimeout'] });
    try {
      const controller = new AbortController();
      const { client, fake } = clientWith([poll('in_progress', true)]);
      let error: unknown;
      void client.waitForVideo('vid_1', { intervalMs: 60_000, signal: controller.signal }).catch((e: unknown) => (error = e));

      // The first read is done and the one-minute pause has begun.
      await vi.advanceTimersByTimeAsync(30);
      expect([fake.calls, error]).toEqual([1, undefined]);
      // Aborted with no time passing: the pause ends at once, and no timer is left behind.
      controller.abort();
      await vi.advanceTimersByTimeAsync(0);
      expect(error).toBeInstanceOf(DOMException);
      expect(error).toMatchObject({ name: 'AbortError' });
      expect(vi.getTimerCount()).toBe(0);
      expect(fake.calls).toBe(1);
    } finally {
      vi.useRealTimers();
    }
  });

  it('rejects at once without a request when the signal is already aborted', async () => {
    const { client, fake } = clientWith([]);

    await expect(client.waitForVideo('vid_1', { signal: AbortSignal.abort() })).rejects.toMatchObject({ name: 'AbortError' });
    expect(fake.calls).toBe(0);
  });
});

describe('streamImage', () => {
  const imageBody = { prompt: 'A red fox in fresh snow', model: 'local-image-1', partial_images: 2 };
  const streamRequest = (respond: Exchange['respond']): Exchange => ({
    method: 'POST',
    path: '/v1/images/generations',
    headers: { accept: 'text/event-stream' },
    body: { ...imageBody, stream: true },
    respond,
  });
  const encode = (text: string): Uint8Array => new TextEncoder().encode(text);

  async function collect(events: AsyncIterable<ImageGenerationStreamEvent>): Promise<ImageGenerationStreamEvent[]> {
    const out: ImageGenerationStreamEvent[] = [];
    for await (const event of events) out.push(event);
    return out;
  }

  it('yields typed events in order from a body split at awkward byte boundaries', async () => {
    const sse = sseFrame(partialImageEvent(0)) + ': keep-alive comment\n\n' + sseFrame(partialImageEvent(1)) + sseFrame(completedImageEvent());
    // 1-, 2- and 5-byte chunks cut field names, "\n\n" separators and JSON apart.
    const { response, state } = chunkedResponse(splitBytes(encode(sse), [1, 2, 5]));
    const { client, fake } = clientWith([streamRequest(() => response)]);

    const events = await collect(client.streamImage(imageBody));

    expect(events).toEqual([partialImageEvent(0), partialImageEvent(1), completedImageEvent()]);
    expect(events.map((e) => e.type)).toEqual([
      'image_generation.partial_image',
      'image_generation.partial_image',
      'image_generation.completed',
    ]);
    expect(state.cancelled).toBe(false);
    fake.assertDone();
  });

  it('throws a MediagateError with the code of an error frame, even split inside a UTF-8 character', async () => {
    const errorFrame = {
      type: 'error',
      error: { message: 'Le fournisseur a échoué', type: 'server_error', code: 'upstream_error', param: null, request_id: 'req_s' },
    };
    const bytes = encode(sseFrame(partialImageEvent(0)) + sseFrame(errorFrame));
    const cut = bytes.indexOf(0xc3) + 1; // between the two bytes of "é"
    const { response } = chunkedResponse([bytes.slice(0, cut), bytes.slice(cut)]);
    const { client } = clientWith([streamRequest(() => response)]);
    const seen: string[] = [];

    const error = await (async () => {
      for await (const event of client.streamImage(imageBody)) seen.push(event.type);
    })().catch((e: unknown) => e);

    expect(seen).toEqual(['image_generation.partial_image']);
    expect(error).toBeInstanceOf(MediagateError);
    expect(error).toMatchObject({
      status: 200,
      code: 'upstream_error',
      type: 'server_error',
      message: 'Le fournisseur a échoué',
      requestId: 'req_stream_1',
      body: errorFrame,
    });
  });

  it('throws a MediagateError from the JSON body of a non-2xx answer before the stream', async () => {
    const { client } = clientWith([
      streamRequest(() => jsonResponse(402, { error: { ...errorBody('key_quota_exceeded').error, type: 'insufficient_credits' } }, { 'X-Request-Id': 'req_402' })),
    ]);

    const error = await collect(client.streamImage(imageBody)).catch((e: unknown) => e);

    expect(error).toBeInstanceOf(MediagateError);
    expect(error).toMatchObject({ status: 402, code: 'key_quota_exceeded', type: 'insufficient_credits', requestId: 'req_402' });
  });

  it('cancels the response body when the loop is left early', async () => {
    const { response, state } = chunkedResponse([encode(sseFrame(partialImageEvent(0)))], { keepOpen: true });
    const { client } = clientWith([streamRequest(() => response)]);
    const seen: string[] = [];

    for await (const event of client.streamImage(imageBody)) {
      seen.push(event.type);
      break;
    }

    expect(seen).toEqual(['image_generation.partial_image']);
    expect(state.cancelled).toBe(true);
  });

  it('streams edits from /v1/images/edits with a JSON body', async () => {
    const editBody = { prompt: 'Replace the sky', model: 'local-image-1', images: ['file_1'] };
    const partial = { ...partialImageEvent(0), type: 'image_edit.partial_image' as const };
    const completed = { ...completedImageEvent(), type: 'image_edit.completed' as const };
    const { response } = chunkedResponse(splitBytes(encode(sseFrame(partial) + sseFrame(completed)), [7]));
    const { client, fake } = clientWith([
      {
        method: 'POST',
        path: '/v1/images/edits',
        headers: { accept: 'text/event-stream' },
        body: { ...editBody, stream: true },
        respond: () => response,
      },
    ]);

    const events = [];
    for await (const event of client.streamImageEdit(editBody)) events.push(event);

    expect(events).toEqual([partial, completed]);
    fake.assertDone();
  });
});
