/**
 * A request refused before its body is read (a missing, unknown or inactive API key; the
 * requests-per-minute gate) does not have that body read after the answer: the answer says
 * `Connection: close` and the server closes the connection soon after, instead of reading and
 * discarding up to the whole declared length to keep a keep-alive connection open. And the
 * credentials read before the body take the `Bearer` scheme in any case (RFC 7235), the admin and
 * metrics tokens as API keys.
 */
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;

const METRICS_TOKEN = 'test-metrics-token-0123456789abcdef';

beforeAll(async () => {
  server = await startTestServer({ env: { METRICS_TOKEN } });
});
afterAll(async () => server?.close());

const MiB = 1024 * 1024;
/** What each request announces. */
const DECLARED = 200 * MiB;
/**
 * Where the client gives up writing: a server still reading by then reads the whole body. After the
 * answer the server reads on only for its linger (2 s, http/request-guards.ts), at most 25 MiB at the
 * client's pace.
 */
const CAP = 64 * MiB;
const CHUNK = Buffer.alloc(64 * 1024, 0x20);

interface Refusal {
  /** The answer's head and body, as received. */
  answer: string;
  /** Bytes of body the client wrote before the server dropped the connection (or CAP). */
  written: number;
  /** Whether the server dropped the connection before the client wrote CAP bytes. */
  closedByServer: boolean;
}

/**
 * POSTs a JSON body announcing DECLARED bytes on a keep-alive connection and keeps writing it, one
 * chunk per timer turn whenever the socket takes it (at most 64 KiB per 5 ms), until the server drops
 * the connection or CAP bytes are written. What the server read is at most `written`.
 */
function refusedUpload(path: string, authorization: string): Promise<Refusal> {
  const url = new URL(server.directUrl);
  return new Promise((resolve) => {
    let answer = '';
    let written = 0;
    let done = false;
    // Half-open allowed: the client goes on writing after the server's FIN, as a client busy sending
    // its body would, until the server drops the connection.
    const socket = connect({ port: Number(url.port), host: url.hostname, allowHalfOpen: true });
    const finish = (closedByServer: boolean) => {
      if (done) return;
      done = true;
      socket.destroy();
      resolve({ answer, written, closedByServer });
    };
    socket.on('data', (d: Buffer) => (answer += d.toString('latin1')));
    socket.on('error', () => finish(true));
    socket.on('close', () => finish(true));
    socket.write(
      `POST ${path} HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nAuthorization: ${authorization}\r\nContent-Type: application/json\r\nContent-Length: ${DECLARED}\r\n\r\n{"prompt":"`,
    );
    const pump = () => {
      if (done) return;
      if (written >= CAP) return finish(false);
      if (!socket.writableNeedDrain) {
        written += CHUNK.length;
        socket.write(CHUNK);
      }
      setTimeout(pump, 5);
    };
    pump();
  });
}

/** The refusal was answered, then the server closed the connection long before the body's end. */
function expectClosedEarly(refusal: Refusal, statusLine: string, code: string): void {
  const [head = '', body = ''] = refusal.answer.split('\r\n\r\n');
  expect(head.split('\r\n')[0]).toBe(statusLine);
  expect((JSON.parse(body) as { error: { code: string } }).error.code).toBe(code);
  expect(refusal).toMatchObject({ closedByServer: true });
  expect(refusal.written).toBeLessThan(CAP);
  expect(head.toLowerCase()).toContain('\r\nconnection: close');
}

describe('a request refused before its body is read', () => {
  it('401 invalid_api_key: the connection closes instead of the body being read to its end', async () => {
    const refusal = await refusedUpload('/v1/videos/generations', 'Bearer sk-not-a-key');
    expectClosedEarly(refusal, 'HTTP/1.1 401 Unauthorized', 'invalid_api_key');
  });

  it('403 api_key_inactive: the same', async () => {
    const c = await createCustomer(server.db, { isActive: false });
    const res = await fetch(`${server.directUrl}/v1/credits`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(res.status).toBe(403);
    const refusal = await refusedUpload('/v1/images/generations', `Bearer ${c.key}`);
    expectClosedEarly(refusal, 'HTTP/1.1 403 Forbidden', 'api_key_inactive');
  });

  it('429 rate_limited: the same', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const patched = await fetch(`${server.directUrl}/admin/v1/api-keys/${c.apiKeyId}`, {
      method: 'PATCH',
      headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ requests_per_minute: 1 }),
    });
    expect(patched.status).toBe(200);
    // The one request of the minute (the gate counts it before its body is read; the body is invalid).
    const first = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: '{}',
    });
    expect(first.status).toBe(400);
    expect(first.headers.get('x-ratelimit-remaining-requests')).toBe('0');

    const refusal = await refusedUpload('/v1/images/generations', `Bearer ${c.key}`);
    expectClosedEarly(refusal, 'HTTP/1.1 429 Too Many Requests', 'rate_limited');
  });

  it('a refusal of a small body keeps the connection alive (its few bytes are read, not a reason to close)', async () => {
    // Two requests sent at once on one connection: both are answered on it.
    const url = new URL(server.directUrl);
    const socket = connect(Number(url.port), url.hostname);
    const answers: string[] = [];
    let received = '';
    const twoAnswers = new Promise<void>((resolve) =>
      socket.on('data', (d: Buffer) => {
        received += d.toString('latin1');
        const parts = received.split(/(?=HTTP\/1\.1 )/);
        if (parts.length === 2 && /\r\n\r\n\{.*\}$/s.test(parts[1]!)) {
          answers.push(...parts);
          resolve();
        }
      }),
    );
    const request = `POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-not-a-key\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`;
    socket.write(request + request);
    await twoAnswers;
    socket.destroy();
    for (const answer of answers) {
      expect(answer.split('\r\n')[0]).toBe('HTTP/1.1 401 Unauthorized');
      expect(answer.toLowerCase()).not.toContain('\r\nconnection: close');
    }
  });
});

describe('the Bearer scheme in any case', () => {
  it('admin token: `bearer` on an admin read (the validator) and `BEARER` on an admin write (before its body)', async () => {
    const read = await fetch(`${server.directUrl}/admin/v1/accounts`, { headers: { Authorization: `bearer ${ADMIN_TOKEN}` } });
    expect(read.status).toBe(200);
    const write = await fetch(`${server.directUrl}/admin/v1/accounts`, {
      method: 'POST',
      headers: { Authorization: `BEARER  ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ name: 'bearer-case' }),
    });
    expect([write.status, ((await write.json()) as { name?: string }).name]).toEqual([201, 'bearer-case']);
    // Still the token itself, whatever the scheme's case.
    const wrong = await fetch(`${server.directUrl}/admin/v1/accounts`, { headers: { Authorization: `bearer ${ADMIN_TOKEN}x` } });
    expect([wrong.status, ((await wrong.json()) as { error: { code: string } }).error.code]).toEqual([401, 'invalid_admin_token']);
    const basic = await fetch(`${server.directUrl}/admin/v1/accounts`, { headers: { Authorization: `Basic ${ADMIN_TOKEN}` } });
    expect(basic.status).toBe(401);
  });

  it('metrics token: `bearer` is accepted', async () => {
    const res = await fetch(`${server.directUrl}/metrics`, { headers: { Authorization: `bearer ${METRICS_TOKEN}` } });
    expect(res.status).toBe(200);
  });
});
