import { request } from 'node:http';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAccount, createApiKey, createCustomer, createGroup, createMember, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until } from '../support/tasks.ts';

let server: TestServer;
const METRICS_TOKEN = 'metrics-token-0123456789abcdef';

beforeAll(async () => {
  server = await startTestServer({ env: { KEY_CACHE_TTL_MS: '0', METRICS_TOKEN } });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

async function rawGet(path: string, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.directUrl}${path}`, { headers });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

describe('authentication (product spec §5)', () => {
  it('answers 401 with one identical body for a missing, malformed or unknown key', async () => {
    const missing = await rawGet('/v1/credits');
    const malformed = await rawGet('/v1/credits', { Authorization: 'Bearer not-a-key' });
    const wrongScheme = await rawGet('/v1/credits', { Authorization: 'Basic abc' });
    const unknown = await rawGet('/v1/credits', { Authorization: 'Bearer mg_0000000000000000000000000000000000' });
    for (const res of [missing, malformed, wrongScheme, unknown]) {
      expect(res.status).toBe(401);
      expect(res.headers.get('www-authenticate')).toBe('Bearer');
      expect(res.text).toBe(missing.text);
    }
    expect(JSON.parse(missing.text)).toEqual({
      error: { message: "Missing or invalid API key. Send 'Authorization: Bearer <API_KEY>'.", type: 'authentication_error', code: 'invalid_api_key', param: null },
    });
  });

  it('checks the key before validating the request', async () => {
    const res = await fetch(`${server.directUrl}/v1/videos/generations`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' });
    expect(res.status).toBe(401);
  });

  it('refuses a large body without a valid key before reading it', async () => {
    for (const path of ['/v1/images/edits', '/v1/videos/generations']) {
      // 20 MiB declared, 64 KiB sent, then the client stalls: only an answer given before reading
      // the body can arrive (reading it would wait for bytes that never come).
      const declared = 20 * 1024 * 1024;
      const sent = 64 * 1024;
      const url = new URL(`${server.directUrl}${path}`);
      const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = request(
          {
            host: url.hostname,
            port: url.port,
            path: url.pathname,
            method: 'POST',
            headers: {
              Authorization: 'Bearer mg_0000000000000000000000000000000000',
              'Content-Type': path.endsWith('edits') ? 'multipart/form-data; boundary=x' : 'application/json',
              'Content-Length': declared,
            },
          },
          (res) => {
            let body = '';
            res.setEncoding('utf8');
            res.on('data', (d: string) => (body += d));
            res.on('end', () => {
              resolve({ status: res.statusCode ?? 0, body });
              req.destroy();
            });
          },
        );
        req.on('error', reject);
        req.write(Buffer.alloc(sent, 0x41));
      });
      expect(answer.status, path).toBe(401);
      expect((JSON.parse(answer.body) as { error: { code: string } }).error.code).toBe('invalid_api_key');
    }
  });

  it('answers 403 api_key_inactive for an inactive key', async () => {
    const c = await createCustomer(server.db, { isActive: false });
    const { response, error } = await server.client(c.key).GET('/v1/credits');
    expect(response.status).toBe(403);
    expect(error?.error.code).toBe('api_key_inactive');
  });

  it('answers 403 account_suspended when the account is suspended', async () => {
    const c = await createCustomer(server.db, { status: 'suspended' });
    const { response, error } = await server.client(c.key).GET('/v1/models');
    expect(response.status).toBe(403);
    expect(error?.error.code).toBe('account_suspended');
  });

  it('records last_used_at in the background, at most once a minute', async () => {
    const c = await createCustomer(server.db);
    const before = await server.db.selectFrom('apiKeys').select('lastUsedAt').where('id', '=', c.apiKeyId).executeTakeFirstOrThrow();
    expect(before.lastUsedAt).toBeNull();
    await server.client(c.key).GET('/v1/credits');
    let first: Date | null = null;
    for (let i = 0; i < 50 && !first; i++) {
      first = (await server.db.selectFrom('apiKeys').select('lastUsedAt').where('id', '=', c.apiKeyId).executeTakeFirstOrThrow()).lastUsedAt;
      if (!first) await new Promise((r) => setTimeout(r, 20));
    }
    expect(first).toBeInstanceOf(Date);
    await server.client(c.key).GET('/v1/credits');
    // A marker instead of a sleep: another key's first request, sent after the second one above. Its
    // (fire-and-forget) write starts after any the second request started: once it shows, a second
    // write of c's has had its turn.
    const marker = await createCustomer(server.db);
    await server.client(marker.key).GET('/v1/credits');
    await until(async () => (await server.db.selectFrom('apiKeys').select('lastUsedAt').where('id', '=', marker.apiKeyId).executeTakeFirstOrThrow()).lastUsedAt, 5_000, "the marker key's last_used_at");
    const second = (await server.db.selectFrom('apiKeys').select('lastUsedAt').where('id', '=', c.apiKeyId).executeTakeFirstOrThrow()).lastUsedAt;
    expect(second?.getTime()).toBe(first!.getTime());
  });

  it('never stores or logs the full key', async () => {
    const c = await createCustomer(server.db);
    await server.client(c.key).GET('/v1/credits');
    await server.client(c.key.slice(0, -1) + (c.key.endsWith('a') ? 'b' : 'a')).GET('/v1/credits');
    await rawGet('/v1/models', { Authorization: `Bearer ${c.key}x` });
    await rawGet('/v1/nope', { Authorization: `Bearer ${c.key}` });
    const logs = server.logs.join('\n');
    expect(logs.length).toBeGreaterThan(0);
    expect(logs).not.toContain(c.key);
    expect(logs).not.toContain(c.key.slice(3));
    const row = await server.db.selectFrom('apiKeys').selectAll().where('id', '=', c.apiKeyId).executeTakeFirstOrThrow();
    expect(JSON.stringify(row)).not.toContain(c.key.slice(3));
  });
});

describe('request ids, unknown routes and methods', () => {
  it('echoes a given X-Request-Id and generates one otherwise', async () => {
    const echoed = await rawGet('/healthz', { 'X-Request-Id': 'client-abc.123' });
    expect(echoed.headers.get('x-request-id')).toBe('client-abc.123');
    const generated = await rawGet('/healthz');
    expect(generated.headers.get('x-request-id')).toMatch(/^req_[0-9a-f]{24}$/);
    const unsafe = await rawGet('/healthz', { 'X-Request-Id': 'has spaces and {braces}' });
    expect(unsafe.headers.get('x-request-id')).toMatch(/^req_/);
  });

  it('writes one access log line per request with its request id, and never the query string', async () => {
    await rawGet('/v1/files/file_x?expires=1&signature=secret-signature', { 'X-Request-Id': 'log-line-check' });
    const line = server.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.reqId === 'log-line-check');
    expect(line).toMatchObject({ msg: 'request', method: 'GET', path: '/v1/files/file_x', status: 404, operation: 'getFile', ms: expect.any(Number) });
    expect(server.logs.join('\n')).not.toContain('secret-signature');
  });

  it('answers 404 not_found for an unknown route and for GET /v1/models/{model}', async () => {
    const c = await createCustomer(server.db);
    for (const path of ['/v1/nothing-here', '/v1/models/local-image-1']) {
      const res = await rawGet(path, { Authorization: `Bearer ${c.key}` });
      expect(res.status).toBe(404);
      expect(JSON.parse(res.text).error).toMatchObject({ code: 'not_found', type: 'not_found_error' });
    }
  });

  it('answers 405 method_not_allowed for a wrong method on a known path', async () => {
    const c = await createCustomer(server.db);
    const res = await fetch(`${server.directUrl}/v1/credits`, { method: 'DELETE', headers: { Authorization: `Bearer ${c.key}` } });
    expect(res.status).toBe(405);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('method_not_allowed');
  });

  it('answers 400 invalid_json for a malformed body and 415 for an unsupported content type', async () => {
    const c = await createCustomer(server.db);
    const bad = await fetch(`${server.directUrl}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: '{"prompt": ',
    });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { code: string } }).error.code).toBe('invalid_json');
    const text = await fetch(`${server.directUrl}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'text/plain' },
      body: 'hello',
    });
    expect(text.status).toBe(415);
    expect(((await text.json()) as { error: { code: string } }).error.code).toBe('unsupported_media_type');
  });
});

describe('GET /v1/models (§2.1, §4.1)', () => {
  it('lists the models of enabled members of the key group, with fixed metadata and no-store', async () => {
    const account = await createAccount(server.db);
    const group = await createGroup(server.db);
    await createMember(server.db, group.id, { models: ['local-image-1', 'local-video-1'] });
    await createMember(server.db, group.id, { models: ['local-video-audio'], enabled: false });
    await createMember(server.db, group.id, { models: ['local-image-pro'], provider: 'openai', credentials: null });
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    const { data, response } = await server.client(key.key).GET('/v1/models');
    expect(response.status).toBe(200);
    expect(response.headers.get('cache-control')).toBe('no-store');
    expect(data?.object).toBe('list');
    expect(data?.data.map((m) => m.id)).toEqual(['local-image-1', 'local-video-1']);
    for (const m of data!.data) {
      expect(m.object).toBe('model');
      expect(m.owned_by).toBe('mediagate');
      expect(Number.isInteger(m.created)).toBe(true);
    }
  });

  it('returns an empty list when the group has no reachable member', async () => {
    const account = await createAccount(server.db);
    const group = await createGroup(server.db);
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    const { data } = await server.client(key.key).GET('/v1/models');
    expect(data).toEqual({ object: 'list', data: [] });
  });

  it('hides models disabled in the catalog and kinds switched off', async () => {
    const c = await createCustomer(server.db, { models: ['local-image-1', 'local-video-1'] });
    await server.db.updateTable('capabilitySwitches').set({ enabled: false }).where('name', '=', 'video_generation').execute();
    try {
      const { data } = await server.client(c.key).GET('/v1/models');
      expect(data?.data.map((m) => m.id)).toEqual(['local-image-1']);
      await server.db.updateTable('catalogModels').set({ enabled: false }).where('id', '=', 'local-image-1').execute();
      const after = await server.client(c.key).GET('/v1/models');
      expect(after.data?.data).toEqual([]);
    } finally {
      await server.db.updateTable('capabilitySwitches').set({ enabled: true }).execute();
      await server.db.updateTable('catalogModels').set({ enabled: true }).execute();
    }
  });

  it('lists an image model while either image switch is on, since the key can still edit with it', async () => {
    const c = await createCustomer(server.db, { balance: 10, models: ['local-image-1'] });
    const setSwitch = async (name: 'image_generation' | 'image_edit', enabled: boolean) => {
      await server.db.updateTable('capabilitySwitches').set({ enabled }).where('name', '=', name).execute();
      server.ctx.services.invalidateCaches();
    };
    const listed = async () => (await server.client(c.key).GET('/v1/models')).data?.data.map((m) => m.id);
    const image = `data:image/png;base64,${(await sharp({ create: { width: 64, height: 64, channels: 3, background: '#336699' } }).png().toBuffer()).toString('base64')}`;
    const edit = () =>
      fetch(`${server.directUrl}/v1/images/edits`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ prompt: 'x', model: 'local-image-1', images: [image] }),
      });
    try {
      await setSwitch('image_generation', false);
      expect(await listed()).toEqual(['local-image-1']);
      expect((await edit()).status).toBe(200);
      await setSwitch('image_edit', false);
      expect(await listed()).toEqual([]);
      const refused = await edit();
      expect(refused.status).toBe(503);
      expect(((await refused.json()) as { error: { code: string } }).error.code).toBe('capability_disabled');
      await setSwitch('image_generation', true);
      expect(await listed()).toEqual(['local-image-1']);
    } finally {
      await server.db.updateTable('capabilitySwitches').set({ enabled: true }).execute();
      server.ctx.services.invalidateCaches();
    }
  });
});

describe('GET /v1/credits (§2.2)', () => {
  it('shows the account and an unlimited key', async () => {
    const c = await createCustomer(server.db, { balance: 12.5, name: 'credits-unlimited' });
    const { data, response } = await server.client(c.key).GET('/v1/credits');
    expect(response.status).toBe(200);
    expect(response.headers.get('cache-control')).toBe('no-store');
    expect(data?.object).toBe('credit_balance');
    expect(data?.account).toEqual({ balance: 12.5, total_earned: 12.5, total_spent: 0, status: 'active' });
    expect(data?.api_key).toMatchObject({ id: c.apiKeyId, credit_limit: null, credits_remaining: null, unlimited: true, credits_used: 0, is_active: true });
    expect(data?.api_key.key_prefix).toBe(c.key.slice(0, data!.api_key.key_prefix.length));
    expect(data?.api_key.last_four).toBe(c.key.slice(-4));
    expect(new Date(data!.api_key.created_at).toISOString()).toBe(data!.api_key.created_at);
    expect(JSON.stringify(data)).not.toContain(c.key);
  });

  it('shows a limited key with credits remaining', async () => {
    const c = await createCustomer(server.db, { creditLimit: 10.25 });
    await server.db.updateTable('apiKeys').set({ creditsUsed: 250_000 }).where('id', '=', c.apiKeyId).execute();
    const { data } = await server.client(c.key).GET('/v1/credits');
    expect(data?.api_key).toMatchObject({ credit_limit: 10.25, credits_used: 0.25, credits_remaining: 10, unlimited: false });
  });
});

describe('operations endpoints', () => {
  it('serves /healthz and /readyz without a key, and Prometheus /metrics only to the metrics token', async () => {
    expect(JSON.parse((await rawGet('/healthz')).text)).toEqual({ status: 'ok' });
    expect(JSON.parse((await rawGet('/readyz')).text)).toEqual({ status: 'ready' });
    await rawGet('/v1/credits');
    for (const headers of [{}, { Authorization: 'Bearer wrong-token-0123456789' }] as Record<string, string>[]) {
      const refused = await rawGet('/metrics', headers);
      expect(refused.status).toBe(401);
      expect(JSON.parse(refused.text).error).toMatchObject({ code: 'invalid_metrics_token', type: 'authentication_error' });
    }
    const metrics = await rawGet('/metrics', { Authorization: `Bearer ${METRICS_TOKEN}` });
    expect(metrics.status).toBe(200);
    expect(metrics.headers.get('content-type')).toContain('text/plain');
    expect(metrics.text).toMatch(/mediagate_http_requests_total\{operation="getCredits",method="GET",status="401"\} \d+/);
    expect(metrics.text).toContain('mediagate_http_request_duration_seconds_bucket');
  });

  it('does not serve /metrics at all when no METRICS_TOKEN is set', async () => {
    const bare = await startTestServer();
    try {
      const res = await fetch(`${bare.directUrl}/metrics`);
      expect(res.status).toBe(404);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe('not_found');
    } finally {
      await bare.close();
    }
  });
});
