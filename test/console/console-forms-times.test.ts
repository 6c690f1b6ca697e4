/**
 * The console's limit fields, custom-size edges, times and contrast, in headless Chromium (Debian's
 * /usr/bin/chromium) driven by playwright-core against the real app, like console-browser.test.ts.
 * The browser runs in America/Los_Angeles, so a time shown in the browser's zone differs from UTC.
 *
 * - A custom limit field that is emptied stays empty: typing 30 into it saves 30 (it used to refill
 *   itself with 1, so 30 became 301), and a form saved with it empty says so.
 * - A model's custom-size edges are the ones the server takes: its own limits within the contract's
 *   256–3840 px (Seedream 4.0 on fal says 1024–4096, the server refuses anything over 3840).
 * - Times name their zone, and the Created after/before filters say they are local time.
 * - Input descriptions and red outline buttons (Revoke, Disable) have WCAG AA contrast, and the
 *   close button of a confirmation has an accessible name.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { repoRoot } from '../support/server-process.ts';
import { ensureConsoleBuild } from './console-build.ts';
import { accessibilityProblems } from '../support/console-a11y.ts';

const CHROMIUM = '/usr/bin/chromium';
const ZONE = 'America/Los_Angeles';
type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let server: TestServer;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let groupId = '';
let accountId = '';
let keyId = '';
const pageErrors: string[] = [];

async function api(path: string, init: RequestInit = {}): Promise<{ status: number; body: Json }> {
  const res = await fetch(`${server.directUrl}${path}`, { ...init, headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' } });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as Json) : {} };
}

/** Picks `option` in the Mantine select labelled exactly `label` inside `scope`. */
async function choose(scope: Page | ReturnType<Page['getByRole']>, label: string, option: string): Promise<void> {
  await scope.getByLabel(label, { exact: true }).click();
  await page.getByRole('option', { name: option, exact: true }).click();
}

beforeAll(async () => {
  ensureConsoleBuild();
  server = await startTestServer();
  await seedCatalog(server.db);
  // Seedream 4.0 on fal as shipped: its upstream takes 1024 to 4096 px a side (min_edge/max_edge).
  const seedream = JSON.parse(readFileSync(join(repoRoot, 'server/catalog/definitions/fal/seedream-4-fal.json'), 'utf8')).model;
  expect((await api('/admin/v1/models', { method: 'POST', body: JSON.stringify(seedream) })).status).toBe(201);
  groupId = (await api('/admin/v1/groups', { method: 'POST', body: JSON.stringify({ name: 'main' }) })).body.id;
  await api(`/admin/v1/groups/${groupId}/members`, { method: 'POST', body: JSON.stringify({ name: 'local-1', provider: 'local', models: ['local-image-1'] }) });
  accountId = (await api('/admin/v1/accounts', { method: 'POST', body: JSON.stringify({ name: 'acme', initial_credits: 100 }) })).body.id;
  keyId = (await api('/admin/v1/api-keys', { method: 'POST', body: JSON.stringify({ account_id: accountId, name: 'prod', group_id: groupId }) })).body.id;
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu'] });
  context = await browser.newContext({ viewport: { width: 1400, height: 1000 }, timezoneId: ZONE });
  context.setDefaultTimeout(15_000);
  page = await context.newPage();
  page.on('pageerror', (err) => pageErrors.push(err.message));
  await page.goto(`${server.directUrl}/console/`);
  await page.getByLabel('Admin token').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Dashboard' }).waitFor();
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await server?.close();
});

