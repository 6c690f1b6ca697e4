/**
 * The console's polling (useLoad in clients/console/src/ui.tsx), in headless Chromium (Debian's
 * /usr/bin/chromium, driven by playwright-core) against the real app, with the page's clock faked
 * (Playwright's clock): the dashboard asks for its 7-day usage report every 30 s, and a report that
 * takes longer than that is not asked for again on top of itself, and a page left open past a UTC
 * midnight asks for the seven days that end with the new day. The report's answer is held by the
 * test; the page's own fetch calls to /admin/v1/usage are counted in the page, where the ticks run.
 */
import { chromium, type Browser, type Page, type Route } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { ensureConsoleBuild } from './console-build.ts';

declare const window: { __usageFetches: number; fetch: (input: unknown, init?: unknown) => Promise<unknown> }; // the page's, in its scripts

let server: TestServer;
let browser: Browser;
let page: Page;
const outside: string[] = [];
const pageErrors: string[] = [];
/** The usage requests the test holds, unanswered until it lets them through. */
const held: Route[] = [];

async function until<T>(what: () => Promise<T>, done: (value: T) => boolean, ms = 15_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const value = await what();
    if (done(value) || Date.now() > end) return value;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** How many times the page has called fetch for /admin/v1/usage (counted as the call is made). */
const usageFetches = () => page.evaluate(() => window.__usageFetches);

beforeAll(async () => {
  ensureConsoleBuild();
  server = await startTestServer();
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'] });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  context.setDefaultTimeout(15_000);
  await context.route('**/*', (route) => {
    const url = new URL(route.request().url());
    if (url.hostname === '127.0.0.1' && url.pathname === '/admin/v1/usage') {
      held.push(route);
      return;
    }
    if (url.protocol === 'data:' || url.protocol === 'blob:' || url.hostname === '127.0.0.1') return route.continue();
    outside.push(url.href);
    return route.abort('blockedbyclient');
  });
  page = await context.newPage();
  page.on('pageerror', (err) => pageErrors.push(err.message));
  // Counted before the app's scripts run: openapi-fetch takes the page's fetch when the client is made.
  await page.addInitScript(() => {
    window.__usageFetches = 0;
    const original = window.fetch.bind(window);
    window.fetch = (input: unknown, init?: unknown) => {
      const url = typeof input === 'string' ? input : (input as { url: string }).url;
      if (new URL(url, 'http://x').pathname === '/admin/v1/usage') window.__usageFetches++;
      return original(input, init);
    };
  });
  // Three minutes before a UTC midnight: the second test crosses it.
  await page.clock.install({ time: new Date('2026-11-28T23:55:00Z') });
  await page.goto(`${server.directUrl}/console/`);
  await page.getByLabel('Admin token').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Dashboard' }).waitFor();
}, 120_000);

afterAll(async () => {
  for (const route of held.splice(0)) await route.abort().catch(() => undefined);
  await browser?.close();
  await server?.close();
});

describe('the dashboard polls its usage report', () => {
  it('skips a refresh while the last report is still loading, and refreshes again once it answered', async () => {
    expect(await until(async () => held.length, (n) => n === 1)).toBe(1);
    expect(await usageFetches()).toBe(1);

    // Three refresh periods pass while the first report has not answered: nothing more is asked for.
    for (let i = 0; i < 3; i++) await page.clock.fastForward(30_000);
    expect(await usageFetches()).toBe(1);
    expect(held).toHaveLength(1);

    // It answers; the next period asks again.
    await held.shift()!.continue();
    await page.getByText('Credits spent (7 days)').locator('..').getByText('0', { exact: true }).waitFor();
    expect(await usageFetches()).toBe(1);
    await page.clock.fastForward(30_000);
    expect(await until(async () => held.length, (n) => n === 1)).toBe(1);
    expect(await usageFetches()).toBe(2);

    // Leaving the dashboard while that report is still loading aborts its request (the server then
    // cancels the report's statement).
    const aborted = page.waitForEvent('requestfailed', (r) => new URL(r.url()).pathname === '/admin/v1/usage');
    await page.getByRole('navigation', { name: 'Console sections' }).getByRole('link', { name: 'Tasks', exact: true }).click();
    await page.getByRole('heading', { level: 1, name: 'Tasks' }).waitFor();
    expect((await aborted).failure()?.errorText).toBe('net::ERR_ABORTED');

    expect(pageErrors).toEqual([]);
    expect(outside).toEqual([]);
  });

  it('asks for the seven UTC days that end today, and moves on with the day while the page stays open', async () => {
    const windowOf = (route: Route) => Object.fromEntries(['from', 'to'].map((k) => [k, new URL(route.request().url()).searchParams.get(k)]));
    // The request the first test's page aborted is still in the list: gone with its page.
    for (const stale of held.splice(0)) await stale.abort().catch(() => undefined);
    await page.getByRole('navigation', { name: 'Console sections' }).getByRole('link', { name: 'Dashboard', exact: true }).click();
    await page.getByRole('heading', { level: 1, name: 'Dashboard' }).waitFor();
    await until(async () => held.length, (n) => n === 1);
    const before = held.shift()!;
    expect(windowOf(before)).toEqual({ from: '2026-11-22T00:00:00.000Z', to: '2026-11-29T00:00:00.000Z' });
    await before.continue();
    // On past midnight (23:57 now, after the first test's two minutes), each refresh answered as it
    // comes (one that comes while the last answer is still being read is skipped by the page).
    const windows = [windowOf(before)];
    for (let i = 0; i < 16 && windows.at(-1)!.to !== '2026-11-30T00:00:00.000Z'; i++) {
      await page.clock.fastForward(30_000);
      await until(async () => held.length, (n) => n === 1, 1_500);
      const next = held.shift();
      if (next) {
        windows.push(windowOf(next));
        await next.continue();
      }
    }
    expect(windows.at(-1)).toEqual({ from: '2026-11-23T00:00:00.000Z', to: '2026-11-30T00:00:00.000Z' });
    // Every window asked for before midnight was the old day's.
    expect(windows.slice(0, -1).every((w) => w.to === '2026-11-29T00:00:00.000Z')).toBe(true);
    expect(pageErrors).toEqual([]);
  });
});
