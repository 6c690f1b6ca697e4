import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProviderError } from '../../server/providers/provider-error.ts';
import { openaiError } from '../../server/providers/openai/openai-errors.ts';
import { StorageUnavailable } from '../../server/storage/storage-error.ts';
import { readJson, readJsonWithMedia, retryAfterMs, sanitizeMessage, upstreamFetch, upstreamUrl, UpstreamResponse } from '../../server/providers/upstream-http.ts';

const json = (status: number, body: unknown, headers: Record<string, string> = {}) =>
  new UpstreamResponse(status, { 'content-type': 'application/json', ...headers }, Readable.from([Buffer.from(typeof body === 'string' ? body : JSON.stringify(body))]));

describe('retryAfterMs', () => {
  it('reads retry-after-ms, retry-after seconds and HTTP dates, capped at an hour', () => {
    expect(retryAfterMs(new Headers({ 'retry-after-ms': '1500', 'retry-after': '9' }))).toBe(1500);
    expect(retryAfterMs(new Headers({ 'retry-after': '7' }))).toBe(7000);
    const now = Date.parse('2026-11-23T00:00:00Z');
    expect(retryAfterMs(new Headers({ 'retry-after': 'Mon, 23 Nov 2026 00:00:30 GMT' }), now)).toBe(30_000);
    expect(retryAfterMs(new Headers({ 'retry-after': '999999' }))).toBe(3_600_000);
    expect(retryAfterMs(new Headers({ 'retry-after': 'soon' }))).toBeUndefined();
    expect(retryAfterMs(new Headers())).toBeUndefined();
  });
});

describe('sanitizeMessage', () => {
  it('keeps the reason and drops URLs, keys and bearer tokens', () => {
    const out = sanitizeMessage('Bad  thing\nat https://x.example/a?sig=s3cr3t with sk-proj-abcdefghijklmnop and Bearer abc.def', 'fallback');
    expect(out).toBe('Bad thing at [url] with [redacted] and Bearer [redacted]');
    expect(sanitizeMessage(undefined, 'fallback')).toBe('fallback');
    // Other vendors' key shapes: Replicate, fal (`<key id>:<secret>`), a JWT (MiniMax keys, Kling's signed tokens).
    const jwt = 'eyJhbGciOiJIUzI1NiJ9.eyJpc3MiOiJhayJ9.c2lnbmF0dXJlMDEyMzQ1';
    expect(sanitizeMessage(`token r8_AbCdEfGh0123456789 / 1b2c3d4e-0000-4a4a-8b8b-123456789abc:0123456789abcdef0123456789abcdef / ${jwt} rejected`, 'f')).toBe(
      'token [redacted] / [redacted] / [redacted] rejected',
    );
    expect(sanitizeMessage('x'.repeat(1000), 'f')).toHaveLength(300);
  });
});

describe('upstreamUrl', () => {
  it("joins the member's base URL or the provider default with the path", () => {
    expect(upstreamUrl({ memberId: 'm', provider: 'openai', baseUrl: 'http://127.0.0.1:9/v1/', credentials: {}, modelMap: {} }, '/videos')).toBe('http://127.0.0.1:9/v1/videos');
    expect(upstreamUrl({ memberId: 'm', provider: 'openai', baseUrl: null, credentials: {}, modelMap: {} }, 'videos')).toBe('https://api.openai.com/v1/videos');
  });
});

describe('UpstreamResponse.text', () => {
  it('reads a short answer whole and refuses one past its byte cap as retryable', async () => {
    const chunked = (sizes: number[]) => new UpstreamResponse(200, {}, Readable.from(sizes.map((n) => Buffer.alloc(n, 0x61))));
    expect(await chunked([3, 4]).text(7)).toBe('aaaaaaa');
    const err = await chunked([4, 4]).text(7).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    expect([(err as ProviderError).kind, (err as ProviderError).message]).toEqual(['retryable', 'the upstream answered more than 7 bytes where a short JSON answer was expected']);
  });
});

