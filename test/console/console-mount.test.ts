/**
 * /console as the server mounts it (server/http/console.ts): the built SPA only when ADMIN_TOKEN
 * is set (404 otherwise, like /admin), index.html for client routes, hashed assets cached for good,
 * a missing asset a 404 (never index.html), GET/HEAD only, the CSP, and a page that says how to
 * build the console when this checkout has no build.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import express from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONSOLE_DIST, consoleRouter } from '../../server/http/console.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { repoRoot } from '../support/server-process.ts';

let on: TestServer;
let off: TestServer;

beforeAll(async () => {
  if (!existsSync(join(CONSOLE_DIST, 'index.html'))) {
    const build = spawnSync('npm', ['run', 'build:console', '--silent'], { cwd: repoRoot, encoding: 'utf8' });
    if (build.status !== 0) throw new Error(`npm run build:console failed:\n${build.stdout}\n${build.stderr}`);
  }
  [on, off] = await Promise.all([startTestServer(), startTestServer({ env: { ADMIN_TOKEN: '' } })]);
}, 120_000);
afterAll(async () => {
  await on?.close();
  await off?.close();
});

describe('/console', () => {
  it('serves the SPA with ADMIN_TOKEN set, index.html for client routes, with a CSP', async () => {
    for (const path of ['/console', '/console/', '/console/tasks/vid_123', '/console/accounts']) {
      const res = await fetch(`${on.directUrl}${path}`);
      expect(res.status, path).toBe(200);
      expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
      expect(res.headers.get('cache-control')).toBe('no-cache');
      expect(res.headers.get('content-security-policy')).toContain("script-src 'self'");
      expect(res.headers.get('x-frame-options')).toBe('DENY');
      const html = await res.text();
      expect(html).toContain('<div id="root"></div>');
      expect(html).toMatch(/src="\/console\/assets\/index-[\w-]+\.js"/);
    }
  });

  it('serves hashed assets for good, and a missing asset is a 404, not the page', async () => {
    const js = readdirSync(join(CONSOLE_DIST, 'assets')).find((f) => f.endsWith('.js'))!;
    const asset = await fetch(`${on.directUrl}/console/assets/${js}`);
    expect(asset.status).toBe(200);
    expect(asset.headers.get('content-type')).toMatch(/^text\/javascript/);
    expect(asset.headers.get('cache-control')).toBe('public, max-age=31536000, immutable');
    const missing = await fetch(`${on.directUrl}/console/assets/index-nope.js`);
    expect(missing.status).toBe(404);
    expect(((await missing.json()) as { error: { code: string } }).error.code).toBe('not_found');
    // Nor a file outside the assets: a browser asking for it would get a page where it expects a script or an icon.
    for (const path of ['/console/nope.js', '/console/favicon.ico', '/console/tasks/app.css']) {
      const res = await fetch(`${on.directUrl}${path}`);
      expect([path, res.status, ((await res.json()) as { error: { code: string } }).error.code]).toEqual([path, 404, 'not_found']);
    }
  });

  it('answers GET and HEAD only', async () => {
    const res = await fetch(`${on.directUrl}/console/`, { method: 'POST' });
    expect(res.status).toBe(405);
    expect(res.headers.get('allow')).toBe('GET, HEAD');
    expect(((await res.json()) as { error: { code: string; message: string } }).error).toMatchObject({ code: 'method_not_allowed', message: 'The console answers GET and HEAD only, not POST.' });
  });

  it('does not exist without ADMIN_TOKEN (404, like the admin API)', async () => {
    for (const path of ['/console', '/console/', '/console/tasks', '/admin/v1/accounts']) {
      const res = await fetch(`${off.directUrl}${path}`);
      expect(res.status, path).toBe(404);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe('not_found');
    }
  });

  it('says how to build the console when the build is missing', async () => {
    const empty = mkdtempSync(join(tmpdir(), 'mediagate-console-empty-'));
    const app = express().use('/console', consoleRouter(true, empty));
    const server: Server = createServer(app);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const res = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/console/tasks`);
      expect(res.status).toBe(503);
      expect(res.headers.get('content-type')).toMatch(/^text\/html/);
      const html = await res.text();
      expect(html).toContain('The console has not been built');
      expect(html).toContain('npm run build:console');
    } finally {
      server.close();
      rmSync(empty, { recursive: true, force: true });
    }
  });
});
