/**
 * Video completion webhooks through the public API (product spec §6.2): a receiver on loopback
 * over real TLS (the tests allow private targets and trust the test CA), signatures verified with
 * the `standardwebhooks` package itself, the outbox body equal to the task lookup, the retry
 * schedule, 410, refused targets at send time, secret rotation with two signatures, the admin view
 * and redelivery.
 */
import { createServer as createHttpServer, type IncomingHttpHeaders, type Server as HttpServer } from 'node:http';
import { createServer as createTcpServer, type AddressInfo } from 'node:net';
import { randomUUID } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { verifyWebhook } from '../../clients/typescript/index.ts';
import type { ResolvedAddress } from '../../server/lib/safe-fetch.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { VideoProvider } from '../../server/providers/types.ts';
import { instantVideoProvider } from '../fakes/providers.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until, waitVideoFinished } from '../support/tasks.ts';
import { TEST_CA, startHttpsReceiver } from '../support/tls.ts';
import { adminCli } from '../support/admin-cli.ts';

/** A receiver whose answers the tests script: a status per incoming request (then 200). */
let answers: number[] = [];
let receiver: Awaited<ReturnType<typeof startHttpsReceiver>>;
let server: TestServer;
/** Names the injected resolver knows (everything else fails to resolve). */
const dns: Record<string, ResolvedAddress[]> = { 'receiver.test': [{ address: '127.0.0.1', family: 4 }] };
const lookups: string[] = [];
const resolve = async (host: string) => {
  lookups.push(host);
  const found = dns[host];
  if (!found) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
  return found;
};

/** Finishes every job at its first poll; a prompt with "fail-me" fails. */
function videoProvider(): VideoProvider {
  const mp4 = Buffer.concat([Buffer.from([0, 0, 0, 24]), Buffer.from('ftypisom'), Buffer.alloc(2048, 1)]);
  const instant = instantVideoProvider(mp4);
  return {
    ...instant,
    poll: async (account, id, job, signal) =>
      job.prompt.includes('fail-me') ? { state: 'failed', error: new ProviderError('failed', 'The upstream rejected the prompt.') } : instant.poll(account, id, job, signal),
  };
}

beforeAll(async () => {
  receiver = await startHttpsReceiver((_req, res) => {
    res.writeHead(answers.shift() ?? 200, { 'content-type': 'text/plain' });
    res.end('ok');
  });
  server = await startTestServer({
    workers: true,
    env: { ALLOW_PRIVATE_TARGETS: '1', WEBHOOK_RETRY_SCHEDULE_MS: '150,300,450', WEBHOOK_TIMEOUT_MS: '2000' },
    overrides: { outboundFetch: { resolve, ca: TEST_CA }, providers: { local: { video: videoProvider() } } },
  });
  await seedCatalog(server.db);
});
afterAll(async () => {
  await server?.close();
  await receiver?.close();
});
beforeEach(() => {
  answers = [];
});

const hookUrl = (path = '/hook') => `https://receiver.test:${receiver.port}${path}`;

async function createVideo(key: string, overrides: Record<string, unknown> = {}) {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: randomUUID(), prompt: 'a lighthouse', model: 'local-video-lite', seconds: 2, aspectRatio: '16:9', resolution: '360p', callback_url: hookUrl(), ...overrides }),
  });
  expect(res.status).toBe(202);
  return ((await res.json()) as { id: string }).id;
}

/** `npm run admin -- …` on the test server's database (in this process: test/support/admin-cli.ts). */
function cli(...args: string[]) {
  return adminCli(args, { DATABASE_URL: server.config.databaseUrl!, MEDIAGATE_SECRET_KEY: server.secretKey.toString('hex') });
}

/** The requests the receiver got for a path. */
const received = (path = '/hook') => receiver.requests.filter((r) => r.path === path);

async function deliveryOf(taskId: string) {
  const { data, response } = await server.admin().GET('/admin/v1/tasks/{task_id}/webhook', { params: { path: { task_id: taskId } } });
  expect(response.status).toBe(200);
  return data!.delivery;
}

const finished = async (taskId: string) => until(async () => {
  const d = await deliveryOf(taskId);
  return d && d.status !== 'pending' ? d : undefined;
});

async function secretOf(key: string) {
  const { data } = await server.client(key).GET('/v1/webhooks/secret');
  return data!;
}

