/**
 * `mediagate_http_requests_total` counts by operationId (openapi/paths/metrics.yaml), also the
 * requests refused before the validator matched them: the credential check (401), the per-minute
 * rate (429), the body parsers (413, 415). Only a request the contract has no operation for is
 * `unmatched`, so the label stays bounded.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

const METRICS_TOKEN = 'metrics-token-0123456789abcdef';
let server: TestServer;

beforeAll(async () => {
  server = await startTestServer({ env: { METRICS_TOKEN, JSON_BODY_LIMIT_BYTES: '2048', KEY_CACHE_TTL_MS: '0' } });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

async function send(method: string, path: string, headers: Record<string, string> = {}, body?: string): Promise<number> {
  const res = await fetch(`${server.directUrl}${path}`, { method, headers, body });
  await res.arrayBuffer();
  return res.status;
}

describe('HTTP metrics labels', () => {
  it('label a request refused before the validator with its operationId, and an unknown path unmatched', async () => {
    const c = await createCustomer(server.db);
    await server.db.updateTable('apiKeys').set({ requestsPerMinute: 1 }).where('id', '=', c.apiKeyId).execute();
    const json = { 'Content-Type': 'application/json' };
    const key = { Authorization: `Bearer ${c.key}` };

    expect(await send('POST', '/v1/images/generations', json, '{}')).toBe(401);
    expect(await send('POST', '/admin/v1/groups', { ...json, Authorization: 'Bearer wrong-admin-token-000' }, '{"name":"x"}')).toBe(401);
    expect(await send('POST', '/v1/videos/generations', { ...key, ...json }, '{}')).toBe(400); // the key's one request of the minute
    expect(await send('POST', '/v1/videos/generations', { ...key, ...json }, '{}')).toBe(429);
    expect(await send('POST', '/admin/v1/groups', { ...json, Authorization: `Bearer ${ADMIN_TOKEN}` }, JSON.stringify({ name: 'x', description: 'd'.repeat(4096) }))).toBe(413);
    // Uploads take a token too: another key's, this one's minute is used up.
    const uploader = { Authorization: `Bearer ${(await createCustomer(server.db)).key}` };
    expect(await send('POST', '/v1/files', { ...uploader, 'Content-Type': 'multipart/form-data; boundary=b', 'Content-Encoding': 'gzip' }, 'x')).toBe(415);
    expect(await send('GET', '/v1/no-such-thing')).toBe(404);

    const res = await fetch(`${server.directUrl}/metrics`, { headers: { Authorization: `Bearer ${METRICS_TOKEN}` } });
    const text = await res.text();
    const count = (operation: string, method: string, status: number) =>
      Number(new RegExp(`^mediagate_http_requests_total\\{operation="${operation}",method="${method}",status="${status}"\\} (\\d+)$`, 'm').exec(text)?.[1] ?? 0);
    expect({
      createImage401: count('createImage', 'POST', 401),
      createGroup401: count('createGroup', 'POST', 401),
      createVideo400: count('createVideo', 'POST', 400),
      createVideo429: count('createVideo', 'POST', 429),
      createGroup413: count('createGroup', 'POST', 413),
      createFile415: count('createFile', 'POST', 415),
      unmatched404: count('unmatched', 'GET', 404),
      unmatchedPost: [401, 413, 415, 429].map((s) => count('unmatched', 'POST', s)),
    }).toEqual({ createImage401: 1, createGroup401: 1, createVideo400: 1, createVideo429: 1, createGroup413: 1, createFile415: 1, unmatched404: 1, unmatchedPost: [0, 0, 0, 0] });
  });
});
