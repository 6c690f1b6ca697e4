/**
 * A client's own limits (issue 32, item 1) through the public and admin APIs and the CLI:
 * requests per minute (x-ratelimit-* headers, 429 rate_limited with Retry-After, a refused request
 * costing nothing) and generations in flight (429 too_many_in_flight; exact under concurrency),
 * per key and per account, the operator's defaults, and `null` / `"default"` / N through the admin
 * API and `--rpm` / `--max-in-flight` through the CLI. No task engine runs here, so a video task
 * stays `queued` (in flight) and a `respond-async` image stays `processing` until the test ends it.
 */
import { sql } from 'kysely';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { flakyImageProvider } from '../fakes/providers.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';
import { adminCli } from '../support/admin-cli.ts';

let server: TestServer;
let png: Buffer;

beforeAll(async () => {
  png = await sharp({ create: { width: 64, height: 64, channels: 3, background: '#345678' } }).png().toBuffer();
  // Synchronous images take 300 ms each: long enough to be seen in flight.
  server = await startTestServer({ overrides: { providers: { local: { image: flakyImageProvider({ delayMs: 300 }) } } } });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

const VIDEO = { prompt: 'a boat', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' };
let seq = 0;

async function post(key: string, path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.directUrl}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, body: text ? (JSON.parse(text.startsWith('{') ? text : '{}') as { error?: { code: string; message: string; type: string } }) : {}, text };
}

const video = (key: string, extra: Record<string, unknown> = {}) => post(key, '/v1/videos/generations', { ...VIDEO, client_request_id: `lim-${++seq}`, ...extra });
const asyncImage = (key: string) => post(key, '/v1/images/generations', { model: 'local-image-1', prompt: `lim ${++seq}` }, { Prefer: 'respond-async' });

async function admin(method: 'POST' | 'PATCH' | 'GET', path: string, body?: unknown) {
  const res = await fetch(`${server.directUrl}${path}`, {
    method,
    headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> & { error?: { code: string; param: string | null } } };
}

const setKey = (id: string, limits: Record<string, unknown>) => admin('PATCH', `/admin/v1/api-keys/${id}`, limits);
const setAccount = (id: string, limits: Record<string, unknown>) => admin('PATCH', `/admin/v1/accounts/${id}`, limits);

/** What the account has been charged and holds, and what it has created. */
async function footprint(accountId: string) {
  const count = async (table: 'videoTasks' | 'imageTasks' | 'creditHolds' | 'ledgerEntries' | 'files') =>
    (await server.db.selectFrom(table).select(sql<number>`count(*)::int`.as('n')).where('accountId', '=', accountId).executeTakeFirstOrThrow()).n;
  const account = await server.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', accountId).executeTakeFirstOrThrow();
  const key = await server.db.selectFrom('apiKeys').select(sql<number>`sum(credits_used)::bigint`.as('used')).where('accountId', '=', accountId).executeTakeFirstOrThrow();
  return {
    balance: account.balance,
    spent: account.totalSpent,
    keyUsed: Number(key.used),
    videos: await count('videoTasks'),
    images: await count('imageTasks'),
    holds: await count('creditHolds'),
    ledger: await count('ledgerEntries'),
    files: await count('files'),
  };
}

function rateHeaders(h: Headers) {
  return { limit: h.get('x-ratelimit-limit-requests'), remaining: h.get('x-ratelimit-remaining-requests'), reset: h.get('x-ratelimit-reset-requests') };
}

describe('requests per minute', () => {
  it('counts a key down in the headers, then answers 429 rate_limited with Retry-After; the refused request costs nothing', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    expect((await setKey(c.apiKeyId, { requests_per_minute: 3 })).status).toBe(200);

    const remaining: (string | null)[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await video(c.key);
      expect(res.status).toBe(202);
      const h = rateHeaders(res.headers);
      expect(h.limit).toBe('3');
      expect(h.reset).toMatch(/^(\d+ms|\d+(\.\d+)?s|1m0s)$/);
      remaining.push(h.remaining);
    }
    expect(remaining).toEqual(['2', '1', '0']);
    const before = await footprint(c.accountId);

    // A data URL input: refused before the body is read, so nothing of it is stored either.
    const refused = await video(c.key, { firstFrame: `data:image/png;base64,${png.toString('base64')}` });
    expect(refused.status).toBe(429);
    expect(refused.body.error).toMatchObject({ code: 'rate_limited', type: 'rate_limit_error' });
    expect(refused.body.error!.message).toMatch(/^This API key has used its 3 requests per minute \(generations, uploads and webhook tests\); retry in \d+ s\.$/);
    const retryAfter = Number(refused.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(60);
    expect(rateHeaders(refused.headers)).toMatchObject({ limit: '3', remaining: '0' });
    // Images (JSON, streamed, edits) share the key's bucket.
    expect((await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'x', stream: true })).status).toBe(429);
    const form = new FormData();
    form.append('model', 'local-image-1');
    form.append('prompt', 'edit');
    form.append('image', new Blob([png], { type: 'image/png' }), 'in.png');
    const edit = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    expect(edit.status).toBe(429);
    expect(((await edit.json()) as { error: { code: string } }).error.code).toBe('rate_limited');
    expect(await footprint(c.accountId)).toEqual(before);

    // Other operations are not generations: never limited, no headers.
    const credits = await fetch(`${server.directUrl}/v1/credits`, { headers: { Authorization: `Bearer ${c.key}` } });
    expect(credits.status).toBe(200);
    expect(credits.headers.get('x-ratelimit-limit-requests')).toBeNull();

    // Raising the limit applies to the window already begun (the count is kept).
    await setKey(c.apiKeyId, { requests_per_minute: 5 });
    const more = await video(c.key);
    expect(more.status).toBe(202);
    expect(rateHeaders(more.headers)).toMatchObject({ limit: '5', remaining: '1' });
  });

  it("an account's limit spans its keys and names the account; a request the account refuses does not use its key's tokens", async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const other = await admin('POST', '/admin/v1/api-keys', { account_id: c.accountId, name: 'second', group_id: c.groupId, requests_per_minute: 10 });
    expect(other.status).toBe(201);
    const otherKey = other.body.key as string;
    expect(other.body).toMatchObject({ requests_per_minute: 10, max_in_flight: 'default' });
    expect((await setAccount(c.accountId, { requests_per_minute: 2 })).body).toMatchObject({ requests_per_minute: 2, max_in_flight: 'default' });

    const first = await video(c.key);
    expect(first.status).toBe(202);
    expect(rateHeaders(first.headers)).toMatchObject({ limit: '2', remaining: '1' });
    const second = await video(otherKey);
    expect(second.status).toBe(202);
    // The account's bucket (0 left of 2) is closer to empty than the key's (9 of 10).
    expect(rateHeaders(second.headers)).toMatchObject({ limit: '2', remaining: '0' });
    const refused = await video(otherKey);
    expect(refused.status).toBe(429);
    expect(refused.body.error!.message).toMatch(/^This API key's account has used its 2 requests per minute \(generations, uploads and webhook tests\); retry in \d+ s\.$/);

    // The account opens up: the key has 9 left, not 8 (the refused request took nothing).
    await setAccount(c.accountId, { requests_per_minute: null });
    const after = await video(otherKey);
    expect(after.status).toBe(202);
    expect(rateHeaders(after.headers)).toMatchObject({ limit: '10', remaining: '8' });
    expect((await footprint(c.accountId)).videos).toBe(3);
  });

  it('sends no x-ratelimit headers when neither the key nor its account has a limit', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await video(c.key);
    expect(res.status).toBe(202);
    expect(rateHeaders(res.headers)).toEqual({ limit: null, remaining: null, reset: null });
  });

  it('puts the headers on a synchronous image, an event stream and an error response alike', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    await setKey(c.apiKeyId, { requests_per_minute: 10 });
    const sync = await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'sync' });
    expect(sync.status).toBe(200);
    expect(rateHeaders(sync.headers)).toMatchObject({ limit: '10', remaining: '9' });
    const stream = await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'stream', stream: true });
    expect(stream.status).toBe(200);
    expect(stream.headers.get('content-type')).toMatch(/text\/event-stream/);
    expect(stream.text).toContain('image_generation.completed');
    expect(rateHeaders(stream.headers)).toMatchObject({ limit: '10', remaining: '8' });
    const invalid = await post(c.key, '/v1/images/generations', { model: 'no-such-model', prompt: 'x' });
    expect(invalid.status).toBe(404);
    expect(rateHeaders(invalid.headers)).toMatchObject({ limit: '10', remaining: '7' });
  });
});

