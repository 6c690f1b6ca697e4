/**
 * The helpers through passing failures: `503`s that say "retry", `429`s, answers that never came
 * (connection refused or reset during a gateway restart), `Retry-After`, and the idempotency key a
 * caller needs to retry `createVideo` itself. Strict fake fetch; pauses run on a fake clock or are
 * `Retry-After: 0`, so nothing depends on the wall clock.
 */
import { afterEach, describe, it, expect, vi } from 'vitest';
import {
  createMediagateClient,
  MediagateError,
  MediagateNetworkError,
  VideoWaitTimeoutError,
  type ErrorCode,
  type VideoCreateRequest,
} from '../../clients/typescript/index.ts';
import { billingRow, errorBody, quoteConflictBody, videoTask, videoTaskCreated } from './factories.ts';
import { API_KEY, BASE_URL, jsonResponse, strictFetch, type Exchange } from './fake-fetch.ts';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

function clientWith(exchanges: Exchange[], baseUrl = BASE_URL) {
  const fake = strictFetch(exchanges);
  const client = createMediagateClient({ baseUrl, apiKey: API_KEY, fetch: fake.fetch });
  return { client, fake };
}

/** What Node's fetch throws when the connection fails: a TypeError with the socket error as `cause`. */
function noAnswer(code: 'ECONNREFUSED' | 'ECONNRESET'): () => never {
  return () => {
    throw new TypeError('fetch failed', { cause: Object.assign(new Error(`connect ${code} 127.0.0.1:8080`), { code }) });
  };
}

function failure(status: number, code: ErrorCode, retryAfter?: string): () => Response {
  return () => jsonResponse(status, errorBody(code), retryAfter === undefined ? {} : { 'Retry-After': retryAfter });
}

function useFakeClock(): void {
  vi.useFakeTimers({ toFake: ['Date', 'setTimeout', 'clearTimeout'] });
}

afterEach(() => {
  vi.useRealTimers();
});

describe('MediagateError.retryAfterMs', () => {
  const answer = (retryAfter?: string) =>
    MediagateError.fromResponse(
      jsonResponse(503, errorBody('database_unavailable'), retryAfter === undefined ? {} : { 'Retry-After': retryAfter }),
      errorBody('database_unavailable'),
    );

  it('reads Retry-After in seconds', () => {
    expect(answer('2').retryAfterMs).toBe(2_000);
    expect(answer('0').retryAfterMs).toBe(0);
  });

  it('reads Retry-After as an HTTP date, from now, and never below 0', () => {
    vi.useFakeTimers({ toFake: ['Date'], now: new Date('2026-01-01T00:00:00Z') });

    expect(answer('Thu, 01 Jan 2026 00:00:30 GMT').retryAfterMs).toBe(30_000);
    expect(answer('Wed, 31 Dec 2025 23:59:00 GMT').retryAfterMs).toBe(0);
  });

  it('is undefined without a readable Retry-After', () => {
    expect(answer().retryAfterMs).toBeUndefined();
    expect(answer('soon').retryAfterMs).toBeUndefined();
    expect(answer('1.5').retryAfterMs).toBeUndefined();
  });
});

