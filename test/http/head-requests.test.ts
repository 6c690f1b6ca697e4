/**
 * HEAD wherever GET: monitors and `curl -I` ask with HEAD (RFC 9110 §9.3.2: a server answers it as
 * GET, without the body). The contract declares HEAD only where it differs from GET (file
 * downloads); everywhere else the validator treats HEAD as GET, so it answers GET's status and header
 * fields with no body, meets GET's security, and a method a path lacks is still 405, its `Allow`
 * naming HEAD beside GET.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
let customer: Awaited<ReturnType<typeof createCustomer>>;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
  customer = await createCustomer(server.db, { balance: 100 });
});
afterAll(async () => server?.close());

/** Header fields that differ between any two answers (the request's id, the clock). */
const PER_ANSWER = new Set(['date', 'x-request-id', 'keep-alive', 'connection']);

async function answer(method: 'GET' | 'HEAD', path: string, token?: string) {
  const res = await fetch(`${server.directUrl}${path}`, { method, headers: token ? { Authorization: `Bearer ${token}` } : {} });
  const body = Buffer.from(await res.arrayBuffer());
  const headers = Object.fromEntries([...res.headers].filter(([name]) => !PER_ANSWER.has(name)));
  return { status: res.status, headers, body };
}

describe('HEAD on GET routes', () => {
  it.each([
    ['/healthz', undefined],
    ['/readyz', undefined],
    ['/docs', undefined],
    ['/openapi.json', undefined],
    ['/v1/models', 'customer'],
    ['/v1/credits', 'customer'],
    ['/admin/v1/accounts', 'admin'],
  ] as const)('answers HEAD %s with GET\'s status and header fields and no body', async (path, who) => {
    const token = who === 'customer' ? customer.key : who === 'admin' ? ADMIN_TOKEN : undefined;
    const get = await answer('GET', path, token);
    const head = await answer('HEAD', path, token);
    expect(get.status).toBe(200);
    expect(get.body.length).toBeGreaterThan(0);
    expect(head.status).toBe(200);
    expect(head.headers).toEqual(get.headers);
    expect(head.body.length).toBe(0);
  });

  it('refuses HEAD without credentials as GET is refused', async () => {
    const head = await answer('HEAD', '/v1/models');
    expect(head.status).toBe(401);
    expect(head.headers['www-authenticate']).toBe('Bearer');
    expect(head.body.length).toBe(0);
    const admin = await answer('HEAD', '/admin/v1/accounts', 'not-the-token');
    expect(admin.status).toBe(401);
  });

  it('still answers a method a path lacks with 405, HEAD listed beside GET', async () => {
    const put = await fetch(`${server.directUrl}/v1/models`, { method: 'PUT', headers: { Authorization: `Bearer ${customer.key}`, 'Content-Type': 'application/json' }, body: '{}' });
    expect([put.status, ((await put.json()) as { error: { code: string } }).error.code]).toEqual([405, 'method_not_allowed']);
    expect(put.headers.get('allow')).toBe('GET, HEAD');
    // A POST-only path has no GET, so no HEAD either.
    const head = await fetch(`${server.directUrl}/v1/images/generations`, { method: 'HEAD', headers: { Authorization: `Bearer ${customer.key}` } });
    expect(head.status).toBe(405);
    expect(head.headers.get('allow')).toBe('POST');
  });
});