describe('generations in flight', () => {
  it('a key at its cap gets 429 too_many_in_flight with Retry-After; nothing is created, held, charged or kept', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    expect((await setKey(c.apiKeyId, { max_in_flight: 2 })).body).toMatchObject({ max_in_flight: 2, requests_per_minute: 'default' });
    expect((await video(c.key)).status).toBe(202);
    expect((await asyncImage(c.key)).status).toBe(202);
    const before = await footprint(c.accountId);

    const refused = await video(c.key, { firstFrame: `data:image/png;base64,${png.toString('base64')}` });
    expect(refused.status).toBe(429);
    expect(refused.headers.get('retry-after')).toBe('1');
    expect(refused.body.error).toMatchObject({ code: 'too_many_in_flight', type: 'rate_limit_error' });
    expect(refused.body.error!.message).toBe('This API key already has 2 generations in flight, its limit; retry when one of them has finished.');
    const image = await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'sync' });
    expect(image.status).toBe(429);
    const form = new FormData();
    form.append('model', 'local-image-1');
    form.append('prompt', 'edit');
    form.append('image', new Blob([png], { type: 'image/png' }), 'in.png');
    const edit = await fetch(`${server.directUrl}/v1/images/edits`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}` }, body: form });
    expect(edit.status).toBe(429);
    // The staged frame and the uploaded image went with their requests.
    await expect.poll(async () => (await footprint(c.accountId)).files, { timeout: 5_000 }).toBe(before.files);
    expect(await footprint(c.accountId)).toEqual(before);

    // A video that ends frees its place.
    await server.db
      .updateTable('videoTasks')
      .set({ status: 'failed', completedAt: new Date(), errorCode: 'test', errorMessage: 'ended by the test' })
      .where('accountId', '=', c.accountId)
      .execute();
    expect((await video(c.key)).status).toBe(202);
    expect((await video(c.key)).status).toBe(429);
  });

  it('counts synchronous images while they are generated, and names the account when its cap is reached', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    expect((await setAccount(c.accountId, { max_in_flight: 1 })).status).toBe(200);
    const slow = post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'slow' });
    await expect.poll(async () => (await footprint(c.accountId)).images, { timeout: 5_000 }).toBe(1);
    const refused = await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'second' });
    expect(refused.status).toBe(429);
    expect(refused.body.error!.message).toBe("This API key's account already has 1 generation in flight, its limit; retry when one of them has finished.");
    expect((await slow).status).toBe(200);
    // Finished: the next one passes.
    expect((await post(c.key, '/v1/images/generations', { model: 'local-image-1', prompt: 'third' })).status).toBe(200);
    expect((await footprint(c.accountId)).images).toBe(2);
  });

  it('applies the caps set while a body was still arriving (read again at the hold), not those of when the key was checked', async () => {
    /** A video whose body arrives in two parts: `meanwhile` runs after the first, then more than a second passes. */
    async function slowVideo(key: string, meanwhile: () => Promise<unknown>) {
      const body = JSON.stringify({ ...VIDEO, client_request_id: `lim-${++seq}` });
      const { request } = await import('node:http');
      return new Promise<number>((resolve, reject) => {
        const req = request(`${server.directUrl}/v1/videos/generations`, {
          method: 'POST',
          headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
        });
        req.on('response', (res) => (res.resume(), resolve(res.statusCode!)));
        req.on('error', reject);
        req.write(body.slice(0, 10));
        void meanwhile()
          .then(() => new Promise((r) => setTimeout(r, 1_200)))
          .then(() => req.end(body.slice(10)), reject);
      });
    }
    const c = await createCustomer(server.db, { balance: 100 });
    expect((await video(c.key)).status).toBe(202);
    // No cap when the key was checked; a cap of 1 (reached) by the time the body has arrived.
    expect(await slowVideo(c.key, () => setKey(c.apiKeyId, { max_in_flight: 1 }))).toBe(429);
    expect((await footprint(c.accountId)).videos).toBe(1);
    // A cap of 1 when the key was checked, lifted while the body arrived.
    expect(await slowVideo(c.key, () => setKey(c.apiKeyId, { max_in_flight: null }))).toBe(202);
    expect((await footprint(c.accountId)).videos).toBe(2);
  });

  it("gives back the request-per-minute token of a request refused for the in-flight cap: retrying after its Retry-After does not spend the minute", async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    expect((await setKey(c.apiKeyId, { max_in_flight: 1, requests_per_minute: 3 })).status).toBe(200);
    const first = await video(c.key);
    expect([first.status, rateHeaders(first.headers).remaining]).toEqual([202, '2']);
    // What the OpenAI SDKs do with a 429 and Retry-After: 1 (twice), and more: each is refused for
    // the cap and takes no token; the header says what the request found (its own token counted).
    for (let i = 0; i < 4; i++) {
      const refused = await video(c.key);
      expect([refused.status, refused.body.error?.code, rateHeaders(refused.headers).remaining]).toEqual([429, 'too_many_in_flight', '1']);
    }
    // The video ends: the next two pass (the minute has 2 of its 3 left), the third is rate-limited.
    await server.db.updateTable('videoTasks').set({ status: 'failed', completedAt: new Date(), errorCode: 'test', errorMessage: 'ended by the test' }).where('accountId', '=', c.accountId).execute();
    expect((await video(c.key)).status).toBe(202);
    await server.db.updateTable('videoTasks').set({ status: 'failed', completedAt: new Date(), errorCode: 'test', errorMessage: 'ended by the test' }).where('accountId', '=', c.accountId).execute();
    expect((await video(c.key)).status).toBe(202);
    expect((await video(c.key)).body.error?.code).toBe('rate_limited');
  });

  it('keeps the token of a request refused for the in-flight cap after its media inputs were read and stored (the rate bounds how often a key can make the server do that)', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    expect((await setKey(c.apiKeyId, { max_in_flight: 1, requests_per_minute: 3 })).status).toBe(200);
    expect((await video(c.key)).status).toBe(202);
    const frame = { firstFrame: `data:image/png;base64,${png.toString('base64')}` };
    expect((await video(c.key, frame)).body.error?.code).toBe('too_many_in_flight');
    expect((await video(c.key, frame)).body.error?.code).toBe('too_many_in_flight');
    // Both refusals spent their token: the minute's 3 are used.
    expect((await video(c.key, frame)).body.error?.code).toBe('rate_limited');
  });

  it("names the cap the hold applied (read again for a body that streamed), not the one of the key's check", async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    expect((await video(c.key)).status).toBe(202);
    const { request } = await import('node:http');
    const body = JSON.stringify({ ...VIDEO, client_request_id: `lim-${++seq}` });
    const refused = await new Promise<string>((resolve, reject) => {
      const req = request(`${server.directUrl}/v1/videos/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
      });
      req.on('response', (res) => {
        let text = '';
        res.on('data', (d: Buffer) => (text += d.toString()));
        res.on('end', () => resolve(text));
      });
      req.on('error', reject);
      req.write(body.slice(0, 10));
      void setKey(c.apiKeyId, { max_in_flight: 1 })
        .then(() => new Promise((r) => setTimeout(r, 1_200)))
        .then(() => req.end(body.slice(10)), reject);
    });
    expect((JSON.parse(refused) as { error: { message: string } }).error.message).toBe('This API key already has 1 generation in flight, its limit; retry when one of them has finished.');
  });

  it('is exact under concurrency: 24 creations at once against a cap of 5 create 5 tasks and charge 5', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    await setKey(c.apiKeyId, { max_in_flight: 5 });
    const results = await Promise.all(Array.from({ length: 24 }, (_, i) => (i % 2 === 0 ? video(c.key) : asyncImage(c.key))));
    const statuses = results.map((r) => r.status);
    expect(statuses.filter((s) => s === 202)).toHaveLength(5);
    expect(statuses.filter((s) => s === 429)).toHaveLength(19);
    expect(results.filter((r) => r.status === 429).every((r) => r.body.error!.code === 'too_many_in_flight')).toBe(true);
    const after = await footprint(c.accountId);
    expect(after.videos + after.images).toBe(5);
    expect(after.holds).toBe(5);
  });
});

