/**
 * A body field the operation does not take — an OpenAI Images parameter this gateway does not offer
 * (`moderation`, `input_fidelity`, `style`), a typo — is named as an unknown parameter of that
 * operation, not with the schema validator's wording ("must NOT have additional properties").
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({});
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

it.each([
  ['/v1/images/generations', { model: 'local-image-1', prompt: 'a lighthouse', style: 'vivid' }, 'style'],
  ['/v1/videos/generations', { model: 'local-video-1', prompt: 'a boat', seconds: 2, aspectRatio: '16:9', resolution: '360p', client_request_id: 'unknown-1', colour: 'red' }, 'colour'],
  ['/admin/v1/accounts', { name: 'unknown-param', plan: 'gold' }, 'plan'],
])('POST %s with an unknown field is 400 naming it as unknown', async (path, body, field) => {
  const c = await createCustomer(server.db);
  const res = await fetch(`${server.directUrl}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${path.startsWith('/admin') ? ADMIN_TOKEN : c.key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
  expect(res.status).toBe(400);
  expect(await res.json()).toEqual({
    error: { type: 'invalid_request_error', code: 'invalid_request', param: field, message: `Unknown parameter '${field}': the operation does not take it.` },
  });
});