describe('video webhooks', () => {
  it('delivers the task lookup once, signed per Standard Webhooks, after the task completes', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = received().length;
    const id = await createVideo(c.key);
    const { task } = await waitVideoFinished(server, c.key, id);
    const delivery = await finished(id);
    expect(delivery).toMatchObject({ status: 'delivered', event_type: 'video.completed', url: hookUrl(), next_attempt_at: null });
    expect(delivery.attempts).toEqual([expect.objectContaining({ status_code: 200, error_class: null, next_retry_at: null })]);
    const [req] = received().slice(before);
    expect(received().length).toBe(before + 1);
    expect(req!.method).toBe('POST');
    expect(req!.headers['content-type']).toBe('application/json');
    expect(req!.headers['webhook-id']).toBe(delivery.webhook_id);

    // The standardwebhooks package verifies it with the account's secret; another secret does not.
    const { secret } = await secretOf(c.key);
    const body = req!.body.toString('utf8');
    const headers = { 'webhook-id': String(req!.headers['webhook-id']), 'webhook-timestamp': String(req!.headers['webhook-timestamp']), 'webhook-signature': String(req!.headers['webhook-signature']) };
    const payload = new Webhook(secret).verify(body, headers) as Record<string, unknown>;
    expect(() => new Webhook(`whsec_${Buffer.alloc(32, 7).toString('base64')}`).verify(body, headers)).toThrow();
    // The client helper agrees.
    expect(verifyWebhook(req!.body, req!.headers as Record<string, string>, secret).id).toBe(id);
    // Also with the names in the case a framework may keep (`Webhook-Id`), as standardwebhooks takes them.
    const capitalized = Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.replace(/(^|-)w|(-)(i|t|s)/g, (m) => m.toUpperCase()), v]));
    expect(Object.keys(capitalized)).toEqual(['Webhook-Id', 'Webhook-Timestamp', 'Webhook-Signature']);
    expect(verifyWebhook(body, capitalized, secret).id).toBe(id);

    // The body is the lookup object (its video_url is signed for longer: compare it apart).
    const { video_url: hookVideoUrl, data: _d, ...rest } = payload as { video_url: string; data: unknown };
    const { video_url: lookupVideoUrl, data: _l, ...lookup } = task as unknown as { video_url: string; data: unknown };
    expect(rest).toEqual(lookup);
    expect(new URL(hookVideoUrl).pathname).toBe(new URL(lookupVideoUrl).pathname);
    const video = await fetch(`${server.directUrl}${new URL(hookVideoUrl).pathname}${new URL(hookVideoUrl).search}`);
    expect(video.status).toBe(200);
    await video.arrayBuffer();
  });

  it('sends a failed task with its error, and nothing for a task without callback_url', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const id = await createVideo(c.key, { prompt: 'please fail-me' });
    const { task } = await waitVideoFinished(server, c.key, id);
    expect(task.status).toBe('failed');
    const delivery = await finished(id);
    expect(delivery.event_type).toBe('video.failed');
    const req = received().find((r) => r.headers['webhook-id'] === delivery.webhook_id)!;
    expect(JSON.parse(req.body.toString())).toMatchObject({ id, status: 'failed', error: { message: 'The upstream rejected the prompt.' } });
    const plain = await createVideo(c.key, { callback_url: undefined });
    await waitVideoFinished(server, c.key, plain);
    expect(await deliveryOf(plain)).toBeNull();
  });

  it('retries on the schedule with the same webhook-id until the receiver accepts', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    answers = [503, 500];
    const path = '/retry';
    const id = await createVideo(c.key, { callback_url: hookUrl(path) });
    const delivery = await finished(id);
    expect(delivery.status).toBe('delivered');
    expect(delivery.attempts.map((a) => a.status_code)).toEqual([503, 500, 200]);
    expect(delivery.attempts.map((a) => a.next_retry_at === null)).toEqual([false, false, true]);
    const got = received(path);
    expect(new Set(got.map((r) => r.headers['webhook-id']))).toEqual(new Set([delivery.webhook_id]));
    // The schedule says 150 ms, then 300 ms (plus up to 10 %).
    const gaps = got.slice(1).map((r, i) => r.receivedAt - got[i]!.receivedAt);
    expect(gaps[0]).toBeGreaterThanOrEqual(140);
    expect(gaps[1]).toBeGreaterThanOrEqual(290);
    // Timestamps are per attempt; each attempt's signature verifies on its own.
    const { secret } = await secretOf(c.key);
    for (const r of got) new Webhook(secret).verify(r.body.toString(), r.headers as Record<string, string>);
  });

  it('gives up after the last retry, and stops at once on 410 Gone', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    answers = [500, 502, 503, 504];
    const failing = await createVideo(c.key, { callback_url: hookUrl('/down') });
    const failed = await finished(failing);
    expect(failed.status).toBe('failed');
    expect(failed.attempts.map((a) => a.status_code)).toEqual([500, 502, 503, 504]);
    expect(failed.attempts.at(-1)!.next_retry_at).toBeNull();

    answers = [410];
    const gone = await createVideo(c.key, { callback_url: hookUrl('/gone') });
    const stopped = await finished(gone);
    expect(stopped.status).toBe('gone');
    await new Promise((r) => setTimeout(r, 600));
    expect(received('/gone')).toHaveLength(1);
  });

  it('retries a receiver whose answer is not HTTP (a status outside 100–599) as a failed attempt', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    answers = [999];
    const id = await createVideo(c.key, { callback_url: hookUrl('/not-http') });
    const delivery = await finished(id);
    expect(delivery.status).toBe('delivered');
    expect(delivery.attempts).toEqual([
      expect.objectContaining({ status_code: null, error_class: 'protocol_error', error: "the receiver's answer is not valid HTTP (status 999)", next_retry_at: expect.any(String) }),
      expect.objectContaining({ status_code: 200, error_class: null, error: null, next_retry_at: null }),
    ]);
    expect(delivery.last_error).toBeNull();
  });

  it('shows why a delivery the gateway could not run was given up without an attempt', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    await secretOf(c.key);
    // A secret the server cannot open (MEDIAGATE_SECRET_KEY changed, say): no delivery can be signed.
    await server.db.updateTable('webhookSecrets').set({ secretCiphertext: Buffer.from('x') }).where('accountId', '=', c.accountId).execute();
    const id = await createVideo(c.key, { callback_url: hookUrl('/unsigned') });
    const delivery = await finished(id);
    expect(delivery).toMatchObject({ status: 'failed', attempts: [], last_error: 'the delivery could not be run: encrypted secret is truncated' });
    expect(received('/unsigned')).toHaveLength(0);
    const { data } = await server.admin().GET('/admin/v1/webhook-deliveries', { params: { query: { account_id: c.accountId } } });
    expect(data!.data.map((d) => [d.status, d.last_error])).toEqual([['failed', 'the delivery could not be run: encrypted secret is truncated']]);
    const shown = await cli('webhooks', 'show', id);
    expect(shown.code).toBe(0);
    expect(shown.stdout).toMatch(/^last_error +the delivery could not be run: encrypted secret is truncated$/m);
  });

  it('counts attempts by outcome in the metrics', async () => {
    const text = await server.ctx.metrics.registry.getSingleMetricAsString('mediagate_webhook_attempts_total');
    expect(text).toMatch(/outcome="delivered"} [1-9]/);
    expect(text).toMatch(/outcome="http_error"} [1-9]/);
    expect(text).toMatch(/outcome="gone"} 1/);
  });

  it('refuses at send time a target that does not resolve, and follows no redirect', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const lost = await createVideo(c.key, { callback_url: 'https://nowhere.test/hook' });
    const d = await until(async () => {
      const x = await deliveryOf(lost);
      return x && x.attempts.length > 0 ? x : undefined;
    });
    expect(d.attempts[0]).toMatchObject({ status_code: null, error_class: 'dns_failure' });

    answers = [302];
    const redirected = await createVideo(c.key, { callback_url: hookUrl('/moved') });
    const r = await until(async () => {
      const x = await deliveryOf(redirected);
      return x && x.attempts.length > 0 ? x : undefined;
    });
    expect(r.attempts[0]!.status_code).toBe(302);
    expect(r.status).toBe('pending');
  });

  it('signs with both secrets during a rotation overlap', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const old = await secretOf(c.key);
    expect(await secretOf(c.key)).toEqual(old); // stable until rotated
    const { data: rotated } = await server.client(c.key).POST('/v1/webhooks/secret/rotate');
    expect(rotated!.secret).not.toBe(old.secret);
    expect(Date.parse(rotated!.previous_secret_expires_at!) - Date.now()).toBeGreaterThan(86_000_000);
    const id = await createVideo(c.key, { callback_url: hookUrl('/rotated') });
    const delivery = await finished(id);
    const req = received('/rotated').find((r) => r.headers['webhook-id'] === delivery.webhook_id)!;
    const signatures = String(req.headers['webhook-signature']).split(' ');
    expect(signatures).toHaveLength(2);
    for (const secret of [old.secret, rotated!.secret]) new Webhook(secret).verify(req.body.toString(), req.headers as Record<string, string>);
    // Another account has its own secret.
    const other = await createCustomer(server.db, { balance: 1 });
    expect((await secretOf(other.key)).secret).not.toBe(rotated!.secret);
  });

  it('lets an operator send a delivered webhook again, same id and body', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const id = await createVideo(c.key, { callback_url: hookUrl('/again') });
    const first = await finished(id);
    const { data, response } = await server.admin().POST('/admin/v1/tasks/{task_id}/webhook/redeliver', { params: { path: { task_id: id } } });
    expect(response.status).toBe(200);
    expect(data!.delivery!.status).toBe('pending');
    await until(() => (received('/again').length === 2 ? true : undefined));
    const [a, b] = received('/again');
    expect(b!.headers['webhook-id']).toBe(first.webhook_id);
    expect(b!.body.equals(a!.body)).toBe(true);
    const plain = await createVideo(c.key, { callback_url: undefined });
    await waitVideoFinished(server, c.key, plain);
    const none = await server.admin().POST('/admin/v1/tasks/{task_id}/webhook/redeliver', { params: { path: { task_id: plain } } });
    expect([none.response.status, none.error?.error.code]).toEqual([409, 'no_webhook']);
    const unknown = await server.admin().GET('/admin/v1/tasks/{task_id}/webhook', { params: { path: { task_id: 'vid_unknown' } } });
    expect(unknown.response.status).toBe(404);

    // The CLI shows the same delivery with both attempts, and redelivers.
    const shown = await cli('webhooks', 'show', id, '--json');
    expect(shown.code).toBe(0);
    const view = JSON.parse(shown.stdout) as { delivery: { webhook_id: string; attempts: unknown[] } };
    expect(view.delivery.webhook_id).toBe(first.webhook_id);
    expect(view.delivery.attempts).toHaveLength(2);
    const again = await cli('webhooks', 'redeliver', id, '--json');
    expect([again.code, (JSON.parse(again.stdout) as { delivery: { status: string } }).delivery.status]).toEqual([0, 'pending']);
    await until(() => (received('/again').length === 3 ? true : undefined));
    const none2 = await cli('webhooks', 'redeliver', plain);
    expect(none2.code).not.toBe(0);
    expect(none2.stderr).toContain('no_webhook');
  });
});

