/**
 * The console's "Grant or deduct credits" form when an answer goes missing, in headless Chromium
 * (Debian's /usr/bin/chromium, driven by playwright-core) against the real app: each adjustment the
 * operator means carries one idempotency key, kept across submits of the same values until one
 * succeeds, so a grant whose answer was lost (the server applied it, the page saw 503) and is
 * submitted again is applied once; a failure that leaves the outcome unknown (a 5xx, no answer) is not
 * called a refusal, and says that submitting again is safe. Other values, or a success, take a new key.
 */
import { chromium, type Browser, type Page, type Route } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { ensureConsoleBuild } from './console-build.ts';

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let server: TestServer;
let browser: Browser;
let page: Page;
const pageErrors: string[] = [];
/** The bodies of the credit adjustments the page sent, in order. */
const sent: Json[] = [];
/** What happens to the next adjustment the page sends. */
let next: 'pass' | 'lose-answer' | 'no-answer' = 'pass';

async function api(path: string, init: RequestInit = {}): Promise<{ status: number; body: Json }> {
  const res = await fetch(`${server.directUrl}${path}`, { ...init, headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' } });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as Json) : {} };
}

async function adjustments(route: Route): Promise<void> {
  sent.push(route.request().postDataJSON() as Json);
  const mode = next;
  next = 'pass';
  if (mode === 'no-answer') return route.abort('failed');
  if (mode === 'lose-answer') {
    // The server applies it; the page is told what a commit whose answer was lost is answered.
    expect((await route.fetch()).status()).toBe(200);
    return route.fulfill({
      status: 503,
      headers: { 'Retry-After': '2', 'X-Request-Id': 'req_lost_answer' },
      json: { error: { message: 'The database is unavailable right now; retry in 2 s.', type: 'server_error', code: 'database_unavailable', param: null, request_id: 'req_lost_answer' } },
    });
  }
  return route.fallback();
}

beforeAll(async () => {
  ensureConsoleBuild();
  server = await startTestServer();
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'] });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  context.setDefaultTimeout(15_000);
  await context.route('**/*', (route) => {
    const { protocol, hostname } = new URL(route.request().url());
    if (protocol === 'data:' || protocol === 'blob:' || hostname === '127.0.0.1') return route.continue();
    return route.abort('blockedbyclient');
  });
  page = await context.newPage();
  page.on('pageerror', (err) => pageErrors.push(err.message));
  await page.route('**/admin/v1/accounts/*/credits', adjustments);
  await page.goto(`${server.directUrl}/console/`);
  await page.getByLabel('Admin token').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Dashboard' }).waitFor();
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await server?.close();
});

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe('console credit adjustments retried', { timeout: 60_000 }, () => {
  let accountId = '';
  const form = () => page.getByRole('form', { name: 'Grant or deduct credits' });
  const balance = async () => (await api(`/admin/v1/accounts/${accountId}`)).body.balance as number;
  const grants = async () => ((await api(`/admin/v1/ledger?account_id=${accountId}&kind=grant,debit`)).body.data as Json[]).map((e) => [e.kind, e.amount, e.reason]);

  async function submitGrant(credits: string, reason: string): Promise<void> {
    await form().getByLabel('Credits').fill(credits);
    await form().getByLabel('Reason').fill(reason);
    await form().getByRole('button', { name: 'Grant credits' }).click();
  }

  it('a grant whose answer was lost: the outcome is called unknown, not refused, and submitting it again applies nothing more', async () => {
    const created = await api('/admin/v1/accounts', { method: 'POST', body: JSON.stringify({ name: 'Retry Co' }) });
    expect(created.status).toBe(201);
    accountId = created.body.id;
    await page.goto(`${server.directUrl}/console/accounts/${accountId}`);
    await page.getByRole('heading', { level: 1, name: 'Retry Co' }).waitFor();

    next = 'lose-answer';
    await submitGrant('50', 'invoice 7');
    const alert = form().getByTestId('api-error');
    await expect.poll(() => alert.textContent()).toContain('The outcome of the adjustment is unknown');
    expect(await alert.textContent()).toContain('HTTP 503 · database_unavailable');
    expect(await form().getByTestId('adjust-outcome-unknown').textContent()).toContain('Submitting the same adjustment again is safe: it will not be applied twice.');
    expect(await form().getByText('The adjustment was refused').count()).toBe(0);
    expect(await balance()).toBe(50); // it was applied

    await form().getByRole('button', { name: 'Grant credits' }).click();
    await expect.poll(() => page.getByTestId('account-balance').textContent()).toBe('50');
    expect(await form().getByTestId('api-error').count()).toBe(0);
    expect(await balance()).toBe(50);
    expect(await grants()).toEqual([['grant', 50, 'invoice 7']]);
    expect(sent).toHaveLength(2);
    expect(sent[0]).toEqual({ amount: 50, reason: 'invoice 7', idempotency_key: expect.stringMatching(UUID) });
    expect(sent[1]).toEqual(sent[0]);
  });

  it('after a success, the same values again are a new adjustment with a new key', async () => {
    await submitGrant('50', 'invoice 7');
    await expect.poll(() => page.getByTestId('account-balance').textContent()).toBe('100');
    expect(sent).toHaveLength(3);
    expect(sent[2]!.idempotency_key).toMatch(UUID);
    expect(sent[2]!.idempotency_key).not.toBe(sent[0]!.idempotency_key);
    expect(await grants()).toEqual([
      ['grant', 50, 'invoice 7'],
      ['grant', 50, 'invoice 7'],
    ]);
  });

  it('no answer at all is an unknown outcome too; changed values after it take a new key', async () => {
    next = 'no-answer';
    await submitGrant('10', 'typo');
    await expect.poll(() => form().getByTestId('api-error').textContent()).toContain('The outcome of the adjustment is unknown');
    expect(await form().getByTestId('api-error').textContent()).toContain('network_error');
    expect(await balance()).toBe(100); // this time nothing reached the server

    await form().getByLabel('Credits').fill('20');
    await form().getByRole('button', { name: 'Grant credits' }).click();
    await expect.poll(() => page.getByTestId('account-balance').textContent()).toBe('120');
    expect(sent.slice(3).map((b) => b.amount)).toEqual([10, 20]);
    expect(sent[4]!.idempotency_key).toMatch(UUID);
    expect(sent[4]!.idempotency_key).not.toBe(sent[3]!.idempotency_key);
  });

  it('a refusal is still called one', async () => {
    await form().getByText('Deduct', { exact: true }).click();
    await form().getByLabel('Credits').fill('1000');
    await form().getByLabel('Reason').fill('too much');
    await form().getByRole('button', { name: 'Deduct credits' }).click();
    await page.getByRole('dialog', { name: 'Deduct credits?' }).getByRole('button', { name: 'Deduct', exact: true }).click();
    await expect.poll(() => form().getByTestId('api-error').textContent()).toContain('The adjustment was refused');
    expect(await form().getByTestId('api-error').textContent()).toContain('HTTP 402 · insufficient_balance');
    expect(await form().getByTestId('adjust-outcome-unknown').count()).toBe(0);
    expect(await balance()).toBe(120);
    expect(pageErrors).toEqual([]);
  });
});