describe('waitForVideo through passing failures', () => {
  const read = (respond: Exchange['respond'], repeat = false): Exchange => ({ method: 'GET', path: '/v1/videos/vid_1', respond, repeat });
  const inProgress = read(() => jsonResponse(200, videoTask({ status: 'in_progress' })));
  const done = videoTask({ status: 'completed', video_url: 'https://files.test/v.mp4', data: [{ url: 'https://files.test/v.mp4' }] });
  const completed = read(() => jsonResponse(200, done));

  it('reads again after a 503 database_unavailable or not_ready, after its Retry-After', async () => {
    const { client, fake } = clientWith([
      inProgress,
      read(failure(503, 'database_unavailable', '0')),
      read(failure(503, 'not_ready', '0')),
      completed,
    ]);

    const task = await client.waitForVideo('vid_1', { intervalMs: 1 });

    expect(task).toEqual(done);
    fake.assertDone();
  });

  it('reads again after no answer (connection refused, then reset), after a pause', async () => {
    useFakeClock();
    const { client, fake } = clientWith([inProgress, read(noAnswer('ECONNREFUSED')), read(noAnswer('ECONNRESET')), completed]);
    let result: unknown;
    void client.waitForVideo('vid_1', { intervalMs: 10 }).then((task) => (result = task), (e: unknown) => (result = e));

    // The read after the interval failed; the pause after it is at least 250 ms (500 ms, jittered).
    await vi.advanceTimersByTimeAsync(200);
    expect([fake.calls, result]).toEqual([2, undefined]);
    await vi.advanceTimersByTimeAsync(5_000);
    expect(result).toEqual(done);
    fake.assertDone();
  });

  it('keeps reading through 503s until the deadline, then times out with the last failure as cause', async () => {
    useFakeClock();
    const { client, fake } = clientWith([inProgress, read(failure(503, 'database_unavailable', '1'), true)]);
    let error: unknown;
    void client.waitForVideo('vid_1', { intervalMs: 10, timeoutMs: 5_000 }).catch((e: unknown) => (error = e));

    await vi.advanceTimersByTimeAsync(4_999);
    expect(error).toBeUndefined();
    // One read, then one every Retry-After (1 s).
    expect(fake.calls).toBe(6);
    await vi.advanceTimersByTimeAsync(1);
    expect(error).toBeInstanceOf(VideoWaitTimeoutError);
    expect(error).toMatchObject({ lastTask: { status: 'in_progress' }, cause: { status: 503, code: 'database_unavailable', retryAfterMs: 1_000 } });
    expect(vi.getTimerCount()).toBe(0);
  });

  it.each([
    [401, 'invalid_api_key'],
    [403, 'api_key_inactive'],
    [404, 'task_not_found'],
    [500, 'internal_error'],
  ] as const)('rejects at once on a %i %s, which would recur', async (status, code) => {
    const { client, fake } = clientWith([read(failure(status, code, '0'), true)]);

    const error = await client.waitForVideo('vid_1', { intervalMs: 1 }).catch((e: unknown) => e);

    expect(error).toBeInstanceOf(MediagateError);
    expect(error).toMatchObject({ status, code, retryAfterMs: 0, clientRequestId: undefined });
    expect(fake.calls).toBe(1);
  });

  it('rejects at once when the request cannot even be built (an invalid baseUrl), without retrying', async () => {
    useFakeClock();
    const { client, fake } = clientWith([], 'not a url');
    let error: unknown;
    void client.waitForVideo('vid_1', { intervalMs: 10, timeoutMs: Infinity }).catch((e: unknown) => (error = e));

    await vi.advanceTimersByTimeAsync(60_000);
    expect(error).toBeInstanceOf(TypeError);
    expect(error).not.toBeInstanceOf(MediagateNetworkError);
    expect(fake.calls).toBe(0);
  });

  it.each([Infinity, 2 ** 31, 2 ** 40])('waits without timing out at once when timeoutMs is %d (on a fake clock)', async (timeoutMs) => {
    useFakeClock();
    const { client, fake } = clientWith([inProgress, inProgress, completed]);
    let result: unknown;
    void client.waitForVideo('vid_1', { intervalMs: 100, timeoutMs }).then((task) => (result = task), (e: unknown) => (result = e));

    await vi.advanceTimersByTimeAsync(200);

    expect(result).toEqual(done);
    fake.assertDone();
    expect(vi.getTimerCount()).toBe(0);
  });

  it('refuses a NaN timeoutMs instead of timing out at once', async () => {
    const { client, fake } = clientWith([]);

    await expect(client.waitForVideo('vid_1', { timeoutMs: Number.NaN })).rejects.toBeInstanceOf(RangeError);
    expect(fake.calls).toBe(0);
  });
});