describe("the operator's defaults", () => {
  let defaults: TestServer;
  beforeAll(async () => {
    defaults = await startTestServer({ env: { DEFAULT_KEY_RPM: '2', DEFAULT_ACCOUNT_MAX_IN_FLIGHT: '1' } });
    await seedCatalog(defaults.db);
  });
  afterAll(async () => defaults?.close());

  const create = (key: string) =>
    fetch(`${defaults.directUrl}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ ...VIDEO, client_request_id: `def-${++seq}` }),
    });
  const patch = (path: string, body: unknown) =>
    fetch(`${defaults.directUrl}${path}`, { method: 'PATCH', headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });

  it('apply to keys and accounts set to "default"; null lifts them; N replaces them', async () => {
    const c = await createCustomer(defaults.db, { balance: 100 });
    // DEFAULT_ACCOUNT_MAX_IN_FLIGHT=1: the second video is refused, naming the account.
    const first = await create(c.key);
    expect(first.status).toBe(202);
    expect(first.headers.get('x-ratelimit-limit-requests')).toBe('2');
    const second = await create(c.key);
    expect(second.status).toBe(429);
    expect(((await second.json()) as { error: { code: string; message: string } }).error).toMatchObject({ code: 'too_many_in_flight', message: expect.stringContaining("account already has 1 generation") });

    expect((await patch(`/admin/v1/accounts/${c.accountId}`, { max_in_flight: null })).status).toBe(200);
    // Now the key's default of 2 requests per minute: the second request was refused by the
    // in-flight cap and gave its token back, so one is left: the third passes, the fourth does not.
    expect((await create(c.key)).status).toBe(202);
    const fourth = await create(c.key);
    expect(fourth.status).toBe(429);
    expect(((await fourth.json()) as { error: { code: string } }).error.code).toBe('rate_limited');

    expect((await patch(`/admin/v1/api-keys/${c.apiKeyId}`, { requests_per_minute: null })).status).toBe(200);
    const unlimited = await create(c.key);
    expect(unlimited.status).toBe(202);
    expect(unlimited.headers.get('x-ratelimit-limit-requests')).toBeNull();

    const back = (await (await patch(`/admin/v1/api-keys/${c.apiKeyId}`, { requests_per_minute: 'default' })).json()) as Record<string, unknown>;
    expect(back.requests_per_minute).toBe('default');
    const limited = await create(c.key);
    expect(limited.status).toBe(429);
  });
});

describe('admin API', () => {
  it('creates, shows and updates limits as N, null and "default", and refuses anything else', async () => {
    const account = await admin('POST', '/admin/v1/accounts', { name: `limits-${++seq}`, requests_per_minute: 600, max_in_flight: null });
    expect(account.status).toBe(201);
    expect(account.body).toMatchObject({ requests_per_minute: 600, max_in_flight: null });
    const id = account.body.id as string;
    const row = await server.db.selectFrom('accounts').select(['requestsPerMinute', 'maxInFlight']).where('id', '=', id).executeTakeFirstOrThrow();
    expect(row).toEqual({ requestsPerMinute: 600, maxInFlight: 0 });
    expect((await admin('GET', `/admin/v1/accounts/${id}`)).body).toMatchObject({ requests_per_minute: 600, max_in_flight: null });
    expect((await setAccount(id, { requests_per_minute: 'default', max_in_flight: 7 })).body).toMatchObject({ requests_per_minute: 'default', max_in_flight: 7 });

    for (const bad of [0, -1, 1.5, 1_000_001, 'none', '10']) {
      const res = await setAccount(id, { requests_per_minute: bad });
      expect(res.status, String(bad)).toBe(400);
      expect(res.body.error).toMatchObject({ code: 'invalid_request' });
    }
    expect((await setAccount(id, { max_in_flight: 100_001 })).status).toBe(400);

    const group = (await createCustomer(server.db)).groupId;
    const key = await admin('POST', '/admin/v1/api-keys', { account_id: id, name: 'k', group_id: group, max_in_flight: 3 });
    expect(key.status, JSON.stringify(key.body)).toBe(201);
    expect(key.body).toMatchObject({ requests_per_minute: 'default', max_in_flight: 3 });
    const listed = await admin('GET', `/admin/v1/api-keys?account_id=${id}`);
    expect((listed.body.data as Record<string, unknown>[])[0]).toMatchObject({ requests_per_minute: 'default', max_in_flight: 3 });
    expect((await setKey(key.body.id as string, { max_in_flight: 0 })).status).toBe(400);
  });
});

describe('admin CLI', { timeout: 90_000 }, () => {
  /** `npm run admin -- …` on the server's database (in this process: test/support/admin-cli.ts). */
  const cli = (...args: string[]) => adminCli(args, { DATABASE_URL: server.config.databaseUrl!, MEDIAGATE_SECRET_KEY: server.secretKey.toString('hex') });

  it('sets and unsets limits with --rpm and --max-in-flight (N, none, default), shown by get', async () => {
    const name = `cli-limits-${++seq}`;
    const created = await cli('accounts', 'create', '--name', name, '--rpm', '120', '--json');
    expect(created.code).toBe(0);
    expect(JSON.parse(created.stdout)).toMatchObject({ requests_per_minute: 120, max_in_flight: 'default' });
    const updated = await cli('accounts', 'update', name, '--rpm', 'none', '--max-in-flight', '4', '--json');
    expect(JSON.parse(updated.stdout)).toMatchObject({ requests_per_minute: null, max_in_flight: 4 });
    const shown = await cli('accounts', 'get', name);
    // No limit prints as '-' (the CLI's null), the operator's default as 'default'.
    expect(shown.stdout).toMatch(/requests_per_minute\s+-\n/);
    expect(shown.stdout).toMatch(/max_in_flight\s+4/);

    const account = JSON.parse(created.stdout) as { id: string };
    const c = await createCustomer(server.db);
    const key = await cli('keys', 'create', '--account', account.id, '--name', 'cli', '--group', c.groupId, '--rpm', '30', '--max-in-flight', 'none');
    expect(key.code).toBe(0);
    expect(key.stdout).toMatch(/requests_per_minute\s+30/);
    const keyId = /^id\s+(key_\S+)/m.exec(key.stdout)![1]!;
    const back = await cli('keys', 'update', keyId, '--rpm', 'default', '--json');
    expect(JSON.parse(back.stdout)).toMatchObject({ requests_per_minute: 'default', max_in_flight: null });
    const row = await server.db.selectFrom('apiKeys').select(['requestsPerMinute', 'maxInFlight']).where('id', '=', keyId).executeTakeFirstOrThrow();
    expect(row).toEqual({ requestsPerMinute: null, maxInFlight: 0 });

    const bad = await cli('keys', 'update', keyId, '--rpm', '0');
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--rpm must be at least 1');
  });
});