describe('console forms, times and contrast', () => {
  it('an emptied custom limit stays empty: typing 30 saves 30, and saving it empty says the field is empty', async () => {
    await page.goto(`${server.directUrl}/console/keys?account_id=${accountId}`);
    await page.getByRole('button', { name: 'Edit limits of key prod' }).click();
    const dialog = page.getByRole('dialog', { name: 'Limits of key prod' });
    await choose(dialog, 'Requests per minute', 'Custom');
    const rpm = dialog.getByLabel('Requests per minute (number)');
    expect(await rpm.inputValue()).toBe('60');
    await rpm.click();
    await page.keyboard.press('Control+A');
    await page.keyboard.press('Backspace');
    expect(await rpm.inputValue()).toBe('');
    await page.keyboard.type('30');
    expect(await rpm.inputValue()).toBe('30');
    await dialog.getByRole('button', { name: 'Save limits' }).click();
    await dialog.waitFor({ state: 'detached' });
    expect((await api(`/admin/v1/api-keys/${keyId}`)).body.requests_per_minute).toBe(30);

    // Saved with the field empty: the form says which field, and nothing is sent.
    await page.getByRole('button', { name: 'Edit limits of key prod' }).click();
    const again = page.getByRole('dialog', { name: 'Limits of key prod' });
    const field = again.getByLabel('Requests per minute (number)');
    expect(await field.inputValue()).toBe('30');
    await field.click();
    await page.keyboard.press('Control+A');
    await page.keyboard.press('Backspace');
    await again.getByRole('button', { name: 'Save limits' }).click();
    expect(await again.getByTestId('api-error').innerText()).toContain('Requests per minute is empty');
    expect(await field.inputValue()).toBe('');
    expect((await api(`/admin/v1/api-keys/${keyId}`)).body.requests_per_minute).toBe(30);
    await page.keyboard.press('Escape');
    await again.waitFor({ state: 'detached' });

    // The same field of an account's settings (its generations in flight too).
    await page.goto(`${server.directUrl}/console/accounts/${accountId}`);
    const form = page.getByRole('form', { name: 'Edit the account' });
    await choose(form, 'Generations in flight', 'Custom');
    const inFlight = form.getByLabel('Generations in flight (number)');
    await inFlight.click();
    await page.keyboard.press('Control+A');
    await page.keyboard.press('Backspace');
    expect(await inFlight.inputValue()).toBe('');
    await form.getByRole('button', { name: 'Save', exact: true }).click();
    expect(await form.getByTestId('api-error').innerText()).toContain('Generations in flight is empty');
    await inFlight.click();
    await page.keyboard.type('4');
    await form.getByRole('button', { name: 'Save', exact: true }).click();
    await expect.poll(async () => (await api(`/admin/v1/accounts/${accountId}`)).body.max_in_flight).toBe(4);
  }, 60_000);

  it("shows a model's custom-size edges as the server takes them: its own limits within the contract's 256–3840 px", async () => {
    const fal = (await api('/admin/v1/models/seedream-4-fal')).body;
    expect([fal.image.min_edge, fal.image.max_edge]).toEqual([1024, 4096]);
    const edges = async (model: string) => {
      await page.goto(`${server.directUrl}/console/models/${model}`);
      const row = page.getByRole('table', { name: 'Image capabilities' }).getByRole('row', { name: /Edges of a custom size/ });
      return (await row.getByRole('cell').last().innerText()).trim();
    };
    expect(await edges('seedream-4-fal')).toBe('1024–3840 px');
    expect(await edges('local-image-1')).toBe('256–3840 px (the custom-size limits)');
  }, 60_000);

  it('names the zone of the times it shows, and labels the Created after/before filters as local time', async () => {
    const first = (await api(`/admin/v1/ledger?account_id=${accountId}&limit=1`)).body.data[0];
    await page.goto(`${server.directUrl}/console/ledger?account_id=${accountId}`);
    const cell = page.getByRole('table', { name: 'Ledger entries' }).getByRole('row').nth(1).getByRole('cell').first();
    await cell.waitFor();
    const shown = (await cell.innerText()).trim();
    const local = new Date(first.created_at).toLocaleString('en-GB', { timeZone: ZONE, year: 'numeric', month: 'short', day: '2-digit', hour: '2-digit', minute: '2-digit', second: '2-digit' });
    const zone = new Intl.DateTimeFormat('en-GB', { timeZone: ZONE, timeZoneName: 'short' }).formatToParts(new Date(first.created_at)).find((p) => p.type === 'timeZoneName')!.value;
    expect(zone).toMatch(/^GMT-[78]$/);
    expect(shown).toBe(`${local} ${zone}`);

    for (const path of ['/ledger', '/tasks', '/webhooks']) {
      await page.goto(`${server.directUrl}/console${path}`);
      for (const label of ['Created after (local time)', 'Created before (local time)']) {
        const input = page.getByLabel(label, { exact: true });
        expect(await input.getAttribute('type'), `${path}: ${label}`).toBe('datetime-local');
      }
    }
  }, 60_000);

  it('has WCAG AA contrast and named controls on pages with input descriptions and red outline buttons, and in a confirmation', async () => {
    const pages: [string, () => Promise<void>][] = [
      [`/keys?account_id=${accountId}`, () => page.getByRole('button', { name: 'Revoke key prod' }).waitFor()],
      [`/groups/${groupId}`, () => page.getByRole('button', { name: 'Disable member local-1' }).waitFor()],
      [`/accounts/${accountId}`, () => page.getByText("Empty: the server's default.").first().waitFor()],
      ['/models/seedream-4-fal', () => page.getByText('Which ratios a custom size may have').waitFor()],
    ];
    for (const [path, ready] of pages) {
      await page.goto(`${server.directUrl}/console${path}`);
      await page.getByRole('heading', { level: 1 }).first().waitFor();
      await ready();
      await page.waitForLoadState('networkidle');
      expect(await accessibilityProblems(page), path).toEqual([]);
    }
    // The key page's create form has descriptions too; its Revoke opens a confirmation.
    await page.goto(`${server.directUrl}/console/keys?account_id=${accountId}`);
    await page.getByText('Empty: unlimited.').waitFor();
    await page.getByRole('button', { name: 'Revoke key prod' }).click();
    const dialog = page.getByRole('dialog', { name: 'Revoke this key?' });
    await dialog.getByRole('button', { name: 'Revoke key' }).waitFor();
    await expect.poll(() => accessibilityProblems(page)).toEqual([]);
    await dialog.getByRole('button', { name: 'Close' }).click();
    await dialog.waitFor({ state: 'detached' });
    expect((await api(`/admin/v1/api-keys/${keyId}`)).body.is_active).toBe(true);
    expect(pageErrors).toEqual([]);
  }, 90_000);
});