describe('createVideo through passing failures', () => {
  const videoBody: VideoCreateRequest = {
    prompt: 'A paper boat drifting down a rainy street',
    model: 'local-video-1',
    seconds: 8,
    aspectRatio: '16:9',
    resolution: '720p',
  };
  const create = (respond: Exchange['respond'], body: unknown = { ...videoBody, client_request_id: expect.stringMatching(UUID) }): Exchange => ({
    method: 'POST',
    path: '/v1/videos/generations',
    body,
    respond,
  });
  const created = () => jsonResponse(202, videoTaskCreated());
  /** The one client_request_id every request carried. */
  const sentIds = (bodies: unknown[]) => [...new Set(bodies.map((b) => (b as { client_request_id: string }).client_request_id))];

  it('sends the request again with the same client_request_id after a passing 503 or 429, after its Retry-After', async () => {
    const { client, fake } = clientWith([
      create(failure(503, 'database_unavailable', '0')),
      create(failure(429, 'too_many_in_flight', '0')),
      create(created),
    ]);

    const result = await client.createVideo(videoBody);

    expect(result).toEqual({ data: videoTaskCreated() });
    expect(fake.bodies).toHaveLength(3);
    expect(sentIds(fake.bodies)).toEqual([expect.stringMatching(UUID)]);
    fake.assertDone();
  });

  it.each(['not_ready', 'server_busy', 'storage_unavailable'] as const)('retries a 503 %s', async (code) => {
    const { client, fake } = clientWith([create(failure(503, code, '0')), create(created)]);

    expect(await client.createVideo(videoBody)).toEqual({ data: videoTaskCreated() });
    fake.assertDone();
  });

  it('sends the request again with the same client_request_id when no answer came (the create may have been committed)', async () => {
    useFakeClock();
    const { client, fake } = clientWith([create(noAnswer('ECONNRESET')), create(created)]);
    let result: unknown;
    void client.createVideo(videoBody).then((r) => (result = r), (e: unknown) => (result = e));

    // Not at once: the first pause is at least 250 ms (500 ms, jittered).
    await vi.advanceTimersByTimeAsync(200);
    expect([fake.calls, result]).toEqual([1, undefined]);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(result).toEqual({ data: videoTaskCreated() });
    expect(fake.bodies).toHaveLength(2);
    expect(sentIds(fake.bodies)).toEqual([expect.stringMatching(UUID)]);
    fake.assertDone();
  });

  it('returns the last passing failure after maxRetries, with the client_request_id sent and its retryAfterMs', async () => {
    const { client, fake } = clientWith([
      create(failure(503, 'database_unavailable', '0')),
      create(failure(503, 'database_unavailable', '0')),
      create(failure(503, 'database_unavailable', '0')),
    ]);

    const result = await client.createVideo(videoBody);

    expect(result.error).toBeInstanceOf(MediagateError);
    expect(sentIds(fake.bodies)).toHaveLength(1);
    expect(result.error).toMatchObject({ status: 503, code: 'database_unavailable', retryAfterMs: 0, clientRequestId: sentIds(fake.bodies)[0] });
    fake.assertDone();
  });

  it('rejects with a MediagateNetworkError carrying the client_request_id when no answer came after maxRetries', async () => {
    useFakeClock();
    const { client, fake } = clientWith([create(noAnswer('ECONNREFUSED')), create(noAnswer('ECONNREFUSED')), create(noAnswer('ECONNREFUSED'))]);
    let error: unknown;
    void client.createVideo(videoBody).catch((e: unknown) => (error = e));

    await vi.advanceTimersByTimeAsync(5_000);

    expect(error).toBeInstanceOf(MediagateNetworkError);
    expect(error).toMatchObject({
      name: 'MediagateNetworkError',
      message: expect.stringContaining('ECONNREFUSED'),
      clientRequestId: sentIds(fake.bodies)[0],
      cause: expect.any(TypeError),
    });
    expect(fake.bodies).toHaveLength(3);
    fake.assertDone();
  });

  it('retries nothing with maxRetries 0, and still exposes the id (the caller may retry with it)', async () => {
    const body = { ...videoBody, clientRequestIdRequired: 'mine-1' };
    const { client, fake } = clientWith([create(noAnswer('ECONNRESET'), body), create(failure(503, 'not_ready', '0'), body)]);

    const error = await client.createVideo(body, { maxRetries: 0 }).catch((e: unknown) => e);
    expect(error).toMatchObject({ name: 'MediagateNetworkError', clientRequestId: 'mine-1' });

    const result = await client.createVideo(body, { maxRetries: 0 });
    expect(result.error).toMatchObject({ status: 503, code: 'not_ready', clientRequestId: 'mine-1' });
    fake.assertDone();
  });

  it.each([
    [503, 'no_reachable_member'],
    [503, 'capability_disabled'],
    [500, 'internal_error'],
    [402, 'insufficient_balance'],
    [409, 'idempotency_conflict'],
    [400, 'unsupported_duration'],
  ] as const)('returns a %i %s at once, with the client_request_id', async (status, code) => {
    const { client, fake } = clientWith([create(failure(status, code, '0'))]);

    const result = await client.createVideo(videoBody);

    expect(result.error).toMatchObject({ status, code, clientRequestId: sentIds(fake.bodies)[0] });
    expect(fake.calls).toBe(1);
  });

  it('returns a Retry-After over a minute to the caller instead of waiting (on a fake clock)', async () => {
    useFakeClock();
    const { client, fake } = clientWith([create(failure(507, 'storage_full', '120'))]);
    let result: { error?: unknown } | undefined;
    void client.createVideo(videoBody).then((r) => (result = r));

    // No time passes: the answer is returned, not waited out.
    await vi.advanceTimersByTimeAsync(0);

    expect(result?.error).toMatchObject({ status: 507, code: 'storage_full', retryAfterMs: 120_000, clientRequestId: sentIds(fake.bodies)[0] });
    expect(fake.calls).toBe(1);
  });

  it('keeps the same client_request_id through a quote change and a passing failure', async () => {
    const fresh = billingRow({ quoteToken: 'q1.fresh.token' });
    const { client, fake } = clientWith([
      create(() => jsonResponse(409, quoteConflictBody('quote_stale', fresh)), { ...videoBody, quote_token: 'q1.old', client_request_id: expect.stringMatching(UUID) }),
      create(failure(503, 'database_unavailable', '0'), { ...videoBody, quote_token: 'q1.fresh.token', client_request_id: expect.stringMatching(UUID) }),
      create(created, { ...videoBody, quote_token: 'q1.fresh.token', client_request_id: expect.stringMatching(UUID) }),
    ]);

    const result = await client.createVideo({ ...videoBody, quote_token: 'q1.old' }, { onQuoteChange: () => true });

    expect(result).toEqual({ data: videoTaskCreated() });
    expect(sentIds(fake.bodies)).toHaveLength(1);
    fake.assertDone();
  });

  it("stops at once when the caller's signal aborts during the pause before a retry", async () => {
    useFakeClock();
    const controller = new AbortController();
    const { client, fake } = clientWith([create(noAnswer('ECONNRESET')), create(created)]);
    let error: unknown;
    void client.createVideo(videoBody, { signal: controller.signal }).catch((e: unknown) => (error = e));

    await vi.advanceTimersByTimeAsync(100);
    controller.abort();
    await vi.advanceTimersByTimeAsync(0);

    expect(error).toMatchObject({ name: 'AbortError' });
    expect(fake.calls).toBe(1);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('refuses a maxRetries that is not a number of retries', async () => {
    const { client, fake } = clientWith([]);

    await expect(client.createVideo(videoBody, { maxRetries: Number.NaN })).rejects.toBeInstanceOf(RangeError);
    expect(fake.calls).toBe(0);
  });
});

describe('uploadFile through passing failures', () => {
  const fileObject = {
    id: 'file_01JTXK4D2M8Q6N3V5B7C9E1F2G', object: 'file', purpose: 'input', filename: 'frame.png', bytes: 7, content_type: 'image/png',
    width: 1, height: 1, created_at: '2026-03-01T12:00:00Z', expires_at: '2026-03-08T12:00:00Z', task_id: null,
  };
  const bytes = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a]);

  /** A fake fetch for `POST /v1/files` that reads each multipart body and answers from `answers` in turn. */
  function uploads(answers: (() => Response)[]) {
    const forms: { fields: [string, string][]; file: { name: string; bytes: number[] } | undefined }[] = [];
    const fetch = async (request: Request): Promise<Response> => {
      request.signal.throwIfAborted();
      expect(`${request.method} ${request.url}`).toBe(`POST ${BASE_URL}/v1/files`);
      expect(request.headers.get('authorization')).toBe(`Bearer ${API_KEY}`);
      expect(request.headers.get('content-type')).toMatch(/^multipart\/form-data; boundary=/);
      const form = await request.formData();
      const entries = [...form.entries()];
      const file = form.get('file');
      forms.push({
        fields: entries.filter(([, v]) => typeof v === 'string') as [string, string][],
        file: file instanceof Blob ? { name: (file as File).name, bytes: [...new Uint8Array(await file.arrayBuffer())] } : undefined,
      });
      // The file part comes last: the server reads the fields before the bytes it stores.
      expect(entries.at(-1)?.[0]).toBe('file');
      const answer = answers.shift();
      if (answer === undefined) throw new Error('unexpected upload');
      return answer();
    };
    return { client: createMediagateClient({ baseUrl: BASE_URL, apiKey: API_KEY, fetch }), forms };
  }

  it('sends the fields and the file, named after the File, with the expiry when given', async () => {
    const { client, forms } = uploads([() => jsonResponse(201, fileObject), () => jsonResponse(201, fileObject)]);
    expect(await client.uploadFile(new File([bytes], 'frame.png', { type: 'image/png' }))).toEqual({ data: fileObject });
    expect(await client.uploadFile(new Blob([bytes]), { expiresAfterSeconds: 3_600 })).toEqual({ data: fileObject });
    expect(forms).toEqual([
      { fields: [['purpose', 'input']], file: { name: 'frame.png', bytes: [...bytes] } },
      { fields: [['purpose', 'input'], ['expires_after[anchor]', 'created_at'], ['expires_after[seconds]', '3600']], file: { name: 'upload', bytes: [...bytes] } },
    ]);
  });

  it('sends the whole file again after a 429, 503 storage_unavailable or 507, after its Retry-After', async () => {
    const { client, forms } = uploads([
      failure(429, 'too_many_in_flight', '0'),
      failure(503, 'storage_unavailable', '0'),
      failure(507, 'storage_full', '0'),
      () => jsonResponse(201, fileObject),
    ]);
    expect(await client.uploadFile(new Blob([bytes]), { filename: 'a.png', maxRetries: 3 })).toEqual({ data: fileObject });
    expect(forms.map((f) => f.file)).toEqual(Array.from({ length: 4 }, () => ({ name: 'a.png', bytes: [...bytes] })));
  });

  it('returns a failure that does not pass at once, and the last passing one after maxRetries', async () => {
    const refused = uploads([failure(400, 'invalid_image')]);
    const result = await refused.client.uploadFile(new Blob([bytes]));
    expect(result.error).toBeInstanceOf(MediagateError);
    expect(result.error).toMatchObject({ status: 400, code: 'invalid_image' });
    expect(refused.forms).toHaveLength(1);

    const busy = uploads([failure(429, 'too_many_in_flight', '0'), failure(429, 'too_many_in_flight', '0')]);
    expect((await busy.client.uploadFile(new Blob([bytes]), { maxRetries: 1 })).error).toMatchObject({ status: 429, code: 'too_many_in_flight', retryAfterMs: 0 });
    expect(busy.forms).toHaveLength(2);
  });

  it('never sends again an upload that got no answer (the server may have stored it): a MediagateNetworkError', async () => {
    let calls = 0;
    const client = createMediagateClient({ baseUrl: BASE_URL, apiKey: API_KEY, fetch: async () => (calls++, noAnswer('ECONNRESET')()) });
    const error: unknown = await client.uploadFile(new Blob([bytes])).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(MediagateNetworkError);
    expect(calls).toBe(1);
  });

  it('refuses an expiry that is not a whole number of seconds, and a maxRetries that is not a number of retries, before sending', async () => {
    const { client, forms } = uploads([]);
    await expect(client.uploadFile(new Blob([bytes]), { expiresAfterSeconds: 3_600.5 })).rejects.toThrow(RangeError);
    await expect(client.uploadFile(new Blob([bytes]), { maxRetries: Number.NaN })).rejects.toThrow(RangeError);
    expect(forms).toHaveLength(0);
  });
});
