/**
 * The index at the base URL (`GET /`), the rendered reference (`GET /docs`) and the bundled contract (`GET /openapi.json`) over HTTP, with
 * response validation on (and through Prism in the contract lane): no key needed, the contract
 * byte for byte the file the validator reads, the page the very bytes `npm run docs` writes and
 * self-contained, revalidation by ETag. test/process/docs-browser.test.ts opens the page in Chromium.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { renderDocsPage } from '../../server/http/docs-page.ts';
import { contractLane, startTestServer, type TestServer } from '../support/http-harness.ts';

const specText = readFileSync(new URL('../../generated/openapi.json', import.meta.url), 'utf8');
const ETAG = /^"[A-Za-z0-9_-]{43}"$/;

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => server?.close());

/**
 * A browser's revalidation: fetch() would add `Cache-Control: no-cache` to a request with
 * If-None-Match (the Fetch standard's "no-store" mode), which asks for the whole body again.
 */
const revalidate = (etag: string) => ({ 'If-None-Match': etag, 'Cache-Control': 'max-age=0' });

/** A GET through the lane (Prism in the contract lane, which must report no violation). */
async function get(path: string, headers: Record<string, string> = {}): Promise<Response> {
  const res = await fetch(`${server.baseUrl}${path}`, { headers });
  if (contractLane) expect(res.headers.get('sl-violations'), `${path}: contract violations`).toBeNull();
  return res;
}

/** A GET of the server itself: Prism re-serializes JSON and knows only the contract's paths (`/docs`, not `/docs/`). */
async function direct(path: string, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${server.directUrl}${path}`, { headers });
}

describe('GET /openapi.json', () => {
  it('serves generated/openapi.json byte for byte, without a key, revalidated by ETag', async () => {
    const res = await get('/openapi.json');
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(res.headers.get('cache-control')).toBe('no-cache');
    expect(res.headers.get('etag')).toMatch(ETAG);
    expect(await res.json()).toEqual(JSON.parse(specText));
    expect(await (await direct('/openapi.json')).text()).toBe(specText);
  });

  it('answers 304 without a body to the current ETag, and 200 to an old one', async () => {
    const etag = (await get('/openapi.json')).headers.get('etag')!;
    const same = await get('/openapi.json', revalidate(etag));
    expect(same.status).toBe(304);
    expect(same.headers.get('etag')).toBe(etag);
    expect(same.headers.get('cache-control')).toBe('no-cache');
    expect(await same.text()).toBe('');

    const old = await get('/openapi.json', revalidate('"an-older-version"'));
    expect(old.status).toBe(200);
    expect(await old.json()).toEqual(JSON.parse(specText));
  });

  it('ignores an Authorization header it does not need, and refuses unknown query parameters', async () => {
    expect((await get('/openapi.json', { Authorization: 'Bearer mg_not_a_key' })).status).toBe(200);
    const res = await get('/openapi.json?download=1');
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('invalid_request');
  });
});

describe('GET /', () => {
  it('lists where things are, as links relative to the base URL that resolve, without a key', async () => {
    const res = await get('/', { Authorization: 'Bearer mg_not_a_key' });
    expect(res.status).toBe(200);
    const index = (await res.json()) as Record<string, string | null>;
    expect(index).toEqual({ service: 'mediagate', api: 'v1', docs: 'docs', openapi: 'openapi.json', health: 'healthz', readiness: 'readyz', console: 'console/' });
    for (const link of ['docs', 'openapi', 'health', 'readiness', 'console'] as const) {
      const target = await direct(new URL(index[link]!, `${server.directUrl}/`).pathname);
      expect([link, target.status]).toEqual([link, 200]);
    }
    expect((await get('/?x=1')).status).toBe(400);
  });

  it('names no console while it is off (ADMIN_TOKEN unset)', async () => {
    const plain = await startTestServer({ env: { ADMIN_TOKEN: '' } });
    try {
      const index = (await (await fetch(`${plain.directUrl}/`)).json()) as Record<string, unknown>;
      expect(index.console).toBeNull();
      expect((await fetch(`${plain.directUrl}/console/`)).status).toBe(404);
    } finally {
      await plain.close();
    }
  });
});

describe('with PUBLIC_BASE_URL', () => {
  it('names it as the contract\'s one server, in /openapi.json and in the page; the rest of the contract unchanged', async () => {
    const deployed = await startTestServer({ env: { PUBLIC_BASE_URL: 'https://media.example.com/' } });
    try {
      const served = (await (await fetch(`${deployed.directUrl}/openapi.json`)).json()) as Record<string, unknown>;
      expect(served.servers).toEqual([{ url: 'https://media.example.com', description: 'This gateway (PUBLIC_BASE_URL).' }]);
      expect({ ...served, servers: undefined }).toEqual({ ...JSON.parse(specText), servers: undefined });
      const page = await (await fetch(`${deployed.directUrl}/docs`)).text();
      expect(page).toContain('"url":"https://media.example.com"');
      expect(page).not.toContain('"url":"http://localhost:8080"');
    } finally {
      await deployed.close();
    }
  });
});

describe('GET /docs', () => {
  it('serves the page npm run docs writes, at /docs and /docs/, without a key', async () => {
    const expected = await renderDocsPage(specText);
    const res = await get('/docs', { Authorization: 'Bearer mg_not_a_key' });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(res.headers.get('cache-control')).toBe('no-cache');
    expect(res.headers.get('etag')).toMatch(ETAG);
    expect(await res.text()).toBe(expected);

    const slash = await direct('/docs/');
    expect(slash.status).toBe(200);
    expect(slash.headers.get('etag')).toBe(res.headers.get('etag'));
    expect(await slash.text()).toBe(expected);
  });

  it('is one self-contained page: the viewer and the contract inline, a policy that lets it load nothing', async () => {
    const page = await (await get('/docs')).text();
    expect(page).not.toMatch(/<script[^>]*\ssrc=/i);
    expect(page).not.toMatch(/<link[^>]*\shref=/i);
    expect(page).not.toContain('cdn.redocly.com/redoc/');
    expect(page).toMatch(/<meta http-equiv="Content-Security-Policy" content="default-src 'none'; [^"]*">/);
    expect(page).toMatch(/\* Version: 3\.\d+\.\d+/);
    expect(page).toContain(`const definition = ${JSON.stringify(JSON.parse(specText)).replace(/</g, '\\u003c')};`);
    expect(page).toContain('"disableTelemetry":true');
  });

  it('answers 304 to the current ETag', async () => {
    const etag = (await get('/docs')).headers.get('etag')!;
    const res = await get('/docs', revalidate(etag));
    expect(res.status).toBe(304);
    expect(await res.text()).toBe('');
  });
});