describe('video webhooks without private targets', () => {
  let strict: TestServer;
  /** A name with 40 unique-local addresses (each one refused). */
  const manyPrivate: ResolvedAddress[] = Array.from({ length: 40 }, (_, i) => ({ address: `fd00:1234:5678:9abc:def0:1234:5678:${(0x1000 + i).toString(16)}`, family: 6 }));
  beforeAll(async () => {
    strict = await startTestServer({
      workers: true,
      env: { WEBHOOK_RETRY_SCHEDULE_MS: '100' },
      // A public-looking name whose DNS answer is loopback (rebinding), and one with a private address among public ones.
      overrides: {
        outboundFetch: {
          ca: TEST_CA,
          resolve: async (host) =>
            host === 'rebind.example'
              ? [{ address: '127.0.0.1', family: 4 }]
              : host === 'many.example'
                ? manyPrivate
                : [
                    { address: '93.184.215.14', family: 4 },
                    { address: '10.1.2.3', family: 4 },
                  ],
        },
        providers: { local: { video: videoProvider() } },
      },
    });
    await seedCatalog(strict.db);
  });
  afterAll(async () => strict?.close());

  it('refuses at send time a host that resolves to a private address, before connecting', async () => {
    const c = await createCustomer(strict.db, { balance: 10 });
    const before = receiver.requests.length;
    for (const host of ['rebind.example', 'mixed.example']) {
      const res = await fetch(`${strict.directUrl}/v1/videos/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ client_request_id: randomUUID(), prompt: 'x', model: 'local-video-lite', seconds: 2, aspectRatio: '16:9', resolution: '360p', callback_url: `https://${host}:${receiver.port}/hook` }),
      });
      expect(res.status).toBe(202);
      const { id } = (await res.json()) as { id: string };
      const delivery = await until(async () => {
        const { data } = await strict.admin().GET('/admin/v1/tasks/{task_id}/webhook', { params: { path: { task_id: id } } });
        return data?.delivery && data.delivery.status !== 'pending' ? data.delivery : undefined;
      });
      // Refused targets fail at once: no retry can make them public.
      expect(delivery.status).toBe('failed');
      expect(delivery.attempts).toEqual([expect.objectContaining({ status_code: null, error_class: 'blocked_address', next_retry_at: null })]);
      expect(delivery.attempts[0]!.error).toMatch(/127\.0\.0\.1|10\.1\.2\.3/);
    }
    expect(receiver.requests.length).toBe(before);
  });

  it('shows the operator a refused name with many addresses in every admin view, the addresses counted', async () => {
    const c = await createCustomer(strict.db, { balance: 10 });
    const res = await fetch(`${strict.directUrl}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ client_request_id: randomUUID(), prompt: 'x', model: 'local-video-lite', seconds: 2, aspectRatio: '16:9', resolution: '360p', callback_url: 'https://many.example/hook' }),
    });
    expect(res.status).toBe(202);
    const { id } = (await res.json()) as { id: string };
    const error = "refused target: 'many.example' resolves to 40 addresses, first: fd00:1234:5678:9abc:def0:1234:5678:1000 (uniqueLocal), not a public address";
    const delivery = await until(async () => {
      const { data, response } = await strict.admin().GET('/admin/v1/tasks/{task_id}/webhook', { params: { path: { task_id: id } } });
      expect(response.status).toBe(200);
      return data?.delivery && data.delivery.status !== 'pending' ? data.delivery : undefined;
    });
    expect(delivery).toMatchObject({ status: 'failed', last_error: error, attempts: [expect.objectContaining({ error_class: 'blocked_address', error })] });
    const list = await strict.admin().GET('/admin/v1/webhook-deliveries', { params: { query: { account_id: c.accountId } } });
    expect([list.response.status, list.data!.data[0]!.attempts[0]!.error]).toEqual([200, error]);
    const task = await strict.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: id } } });
    expect([task.response.status, task.data!.webhook!.attempts[0]!.error]).toEqual([200, error]);
  });
});

describe('webhooks in development (ALLOW_PRIVATE_TARGETS=1)', () => {
  /** A plain http receiver on this machine, as a developer runs one. */
  let plain: HttpServer;
  let plainStatus = 204;
  const got: { headers: IncomingHttpHeaders; body: string }[] = [];
  beforeAll(async () => {
    plain = createHttpServer((req, res) => {
      let body = '';
      req.on('data', (d: Buffer) => (body += d.toString()));
      req.on('end', () => {
        got.push({ headers: req.headers, body });
        res.writeHead(plainStatus).end();
      });
    });
    await new Promise<void>((r) => plain.listen(0, '127.0.0.1', r));
  });
  afterAll(() => new Promise<void>((r) => plain.close(() => r())));
  const plainUrl = () => `http://127.0.0.1:${(plain.address() as AddressInfo).port}/webhooks/mediagate`;
  const secretOf = async (key: string) => (await server.client(key).GET('/v1/webhooks/secret')).data!.secret;

  it('delivers a task\'s webhook to an http:// callback_url on this machine', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = got.length;
    const id = await createVideo(c.key, { callback_url: plainUrl() });
    await until(() => got.length > before, 10_000, 'the webhook');
    const delivered = got[before]!;
    const payload = new Webhook(await secretOf(c.key)).verify(delivered.body, delivered.headers as Record<string, string>) as { id: string; status: string };
    expect(payload).toMatchObject({ id, status: 'completed' });
  });

  it('POST /v1/webhooks/test sends a signed test event at once and answers with the receiver\'s status', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const before = got.length;
    const { data, response } = await server.client(c.key).POST('/v1/webhooks/test', { body: { url: plainUrl() } });
    expect(response.status).toBe(200);
    expect(data).toEqual({
      object: 'webhook_test',
      url: plainUrl(),
      event_type: 'video.completed',
      webhook_id: expect.stringMatching(/^msg_/),
      task_id: expect.stringMatching(/^vid_test_/),
      delivered: true,
      status_code: 204,
      error: null,
      latency_ms: expect.any(Number),
    });
    expect(got).toHaveLength(before + 1);
    const sent = got[before]!;
    expect(sent.headers['webhook-id']).toBe(data!.webhook_id);
    // Signed with the account's secret, as a real event: the standardwebhooks library accepts it.
    const payload = new Webhook(await secretOf(c.key)).verify(sent.body, sent.headers as Record<string, string>) as Record<string, unknown>;
    expect(payload).toMatchObject({ object: 'video.task', id: data!.task_id, status: 'completed', model: 'webhook-test', video_url: expect.any(String) });
    // Nothing was created or charged.
    expect(await server.db.selectFrom('videoTasks').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
    expect((await server.client(c.key).GET('/v1/credits')).data!.account.balance).toBe(10);

    const failed = await server.client(c.key).POST('/v1/webhooks/test', { body: { url: plainUrl(), event_type: 'video.failed' } });
    const failedBody = got.at(-1)!;
    expect(failed.data!.event_type).toBe('video.failed');
    expect(JSON.parse(failedBody.body)).toMatchObject({ status: 'failed', error: { message: expect.stringContaining('test event') } });
  });

  it('reports a receiver that fails or cannot be reached, without retrying', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    plainStatus = 500;
    try {
      const before = got.length;
      const failing = await server.client(c.key).POST('/v1/webhooks/test', { body: { url: plainUrl() } });
      expect(failing.data).toMatchObject({ delivered: false, status_code: 500, error: { class: null, message: 'the receiver answered HTTP 500' } });
      await new Promise((r) => setTimeout(r, 400)); // longer than the test schedule's first retry
      expect(got).toHaveLength(before + 1);
    } finally {
      plainStatus = 204;
    }
    const closed = await server.client(c.key).POST('/v1/webhooks/test', { body: { url: 'http://127.0.0.1:9/hook' } });
    expect(closed.data).toMatchObject({ delivered: false, status_code: null, error: { class: 'connect_failed' } });
  });

  it('reports a receiver whose answer is not HTTP (a status outside 100–599) as a protocol error', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    for (const status of ['999', '000']) {
      const raw = createTcpServer((socket) => socket.once('data', () => socket.end(`HTTP/1.1 ${status} Weird\r\ncontent-length: 0\r\n\r\n`)));
      await new Promise<void>((r) => raw.listen(0, '127.0.0.1', r));
      try {
        const { data, response } = await server.client(c.key).POST('/v1/webhooks/test', { body: { url: `http://127.0.0.1:${(raw.address() as AddressInfo).port}/hook` } });
        expect(response.status, status).toBe(200);
        expect(data).toMatchObject({ delivered: false, status_code: null, error: { class: 'protocol_error', message: `the receiver's answer is not valid HTTP (status ${Number(status)})` } });
      } finally {
        raw.close();
      }
    }
  });

  /** A receiver on this machine that answers every request with a switch of protocols (101 with Upgrade) and keeps the socket. */
  async function switchingReceiver() {
    const raw = createTcpServer((socket) => {
      socket.on('error', () => undefined);
      socket.once('data', () => socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n'));
    });
    await new Promise<void>((r) => raw.listen(0, '127.0.0.1', r));
    return { url: `http://127.0.0.1:${(raw.address() as AddressInfo).port}/hook`, close: () => raw.close() };
  }

  // A hang shows as the test's own timeout (Node's client drops a 101 with Upgrade without an event).
  it('reports a receiver that switches protocols (101 with Upgrade) as a protocol error', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const raw = await switchingReceiver();
    try {
      const { data, response } = await server.client(c.key).POST('/v1/webhooks/test', { body: { url: raw.url } });
      expect(response.status).toBe(200);
      expect(data).toMatchObject({ delivered: false, status_code: null, error: { class: 'protocol_error', message: 'the receiver switched protocols (HTTP 101), which the request did not ask for' } });
    } finally {
      raw.close();
    }
  }, 10_000);

  it('records a delivery to a receiver that switches protocols as failed attempts, and gives it up after the schedule', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const raw = await switchingReceiver();
    try {
      const id = await createVideo(c.key, { callback_url: raw.url });
      const delivery = await finished(id);
      expect(delivery.status).toBe('failed');
      expect(delivery.attempts.map((a) => [a.status_code, a.error_class])).toEqual(Array.from({ length: 4 }, () => [null, 'protocol_error']));
    } finally {
      raw.close();
    }
  }, 20_000);

  it('still refuses plain http to any other host, and a URL that is not one', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    for (const url of [`http://receiver.test:${receiver.port}/hook`, 'ftp://127.0.0.1/hook']) {
      const res = await fetch(`${server.directUrl}/v1/webhooks/test`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' }, body: JSON.stringify({ url }) });
      expect(res.status).toBe(400);
      expect(((await res.json()) as { error: unknown }).error).toMatchObject({ code: 'invalid_callback_url', param: 'url' });
    }
  });
});
