/**
 * The API reference in a real browser with no network beyond loopback: a real server process
 * (`--role api`, a checkout where `npm run docs` never ran) serves `/openapi.json` (the bundled
 * contract) and `/docs`, whose sidebar lists the operations and whose links navigate, at `/docs`
 * and `/docs/`; and the file `npm run docs` writes does the same opened from `file://`.
 * Headless Chromium (Debian's /usr/bin/chromium) driven by playwright-core; every request the page
 * makes that is not loopback, file, data or blob is recorded and aborted, and there must be none.
 */
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { repoRoot, spawnServer, type ServerProcess, SERVER_ENTRY } from '../support/server-process.ts';

const CHROMIUM = '/usr/bin/chromium';
const specText = readFileSync(join(repoRoot, 'generated/openapi.json'), 'utf8');
const spec = JSON.parse(specText) as { paths: Record<string, Record<string, { operationId?: string; tags?: string[]; summary?: string }>> };

/** The Videos operations of the contract, as Redoc links them (`#/videos/<operationid>`). */
const videoOperations = Object.values(spec.paths)
  .flatMap((item) => Object.values(item))
  .filter((op) => op.tags?.includes('Videos') && op.operationId)
  .map((op) => ({ href: `#/videos/${op.operationId!.toLowerCase()}`, summary: op.summary! }));

let db: TestDatabase;
let server: ServerProcess;
let context: BrowserContext;
let userDataDir: string;
/** Every request the page being checked made that would have left loopback (none may). */
const outside: string[] = [];

function isLocal(url: string): boolean {
  const { protocol, hostname } = new URL(url);
  if (['file:', 'data:', 'blob:', 'about:'].includes(protocol)) return true;
  return ['127.0.0.1', 'localhost', '[::1]'].includes(hostname);
}

beforeAll(async () => {
  db = await createTestDatabase();
  server = await spawnServer({
    command: [process.execPath, SERVER_ENTRY, '--role', 'api'],
    env: { DATABASE_URL: db.url, MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'), DEMO_DATA: '0' },
  });
  userDataDir = mkdtempSync(join(tmpdir(), 'mediagate-chromium-'));
  context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
  context.setDefaultTimeout(15_000);
  await context.route('**/*', (route) => {
    const url = route.request().url();
    if (isLocal(url)) return route.continue();
    outside.push(url);
    return route.abort('blockedbyclient');
  });
}, 120_000);

afterAll(async () => {
  await context?.close();
  await server?.kill('SIGTERM');
  await db?.destroy();
  if (userDataDir) rmSync(userDataDir, { recursive: true, force: true });
});

/** Waits until the section headed `heading` is in the upper half of the viewport (where Redoc scrolls a linked section). */
async function waitInView(page: Page, heading: string): Promise<void> {
  const section = page.locator('h2').filter({ hasText: heading }).first();
  await section.waitFor({ timeout: 10_000 });
  const height = page.viewportSize()!.height;
  await expect
    .poll(async () => {
      const box = await section.boundingBox();
      return box !== null && box.y >= 0 && box.y < height / 2;
    }, { timeout: 10_000 })
    .toBe(true);
}

/** Opens the reference at `url` and checks the sidebar lists the operations and a link navigates. */
async function expectWorkingReference(url: string): Promise<void> {
  outside.length = 0;
  const page = await context.newPage();
  const errors: string[] = [];
  page.on('pageerror', (err) => errors.push(err.message));
  try {
    await page.goto(url);
    const sidebar = page.locator('[data-component-name="Menu/Menu"]');
    await sidebar.locator('a[href="#/videos"]').click();
    for (const op of videoOperations) {
      expect(await sidebar.locator(`a[href="${op.href}"]`).first().textContent({ timeout: 10_000 })).toContain(op.summary);
    }

    // A sidebar link moves the page to its operation and into the URL, relative to the page itself.
    await sidebar.locator('a[href="#/videos/getvideo"]').first().click();
    await waitInView(page, 'Read a video task');
    expect(page.url()).toBe(`${url}#/videos/getvideo`);

    // That URL, opened afresh, lands on the same operation.
    const deep = await context.newPage();
    try {
      await deep.goto(`${url}#/videos/getvideo`);
      await waitInView(deep, 'Read a video task');
    } finally {
      await deep.close();
    }
    expect(errors).toEqual([]);
    expect(outside).toEqual([]);
  } finally {
    await page.close();
  }
}

describe('the API reference in headless Chromium, offline', () => {
  it('is served by an API-role process, with the bundled contract at /openapi.json', async () => {
    const res = await fetch(`${server.url}/openapi.json`);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe(specText);
    const docs = await fetch(`${server.url}/docs`);
    expect(docs.status).toBe(200);
    expect(docs.headers.get('content-type')).toBe('text/html; charset=utf-8');
  });

  it.each(['/docs', '/docs/'])('renders the sidebar and navigates at %s, loading nothing from outside', async (path) => {
    await expectWorkingReference(`${server.url}${path}`);
  }, 60_000);

  it('npm run docs writes the same page, which works opened from file://', async () => {
    const run = spawnSync('npm', ['run', 'docs', '--silent'], { cwd: repoRoot, encoding: 'utf8', env: { ...process.env, npm_config_update_notifier: 'false' } });
    expect(run.status, run.stderr).toBe(0);
    const file = join(repoRoot, 'dist/docs/index.html');
    expect(readFileSync(file, 'utf8')).toBe(await (await fetch(`${server.url}/docs`)).text());

    await expectWorkingReference(pathToFileURL(file).href);
  }, 60_000);
});