describe('openaiError', () => {
  const envelope = (code: string | null, type: string, message = 'upstream says no') => ({ error: { message, type, param: null, code } });

  it('classifies rate limits, exhausted quota, credentials, policy, invalid requests and server errors', async () => {
    const limited = await openaiError(json(429, envelope('rate_limit_exceeded', 'requests'), { 'retry-after': '3' }), 'call');
    expect([limited.kind, limited.retryAfterMs, limited.transient]).toEqual(['rate_limited', 3000, true]);
    const quota = await openaiError(json(429, envelope('insufficient_quota', 'insufficient_quota')), 'call');
    expect([quota.kind, quota.transient]).toEqual(['quota_exhausted', false]);
    const auth = await openaiError(json(401, envelope('invalid_api_key', 'invalid_request_error', 'Incorrect API key provided: sk-abc***xyz')), 'call');
    expect(auth.kind).toBe('auth');
    expect(auth.message).not.toContain('sk-');
    const policy = await openaiError(json(400, envelope('moderation_blocked', 'image_generation_user_error', 'Your request was rejected by the safety system.')), 'call');
    expect([policy.kind, policy.message]).toEqual(['policy', 'Your request was rejected by the safety system.']);
    const invalid = await openaiError(json(400, envelope('invalid_type', 'invalid_request_error', "Invalid type for 'seconds'")), 'call');
    expect([invalid.kind, invalid.upstreamCode]).toEqual(['invalid_request', 'invalid_type']);
    const server = await openaiError(json(503, '<html>bad gateway</html>'), 'video submit');
    expect([server.kind, server.message]).toEqual(['retryable', 'the upstream video submit failed with HTTP 503']);
    const gateway = await openaiError(json(400, { error: 'model not found' }), 'call');
    expect([gateway.kind, gateway.message]).toEqual(['invalid_request', 'model not found']);
  });
});

