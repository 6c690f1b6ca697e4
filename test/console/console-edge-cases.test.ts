/**
 * The operator console where it used to go wrong, in headless Chromium (Debian's /usr/bin/chromium,
 * driven by playwright-core) against the real app, with the browser in a time zone far east of UTC
 * (Pacific/Kiritimati, UTC+14): decimals typed and submitted with Enter (Mantine hands them over as
 * strings until the field loses focus), a cleared price, usage periods against the range inputs, a
 * key's group among more than a hundred, links from a filtered list back to the whole list, a
 * malformed URL and a page that throws, and a CSV download with a token the server no longer takes.
 */
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, createGroup, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { ensureConsoleBuild } from './console-build.ts';

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
declare const sessionStorage: { length: number; setItem(k: string, v: string): void }; // the page's, in page.evaluate

const TIME_ZONE = 'Pacific/Kiritimati';
let server: TestServer;
let browser: Browser;
let page: Page;
const outside: string[] = [];
const pageErrors: string[] = [];

async function api(path: string, init: RequestInit = {}): Promise<{ status: number; body: Json }> {
  const res = await fetch(`${server.directUrl}${path}`, { ...init, headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' } });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as Json) : {} };
}

async function open(path: string, heading: string): Promise<void> {
  await page.goto(`${server.directUrl}/console${path}`);
  await page.getByRole('heading', { level: 1, name: heading }).waitFor();
}

async function nav(label: string, heading: string): Promise<void> {
  await page.getByRole('navigation', { name: 'Console sections' }).getByRole('link', { name: label, exact: true }).click();
  await page.getByRole('heading', { level: 1, name: heading }).waitFor();
}

async function signIn(): Promise<void> {
  await page.goto(`${server.directUrl}/console/`);
  await page.getByLabel('Admin token').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Dashboard' }).waitFor();
}

beforeAll(async () => {
  ensureConsoleBuild();
  server = await startTestServer();
  await seedCatalog(server.db);
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'] });
  const context = await browser.newContext({ timezoneId: TIME_ZONE, viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  context.setDefaultTimeout(15_000);
  await context.route('**/*', (route) => {
    const { protocol, hostname } = new URL(route.request().url());
    if (protocol === 'data:' || protocol === 'blob:' || hostname === '127.0.0.1') return route.continue();
    outside.push(route.request().url());
    return route.abort('blockedbyclient');
  });
  page = await context.newPage();
  page.on('pageerror', (err) => pageErrors.push(err.message));
  await signIn();
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await server?.close();
});

describe(`the operator console at the edges (browser in ${TIME_ZONE})`, () => {
  let accountId = '';
  let customer: Awaited<ReturnType<typeof createCustomer>>;
  let imageTaskId = '';

  it('runs in the time zone it says', async () => {
    expect(await page.evaluate(() => Intl.DateTimeFormat().resolvedOptions().timeZone)).toBe(TIME_ZONE);
  });

  it('creates an account with a decimal of initial credits submitted with Enter', async () => {
    await open('/accounts', 'Accounts');
    const form = page.getByRole('form', { name: 'Create an account' });
    await form.getByLabel('Account name').fill('Decimal Co');
    await form.getByLabel('Initial credits').fill('100.50');
    await form.getByLabel('Initial credits').press('Enter');
    await page.getByRole('heading', { level: 1, name: 'Decimal Co' }).waitFor();
    accountId = decodeURIComponent(page.url().split('/').pop()!);
    expect(await page.getByTestId('account-balance').textContent()).toBe('100.5');
    expect((await api(`/admin/v1/accounts/${accountId}`)).body.balance).toBe(100.5);
  });

  it('grants a decimal of credits submitted with Enter', async () => {
    const grant = page.getByRole('form', { name: 'Grant or deduct credits' });
    await grant.getByLabel('Reason').fill('half a credit');
    await grant.getByLabel('Credits').fill('0.50');
    await grant.getByLabel('Credits').press('Enter');
    await expect.poll(() => page.getByTestId('account-balance').textContent()).toBe('101');
    expect((await api(`/admin/v1/accounts/${accountId}`)).body.balance).toBe(101);
  });

  it("edits a key's quota to a decimal with Enter, and refuses a quota that is no number (the key keeps its quota)", async () => {
    const group = await createGroup(server.db, { name: 'quota-group' });
    const created = await api('/admin/v1/api-keys', { method: 'POST', body: JSON.stringify({ account_id: accountId, name: 'quota-key', group_id: group.id, credit_limit: 5 }) });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    await open(`/keys?account_id=${accountId}`, 'API keys');
    const quota = async () => ((await api(`/admin/v1/api-keys?account_id=${accountId}`)).body.data as Json[]).find((k) => k.name === 'quota-key')!;

    await page.getByRole('button', { name: 'Edit limits of key quota-key' }).click();
    const dialog = page.getByRole('dialog', { name: 'Limits of key quota-key' });
    await dialog.getByLabel('Credit quota').fill('2.50');
    await dialog.getByLabel('Credit quota').press('Enter');
    await dialog.waitFor({ state: 'detached' });
    expect(await quota()).toMatchObject({ credit_limit: 2.5, unlimited: false });

    await page.getByRole('button', { name: 'Edit limits of key quota-key' }).click();
    await dialog.getByLabel('Credit quota').fill('-');
    await dialog.getByLabel('Credit quota').press('Enter');
    expect(await dialog.getByTestId('api-error').textContent()).toContain('Credit quota: “-” is not a number.');
    expect(await quota()).toMatchObject({ credit_limit: 2.5, unlimited: false });
    await page.keyboard.press('Escape');
    await dialog.waitFor({ state: 'detached' });
  });

  it('creates a key with a decimal quota submitted with Enter', async () => {
    await open(`/keys?account_id=${accountId}`, 'API keys');
    const form = page.getByRole('form', { name: 'Create an API key' });
    expect(await form.getByLabel('Account id').inputValue()).toBe(accountId);
    await form.getByLabel('Key name').fill('dime-key');
    await form.getByLabel('Group').click();
    await page.getByRole('option', { name: 'quota-group', exact: true }).click();
    await form.getByLabel('Credit quota').fill('0.10');
    await form.getByLabel('Credit quota').press('Enter');
    await page.getByTestId('new-api-key').waitFor();
    const key = ((await api(`/admin/v1/api-keys?account_id=${accountId}`)).body.data as Json[]).find((k) => k.name === 'dime-key');
    expect(key).toMatchObject({ credit_limit: 0.1, unlimited: false });
  });

  it("adds a member whose concurrency limit, typed as '4.0' and submitted with Enter, is 4", async () => {
    const group = await createGroup(server.db, { name: 'decimal-group' });
    await open(`/groups/${group.id}`, 'Group decimal-group');
    const add = page.getByRole('form', { name: 'Add a member' });
    await add.getByLabel('Member name').fill('four-at-once');
    await add.getByLabel('Models').fill('local-image-1');
    await add.getByLabel('Concurrency limit').fill('4.0');
    await add.getByLabel('Concurrency limit').press('Enter');
    await page.getByRole('table', { name: 'Members' }).getByRole('row').filter({ hasText: 'four-at-once' }).waitFor();
    expect((await api(`/admin/v1/groups/${group.id}/members`)).body.data).toMatchObject([{ name: 'four-at-once', concurrency_limit: 4 }]);
  });

  it('refuses to save a cleared or non-numeric price instead of making the row free', async () => {
    await page.goto(`${server.directUrl}/console/models/local-video-1`);
    const form = page.getByRole('form', { name: 'Edit the model' });
    await form.waitFor();
    const before = (await api('/admin/v1/models/local-video-1')).body.pricing;
    await form.getByLabel('Unit price for 360p').fill('');
    await form.getByRole('button', { name: 'Save model' }).click();
    expect(await form.getByTestId('api-error').textContent()).toContain('Unit price for 360p is empty: enter a number.');

    await form.getByLabel('Unit price for 360p').fill('-');
    await form.getByLabel('Unit price for 360p').press('Enter');
    await expect.poll(() => form.getByTestId('api-error').textContent()).toContain('Unit price for 360p: “-” is not a number.');
    expect(await page.getByTestId('price-change').count()).toBe(0);
    expect((await api('/admin/v1/models/local-video-1')).body.pricing).toEqual(before);
  });

  it("shows what a model accepts and changes an image model's settings and a video model's reference-image limit", async () => {
    await open('/models/local-image-pro', 'Local Image Pro (quality tiers, transparency) local-image-pro');
    const caps = page.getByRole('table', { name: 'Image capabilities' });
    expect(await caps.getByRole('row').filter({ hasText: 'Resolution tiers' }).textContent()).toContain('1K, 2K, 4K');
    expect(await caps.getByRole('row').filter({ hasText: 'Transparent background' }).textContent()).toContain('yes');
    expect(await caps.getByRole('row').filter({ hasText: 'Images per request' }).textContent()).toContain('up to 10');
    const form = page.getByRole('form', { name: 'Edit the model' });
    await form.getByLabel('Edits images').uncheck();
    await form.getByLabel('Answer size', { exact: true }).first().click();
    await page.getByRole('option', { name: "Native: the upstream's nearest size" }).click();
    await form.getByRole('button', { name: 'Save model' }).click();
    await page.getByTestId('price-change').waitFor();
    const image = (await api('/admin/v1/models/local-image-pro')).body;
    expect(image.image).toMatchObject({ edits: false, resize: 'native', custom_size_ratios: 'any' });

    // A video model: its facts, and the limit it lets an operator lower (only what changed is sent).
    await open('/models/local-video-1', 'Local Video 1 (per second, first and last frame) local-video-1');
    const video = page.getByRole('table', { name: 'Video capabilities' });
    expect(await video.getByRole('row').filter({ hasText: 'Durations' }).textContent()).toContain('2, 4, 6, 8');
    expect(await video.getByRole('row').filter({ hasText: 'Frames' }).textContent()).toContain('a first frame and an optional last frame');
    await form.getByLabel('Reference images').fill('3');
    await form.getByRole('button', { name: 'Save model' }).click();
    await page.getByTestId('price-change').waitFor();
    expect((await api('/admin/v1/models/local-video-1')).body.video.reference_images.max_count).toBe(3);
    await form.getByLabel('Reference images').fill('11');
    await form.getByRole('button', { name: 'Save model' }).click();
    expect(await form.getByTestId('api-error').textContent()).toContain('takes at most 10 reference images');
    expect((await api('/admin/v1/models/local-video-1')).body.video.reference_images.max_count).toBe(3);
  });

  it('names usage periods in UTC, the range inputs too: a UTC day is not labelled with the local date', async () => {
    // A task at 20:00 UTC on 10 March, 10:00 on 11 March in Kiritimati.
    customer = await createCustomer(server.db, { balance: 100 });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${customer.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'a kite', model: 'local-image-1', response_format: 'url' }),
    });
    expect(res.status).toBe(200);
    imageTaskId = res.headers.get('x-task-id')!;
    await server.db.updateTable('imageTasks').set({ createdAt: new Date('2026-03-10T20:00:00Z') }).where('id', '=', imageTaskId).execute();

    await open('/usage', 'Usage');
    const form = page.getByRole('form', { name: 'Usage report' });
    await form.getByLabel('From (UTC)').fill('2026-03-10T00:00');
    await form.getByLabel('To (UTC)').fill('2026-03-11T00:00');
    await form.getByLabel('Account id').fill(customer.accountId);
    await form.getByRole('button', { name: 'Run report' }).click();
    const table = page.getByRole('table', { name: 'Usage rows' });
    await expect.poll(() => table.locator('tbody tr').allTextContents()).toEqual([expect.stringMatching(/^2026-03-10 00:00acct_/)]);
    expect(await table.locator('thead th').first().textContent()).toBe('Period (UTC)');
    await expect.poll(() => page.locator('figure .recharts-xAxis-tick-labels .recharts-cartesian-axis-tick-value').allTextContents()).toEqual(['2026-03-10']);
    expect(await page.locator('figcaption').textContent()).toBe('Credits spent and refunded per day, 2026-03-10 00:00 to 2026-03-11 00:00 UTC.');
  });

  it('offers every group when creating a key (more than a hundred, by search) and creates the key in the one picked', async () => {
    for (let i = 1; i <= 105; i++) await createGroup(server.db, { name: `bulk-group-${String(i).padStart(3, '0')}` });
    const first = (await api('/admin/v1/groups?limit=100')).body;
    const beyond = (await api(`/admin/v1/groups?limit=100&cursor=${encodeURIComponent(first.next_cursor)}`)).body.data[0] as Json;
    expect(first.data.map((g: Json) => g.id)).not.toContain(beyond.id);

    await open(`/keys?account_id=${accountId}`, 'API keys');
    const form = page.getByRole('form', { name: 'Create an API key' });
    await form.getByLabel('Key name').fill('far-group-key');
    await form.getByLabel('Group').fill(beyond.name);
    await page.getByRole('option', { name: beyond.name, exact: true }).click();
    await form.getByRole('button', { name: 'Create key' }).click();
    await page.getByTestId('new-api-key').waitFor();
    const key = ((await api(`/admin/v1/api-keys?account_id=${accountId}`)).body.data as Json[]).find((k) => k.name === 'far-group-key');
    expect(key?.group_id).toBe(beyond.id);
  }, 60_000);

  it('drops a filter the URL no longer has: from a list of one account back to the whole list', async () => {
    // Decimal Co has no task; the customer's image task is listed once the filter is gone.
    await open(`/accounts/${accountId}`, 'Decimal Co');
    await page.getByRole('link', { name: 'Tasks of this account' }).click();
    await page.getByRole('heading', { level: 1, name: 'Tasks' }).waitFor();
    const taskFilters = page.getByRole('form', { name: 'Task filters' });
    expect(await taskFilters.getByLabel('Account id').inputValue()).toBe(accountId);
    await page.getByRole('table', { name: 'Tasks' }).getByText('No tasks match.').waitFor();
    await nav('Tasks', 'Tasks');
    await page.getByRole('table', { name: 'Tasks' }).locator(`tr[data-task-id="${imageTaskId}"]`).waitFor();
    expect(await taskFilters.getByLabel('Account id').inputValue()).toBe('');

    await page.goBack();
    await page.getByRole('table', { name: 'Tasks' }).getByText('No tasks match.').waitFor();
    expect(await taskFilters.getByLabel('Account id').inputValue()).toBe(accountId);

    await open(`/accounts/${accountId}`, 'Decimal Co');
    await page.getByRole('link', { name: 'API keys of this account' }).click();
    await page.getByRole('heading', { level: 1, name: 'API keys' }).waitFor();
    const keyFilters = page.getByRole('form', { name: 'API key filters' });
    expect(await keyFilters.getByLabel('Account id').inputValue()).toBe(accountId);
    await nav('API keys', 'API keys');
    await page.getByRole('table', { name: 'API keys' }).getByRole('row').filter({ hasText: customer.accountId }).waitFor();
    expect(await keyFilters.getByLabel('Account id').inputValue()).toBe('');
    expect(await page.getByRole('form', { name: 'Create an API key' }).getByLabel('Account id').inputValue()).toBe('');

    await open(`/ledger?account_id=${accountId}`, 'Ledger');
    const ledgerFilters = page.getByRole('form', { name: 'Ledger filters' });
    expect(await ledgerFilters.getByLabel('Account id').inputValue()).toBe(accountId);
    await nav('Ledger', 'Ledger');
    await page.getByRole('table', { name: 'Ledger entries' }).getByRole('row').filter({ hasText: customer.accountId }).first().waitFor();
    expect(await ledgerFilters.getByLabel('Account id').inputValue()).toBe('');
  }, 60_000);

  it('answers a malformed URL with its not-found page, and a page that throws with an error, the console still working', async () => {
    await page.goto(`${server.directUrl}/console/tasks/vid_%E0%A4%A`);
    await page.getByRole('heading', { level: 1, name: 'No such page' }).waitFor();
    expect(await page.getByText('The console has no page at /tasks/vid_%E0%A4%A.').count()).toBe(1);

    // A task the page cannot render (a body without the fields it reads) throws inside React.
    await page.route('**/admin/v1/tasks/vid_broken', (route) => route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify({ id: 'vid_broken' }) }));
    await page.goto(`${server.directUrl}/console/tasks/vid_broken`);
    const failure = page.getByRole('alert').filter({ hasText: 'This page failed' });
    await failure.waitFor();
    await nav('Accounts', 'Accounts');
    expect(await failure.count()).toBe(0);
  });

  it('signs out when the CSV download is refused 401, like every other call', async () => {
    await open('/usage', 'Usage');
    await page.evaluate(() => sessionStorage.setItem('mediagate.adminToken', 'a-token-the-server-no-longer-takes'));
    await page.getByRole('button', { name: 'Download CSV' }).click();
    await page.getByRole('heading', { name: 'Wrong admin token' }).waitFor();
    expect(await page.evaluate(() => sessionStorage.length)).toBe(0);
  });

  it('made no request beyond loopback and threw no page errors', () => {
    expect(outside).toEqual([]);
    expect(pageErrors).toEqual([]);
  });
});