describe('upstreamFetch', () => {
  let base = '';
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('latin1');
      if (req.url === '/echo') {
        res.setHeader('content-type', 'application/json');
        res.setHeader('x-multi', ['a', 'b']);
        res.end(JSON.stringify({ method: req.method, contentType: req.headers['content-type'], authorization: req.headers.authorization, body }));
      } else if (req.url === '/moved') {
        res.writeHead(302, { location: '/echo' }).end('moved');
      } else if (req.url === '/moved-post') {
        res.writeHead(307, { location: '/echo' }).end();
      } else if (req.url === '/see-other') {
        res.writeHead(303, { location: '/echo' }).end();
      } else if (req.url === '/elsewhere') {
        // Same host, another port: another origin.
        res.writeHead(302, { location: `${otherBase}/collect` }).end();
      } else if (req.url === '/loop') {
        res.writeHead(302, { location: '/loop' }).end();
      } else if (req.url === '/slow') {
        setTimeout(() => res.end('late'), 500);
      } else if (req.url === '/drip') {
        // Four parts 150 ms apart: 450 ms in all, never a pause of 300 ms.
        let n = 0;
        const next = () => (n < 4 ? res.write('abcd'[n++]!, () => setTimeout(next, 150)) : res.end());
        next();
      } else if (req.url?.startsWith('/cut/') || req.url?.startsWith('/hang/')) {
        // The status line and a part of the body, then the connection is lost (cut) or goes quiet (hang).
        const status = Number(req.url.split('/')[2]);
        res.writeHead(status, { 'content-type': 'application/json', 'content-length': '500', ...(status === 429 && { 'retry-after': '7' }) });
        res.write('{"error":{"code":"InternalServiceError"');
        if (req.url.startsWith('/cut/')) setTimeout(() => res.socket?.destroy(), 20);
      } else res.writeHead(404).end('no');
    });
  });
  // Another origin a redirect may point at: it records what reaches it.
  let otherBase = '';
  const reachedOther: IncomingMessage['headers'][] = [];
  const other = createServer((req, res) => {
    reachedOther.push(req.headers);
    res.end('collected');
  });
  beforeAll(async () => {
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    await new Promise<void>((resolve) => other.listen(0, '127.0.0.1', resolve));
    otherBase = `http://127.0.0.1:${(other.address() as AddressInfo).port}`;
  });
  afterAll(() => {
    server.closeAllConnections();
    server.close();
    other.closeAllConnections();
    other.close();
  });
  const signal = new AbortController().signal;

  it('sends JSON and FormData bodies and reads status, headers and body', async () => {
    const res = await upstreamFetch(`${base}/echo`, { method: 'POST', headers: { Authorization: 'Bearer k', 'content-type': 'application/json' }, body: '{"a":1}' }, signal, 'call');
    expect([res.status, res.ok, res.headers.get('Content-Type'), res.headers.get('x-multi'), res.headers.get('absent')]).toEqual([200, true, 'application/json', 'a, b', null]);
    expect(await readJson(res)).toEqual({ method: 'POST', contentType: 'application/json', authorization: 'Bearer k', body: '{"a":1}' });

    const form = new FormData();
    form.set('seconds', '4');
    form.set('input_reference', new Blob([Buffer.from('PNGDATA')], { type: 'image/png' }), 'first_frame.png');
    const sent = (await readJson(await upstreamFetch(`${base}/echo`, { method: 'POST', body: form }, signal, 'call'))) as { contentType: string; body: string };
    const boundary = /^multipart\/form-data; boundary=(.+)$/.exec(sent.contentType)?.[1];
    expect(boundary).toBeTruthy();
    expect(sent.body).toContain('name="seconds"\r\n\r\n4\r\n');
    expect(sent.body).toContain('name="input_reference"; filename="first_frame.png"\r\nContent-Type: image/png\r\n\r\nPNGDATA\r\n');
  });

  it("throws the request body's own failure as it is (the gateway's store, not the upstream), never as maybe accepted", async () => {
    let served = 0;
    const failure = new StorageUnavailable('input/ab/file', Object.assign(new Error('S3 answered 503 SlowDown'), { code: 'SlowDown' }));
    let n = 0;
    const body = new Readable({
      read() {
        if (n++ === 0) this.push(Buffer.alloc(1000, 97));
        else this.destroy(failure);
      },
    });
    const err = await upstreamFetch(`${base}/echo`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': '5000' }, body, timeoutMs: 3000 }, signal, 'video submit').then(
      () => (served++, undefined),
      (e: unknown) => e,
    );
    expect(served).toBe(0);
    expect(err).toBe(failure);
  });

  it('classifies a connection the upstream reset during a streamed upload as its failure (a ProviderError), not the body\'s', async () => {
    // Reads the head and some of the body, then resets the connection (a load balancer dropping it mid-upload).
    const resetting = createNetServer((sock) => {
      let got = 0;
      sock.on('data', (d) => {
        got += d.length;
        if (got > 2000) sock.resetAndDestroy();
      });
      sock.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => resetting.listen(0, '127.0.0.1', resolve));
    try {
      let sent = 0;
      const body = new Readable({
        read() {
          if (sent >= 200_000) return void this.push(null);
          sent += 1000;
          setTimeout(() => this.push(Buffer.alloc(1000, 97)), 5);
        },
      });
      const url = `http://127.0.0.1:${(resetting.address() as AddressInfo).port}/submit`;
      const err = await upstreamFetch(url, { method: 'POST', headers: { 'content-length': '200000' }, body, timeoutMs: 5000 }, signal, 'video submit').then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(ProviderError);
      expect([(err as ProviderError).kind, (err as ProviderError).message]).toEqual(['retryable', 'the upstream video submit could not be reached']);
    } finally {
      resetting.close();
    }
  });

  it('a call that timed out before its streamed body was all read was not accepted; one that timed out after it may have been', async () => {
    // Takes the connection, never reads (a long upload that outlives the call's time limit) ...
    const stalled = createNetServer((sock) => {
      sock.pause();
      sock.on('error', () => undefined);
    });
    // ... or reads the whole body and never answers (the upstream has the request).
    const silent = createNetServer((sock) => {
      sock.resume();
      sock.on('error', () => undefined);
    });
    await Promise.all([stalled, silent].map((s) => new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve))));
    const send = async (server: typeof stalled, bytes: number) => {
      const body = Readable.from((function* () {
        for (let sent = 0; sent < bytes; sent += 64 * 1024) yield Buffer.alloc(64 * 1024, 97);
      })());
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/submit`;
      return (await upstreamFetch(url, { method: 'POST', headers: { 'content-length': String(bytes) }, body, timeoutMs: 500 }, signal, 'video submit').then(
        () => undefined,
        (e: unknown) => e,
      )) as ProviderError;
    };
    try {
      const cut = await send(stalled, 64 * 1024 * 1024);
      expect([cut.kind, cut.message, cut.maybeAccepted]).toEqual(['retryable', 'the upstream video submit timed out', false]);
      const unanswered = await send(silent, 64 * 1024);
      expect([unanswered.kind, unanswered.message, unanswered.maybeAccepted]).toEqual(['retryable', 'the upstream video submit timed out', true]);
    } finally {
      stalled.close();
      silent.close();
    }
  });

  it('bounds a long upload by its progress, not its total time: the answer\'s limit starts once the body is sent', async () => {
    // Reads the request slowly for its first 1,000 ms (a slow link: a part every few ms), then at
    // once (what the sockets' buffers hold when the sender is done counts toward the answer's
    // time), and answers 200 ms after the body's end: more than the call's 600 ms in all, never a
    // pause that long (300 ms was tight for a pause on a loaded 2-core machine: flaked once).
    const slowReader = createServer((req, res) => {
      const started = Date.now();
      let bytes = 0;
      req.on('data', (chunk: Buffer) => {
        bytes += chunk.byteLength;
        if (Date.now() - started > 1000) return;
        req.pause();
        setTimeout(() => req.resume(), 8);
      });
      req.on('end', () => setTimeout(() => res.end(JSON.stringify({ bytes, readMs: Date.now() - started })), 200));
    });
    await new Promise<void>((resolve) => slowReader.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(slowReader.address() as AddressInfo).port}/submit`;
    try {
      // A streamed body whose source gives a part every 100 ms for 800 ms (a stored input read from S3) ...
      const dripping = Readable.from((async function* () {
        for (let i = 0; i < 8; i++) {
          await new Promise((resolve) => setTimeout(resolve, 100));
          yield Buffer.alloc(1024, 97);
        }
      })());
      const streamed = (await readJson(await upstreamFetch(url, { method: 'POST', body: dripping, timeoutMs: 600 }, signal, 'video submit'))) as { bytes: number; readMs: number };
      expect(streamed.bytes).toBe(8 * 1024);
      expect(streamed.readMs).toBeGreaterThan(600);
      // ... and a large buffer (a multipart edit) that the upstream reads slowly.
      const large = Buffer.alloc(24 * 1024 * 1024, 98);
      const sent = (await readJson(await upstreamFetch(url, { method: 'POST', body: large, timeoutMs: 600 }, signal, 'image edit'))) as { bytes: number; readMs: number };
      expect(sent.bytes).toBe(large.byteLength);
      expect(sent.readMs).toBeGreaterThan(1000);
      // ... and a large text body (Gemini's JSON with its inputs inlined) the same way.
      const text = 'c'.repeat(24 * 1024 * 1024);
      const sentText = (await readJson(await upstreamFetch(url, { method: 'POST', body: text, timeoutMs: 600 }, signal, 'image edit'))) as { bytes: number; readMs: number };
      expect(sentText.bytes).toBe(text.length);
      expect(sentText.readMs).toBeGreaterThan(1000);
    } finally {
      slowReader.closeAllConnections();
      slowReader.close();
    }
  });

  it('a large buffer whose upload stalls times out as never accepted; a source that stops giving parts times out too', async () => {
    const stalled = createNetServer((sock) => {
      sock.pause();
      sock.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => stalled.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(stalled.address() as AddressInfo).port}/submit`;
    const failure = (body: Buffer | Readable) => upstreamFetch(url, { method: 'POST', body, timeoutMs: 300 }, signal, 'video submit').then(() => undefined, (e: unknown) => e as ProviderError);
    try {
      const cut = await failure(Buffer.alloc(64 * 1024 * 1024, 97));
      expect([cut?.kind, cut?.message, cut?.maybeAccepted]).toEqual(['retryable', 'the upstream video submit timed out', false]);
      const silentSource = new Readable({ read() {} });
      silentSource.push(Buffer.alloc(1024, 97));
      const started = Date.now();
      const idle = await failure(silentSource);
      expect([idle?.kind, idle?.maybeAccepted, Date.now() - started < 5_000]).toEqual(['retryable', false, true]);
      expect((idle?.cause as Error).message).toBe('the upload made no progress for 300 ms');
    } finally {
      stalled.close();
    }
  });

  it('follows redirects unless asked not to', async () => {
    const followed = await upstreamFetch(`${base}/moved`, {}, signal, 'call');
    expect([followed.status, ((await readJson(followed)) as { method: string }).method]).toEqual([200, 'GET']);
    const manual = await upstreamFetch(`${base}/moved`, { redirect: 'manual' }, signal, 'call');
    expect([manual.status, manual.headers.get('location')]).toEqual([302, '/echo']);
    manual.discard();
    // 307 keeps the method, the body and the credentials (same origin); 303 goes on as a GET without the body.
    const kept = (await readJson(await upstreamFetch(`${base}/moved-post`, { method: 'POST', headers: { 'x-goog-api-key': 'AIza-key', 'content-type': 'application/json' }, body: '{"a":1}' }, signal, 'call'))) as Record<string, unknown>;
    expect(kept).toMatchObject({ method: 'POST', body: '{"a":1}', contentType: 'application/json' });
    const seeOther = (await readJson(await upstreamFetch(`${base}/see-other`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"a":1}' }, signal, 'call'))) as Record<string, unknown>;
    expect(seeOther).toMatchObject({ method: 'GET', body: '' });
    expect(seeOther.contentType).toBeUndefined();
  });

  it('never follows a redirect to another origin: no credential header leaves for it (Gemini sends its key as x-goog-api-key)', async () => {
    const err = await upstreamFetch(`${base}/elsewhere`, { headers: { 'x-goog-api-key': 'AIza-SECRET', Authorization: 'Bearer sk-SECRET' } }, signal, 'video status').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    expect((err as ProviderError).kind).toBe('misconfigured');
    expect((err as ProviderError).message).toContain('redirected to another origin');
    expect(reachedOther).toEqual([]);
    const loop = await upstreamFetch(`${base}/loop`, {}, signal, 'call').catch((e: unknown) => e);
    expect((loop as ProviderError).message).toContain('redirected more than 5 times');
  });

  it('bounds the whole call, its body included, unless the body is handed on as a stream', async () => {
    const res = await upstreamFetch(`${base}/drip`, { timeoutMs: 300 }, signal, 'call');
    const err = await res.text().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    expect([(err as ProviderError).kind, (err as ProviderError).message, (err as ProviderError).maybeAccepted]).toEqual(['retryable', 'the upstream call answered HTTP 200, then its body timed out', true]);
    expect(((err as ProviderError).cause as Error).name).toBe('TimeoutError');
    const handed = await upstreamFetch(`${base}/drip`, { timeoutMs: 300 }, signal, 'call');
    expect((await new Promise<Buffer[]>((resolve, reject) => {
      const chunks: Buffer[] = [];
      handed.stream().on('data', (c: Buffer) => chunks.push(c)).on('end', () => resolve(chunks)).on('error', reject);
    })).map(String).join('')).toBe('abcd');
  });

  it('turns a timeout or an unreachable upstream into a retryable ProviderError, and keeps an abort an abort', async () => {
    const late = await upstreamFetch(`${base}/slow`, { timeoutMs: 100 }, signal, 'video status').catch((e: unknown) => e);
    expect(late).toBeInstanceOf(ProviderError);
    expect([(late as ProviderError).kind, (late as ProviderError).message]).toEqual(['retryable', 'the upstream video status timed out']);
    const closed = await upstreamFetch('http://127.0.0.1:1/x', {}, signal, 'video submit').catch((e: unknown) => e);
    expect([(closed as ProviderError).kind, (closed as ProviderError).message]).toEqual(['retryable', 'the upstream video submit could not be reached']);
    // A timeout may have reached the upstream (the request was sent); a refused connection cannot have.
    expect([(late as ProviderError).maybeAccepted, (closed as ProviderError).maybeAccepted]).toEqual([true, false]);
    const stop = new AbortController();
    const aborted = upstreamFetch(`${base}/slow`, {}, stop.signal, 'call').catch((e: unknown) => e);
    stop.abort(new Error('lease lost'));
    expect(((await aborted) as Error).message).toBe('lease lost');
  });

  describe('an answer whose body breaks off while it is read', () => {
    const cut = async (status: number, read: (res: UpstreamResponse) => Promise<unknown> = readJson) => {
      const res = await upstreamFetch(`${base}/cut/${status}`, {}, signal, 'video submit');
      expect(res.status).toBe(status);
      const err = await read(res).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ProviderError);
      const { kind, message, maybeAccepted, upstreamStatus, retryAfterMs: retryAfter } = err as ProviderError;
      return { kind, message, maybeAccepted, upstreamStatus, retryAfter };
    };

    it('an error status is the upstream\'s refusal, never maybe accepted (the pool fails over, no submit counts as unanswered); what it refused for was in the body: only 429 and 401/403 keep their kind, the rest is a passing failure, never the client\'s', async () => {
      expect(await cut(503)).toEqual({ kind: 'retryable', message: 'the upstream video submit answered HTTP 503, then its body could not be read', maybeAccepted: false, upstreamStatus: 503, retryAfter: undefined });
      expect(await cut(429)).toEqual({ kind: 'rate_limited', message: 'the upstream video submit answered HTTP 429, then its body could not be read', maybeAccepted: false, upstreamStatus: 429, retryAfter: 7000 });
      expect(await cut(400)).toMatchObject({ kind: 'retryable', maybeAccepted: false, upstreamStatus: 400 });
      expect(await cut(422)).toMatchObject({ kind: 'retryable', maybeAccepted: false, upstreamStatus: 422 });
      expect(await cut(401)).toMatchObject({ kind: 'auth', maybeAccepted: false, upstreamStatus: 401 });
      // The same through every reader: text() itself, the media reader, an adapter's error classifier.
      expect(await cut(503, (res) => res.text())).toMatchObject({ kind: 'retryable', maybeAccepted: false, upstreamStatus: 503 });
      expect(await cut(503, (res) => readJsonWithMedia(res, 'video submit'))).toMatchObject({ kind: 'retryable', maybeAccepted: false, upstreamStatus: 503 });
      expect(await cut(503, (res) => openaiError(res, 'video submit'))).toMatchObject({ kind: 'retryable', maybeAccepted: false, upstreamStatus: 503 });
    });

    it('a 2xx is still maybe accepted: the upstream took the request', async () => {
      expect(await cut(200)).toEqual({ kind: 'retryable', message: 'the upstream video submit answered HTTP 200, then its body could not be read', maybeAccepted: true, upstreamStatus: 200, retryAfter: undefined });
      expect(await cut(200, (res) => readJsonWithMedia(res, 'video submit'))).toMatchObject({ kind: 'retryable', maybeAccepted: true });
    });

    it("keeps the caller's abort an abort while an error answer's body is read", async () => {
      const stop = new AbortController();
      const res = await upstreamFetch(`${base}/hang/503`, {}, stop.signal, 'video submit');
      const reading = readJson(res).catch((e: unknown) => e);
      stop.abort(new Error('lease lost'));
      const err = await reading;
      expect(err).not.toBeInstanceOf(ProviderError);
      expect((err as Error).message).toBe('lease lost');
    });
  });
});
