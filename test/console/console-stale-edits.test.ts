/**
 * The console's edit forms against changes made after the page was loaded, in headless Chromium
 * (Debian's /usr/bin/chromium, driven by playwright-core) against the real app: a form sends only
 * the members the operator changed, so a save does not write the page's old copy back over another
 * operator's price, suspension, key limit or disabled member, and a form with nothing changed sends
 * nothing. Also: the "Add a member" form's credentials (masked, cleared after the add, never quoted in
 * an error), and a task listing linked with the API's own `?status=a,b`.
 */
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAccount, createGroup, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { ensureConsoleBuild } from './console-build.ts';

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let server: TestServer;
let browser: Browser;
let page: Page;
const outside: string[] = [];
const pageErrors: string[] = [];
/** The bodies of the admin API updates the page sent, in order. */
const patches: { path: string; body: Json }[] = [];

async function api(path: string, init: RequestInit = {}): Promise<{ status: number; body: Json }> {
  const res = await fetch(`${server.directUrl}${path}`, { ...init, headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' } });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as Json) : {} };
}

async function patch(path: string, body: Json): Promise<Json> {
  const res = await api(path, { method: 'PATCH', body: JSON.stringify(body) });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

async function open(path: string, heading: string): Promise<void> {
  await page.goto(`${server.directUrl}/console${path}`);
  await page.getByRole('heading', { level: 1, name: heading }).waitFor();
}

beforeAll(async () => {
  ensureConsoleBuild();
  server = await startTestServer();
  await seedCatalog(server.db);
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'] });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  context.setDefaultTimeout(15_000);
  await context.route('**/*', (route) => {
    const { protocol, hostname } = new URL(route.request().url());
    if (protocol === 'data:' || protocol === 'blob:' || hostname === '127.0.0.1') return route.continue();
    outside.push(route.request().url());
    return route.abort('blockedbyclient');
  });
  page = await context.newPage();
  page.on('pageerror', (err) => pageErrors.push(err.message));
  page.on('request', (req) => {
    if (req.method() === 'PATCH') patches.push({ path: new URL(req.url()).pathname, body: req.postDataJSON() as Json });
  });
  await page.goto(`${server.directUrl}/console/`);
  await page.getByLabel('Admin token').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Dashboard' }).waitFor();
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await server?.close();
});

describe('console edit forms send only what the operator changed', () => {
  const prices = async () => Object.fromEntries(((await api('/admin/v1/models/local-video-1')).body.pricing as Json[]).map((p) => [p.resolution, p.unit_price]));

  it("renames a model without reverting prices raised after the page was loaded, and says this save changed none", async () => {
    await open('/models/local-video-1', 'Local Video 1 (per second, first and last frame) local-video-1');
    const form = page.getByRole('form', { name: 'Edit the model' });
    // Another operator raises every price while this page is open.
    const loaded = (await api('/admin/v1/models/local-video-1')).body;
    const raised = (loaded.pricing as Json[]).map((p) => ({ ...p, unit_price: p.unit_price + 1 }));
    await patch('/admin/v1/models/local-video-1', { pricing: raised });
    patches.length = 0;

    await form.getByLabel('Display name').fill('Local Video One');
    await form.getByRole('button', { name: 'Save model' }).click();
    const panel = page.getByTestId('price-change');
    await panel.waitFor();
    const model = (await api('/admin/v1/models/local-video-1')).body;
    expect(model.display_name).toBe('Local Video One');
    expect(model.pricing).toEqual(raised);
    expect(await panel.textContent()).toContain('No price changed');
    expect(patches).toEqual([{ path: '/admin/v1/models/local-video-1', body: { display_name: 'Local Video One' } }]);
  });

  it('changes one price without reverting another row changed since, and lists only the row it changed', async () => {
    // The form was filled again from the saved model; now another row changes under it.
    const form = page.getByRole('form', { name: 'Edit the model' });
    await page.getByRole('button', { name: 'Dismiss' }).click();
    const before = await prices();
    const current = (await api('/admin/v1/models/local-video-1')).body.pricing as Json[];
    await patch('/admin/v1/models/local-video-1', { pricing: current.map((p) => (p.resolution === '480p' ? { ...p, unit_price: 0.5 } : p)) });
    patches.length = 0;

    await form.getByLabel('Unit price for 360p').fill('0.09');
    await form.getByRole('button', { name: 'Save model' }).click();
    const panel = page.getByTestId('price-change');
    await panel.waitFor();
    const text = (await panel.textContent())!;
    expect(text).toContain(`360p: ${before['360p']} per_second → 0.09 per_second`);
    expect(text).not.toContain('480p');
    expect(await prices()).toEqual({ ...before, '360p': 0.09, '480p': 0.5 });
    expect(patches).toHaveLength(1);
    expect(Object.keys(patches[0]!.body)).toEqual(['pricing']);
  });

  it('renames an account suspended after the page was loaded: it stays suspended; a second save with nothing changed sends nothing', async () => {
    const { id } = await createAccount(server.db, { name: 'stale-account' });
    await open(`/accounts/${id}`, 'stale-account');
    await patch(`/admin/v1/accounts/${id}`, { status: 'suspended' });
    patches.length = 0;

    const form = page.getByRole('form', { name: 'Edit the account' });
    await form.getByLabel('Name').fill('stale-account-renamed');
    await form.getByRole('button', { name: 'Save' }).click();
    await page.getByRole('heading', { level: 1, name: 'stale-account-renamed' }).waitFor();
    expect((await api(`/admin/v1/accounts/${id}`)).body).toMatchObject({ name: 'stale-account-renamed', status: 'suspended' });
    expect(patches).toEqual([{ path: `/admin/v1/accounts/${id}`, body: { name: 'stale-account-renamed' } }]);

    // The form is filled again from the answer (suspended): saving it again changes nothing.
    expect(await form.getByLabel('Status', { exact: true }).inputValue()).toBe('suspended');
    await form.getByRole('button', { name: 'Save' }).click();
    await form.getByTestId('nothing-changed').waitFor();
    expect(await form.getByTestId('nothing-changed').textContent()).toContain('nothing was sent');
    expect(patches).toHaveLength(1);
  });

  it("edits a key's quota without reverting its request limit changed after the dialog opened", async () => {
    const { id: accountId } = await createAccount(server.db);
    const group = await createGroup(server.db, { name: 'stale-keys' });
    const created = await api('/admin/v1/api-keys', { method: 'POST', body: JSON.stringify({ account_id: accountId, name: 'stale-key', group_id: group.id, credit_limit: 5 }) });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    await open(`/keys?account_id=${accountId}`, 'API keys');
    await page.getByRole('button', { name: 'Edit limits of key stale-key' }).click();
    const dialog = page.getByRole('dialog', { name: 'Limits of key stale-key' });
    await dialog.waitFor();
    await patch(`/admin/v1/api-keys/${created.body.id}`, { requests_per_minute: 77, max_in_flight: 2 });
    patches.length = 0;

    await dialog.getByLabel('Credit quota').fill('9');
    await dialog.getByRole('button', { name: 'Save limits' }).click();
    await dialog.waitFor({ state: 'detached' });
    const key = ((await api(`/admin/v1/api-keys?account_id=${accountId}`)).body.data as Json[])[0]!;
    expect(key).toMatchObject({ credit_limit: 9, requests_per_minute: 77, max_in_flight: 2 });
    expect(patches).toEqual([{ path: `/admin/v1/api-keys/${created.body.id}`, body: { credit_limit: 9 } }]);
  });

  it('edits a member disabled after the dialog opened: it stays disabled', async () => {
    const group = await createGroup(server.db, { name: 'stale-members' });
    const member = await api(`/admin/v1/groups/${group.id}/members`, { method: 'POST', body: JSON.stringify({ name: 'incident-member', provider: 'local', models: ['local-image-1'] }) });
    expect(member.status, JSON.stringify(member.body)).toBe(201);
    await open(`/groups/${group.id}`, 'Group stale-members');
    await page.getByRole('button', { name: 'Edit member incident-member' }).click();
    const dialog = page.getByRole('dialog', { name: 'Edit member incident-member' });
    await dialog.waitFor();
    // Disabled during an incident by another operator.
    await patch(`/admin/v1/groups/${group.id}/members/${member.body.id}`, { enabled: false });
    patches.length = 0;

    await dialog.getByLabel('Weight').fill('3');
    await dialog.getByRole('button', { name: 'Save member' }).click();
    await dialog.waitFor({ state: 'detached' });
    expect((await api(`/admin/v1/groups/${group.id}/members`)).body.data).toMatchObject([{ name: 'incident-member', enabled: false, weight: 3 }]);
    expect(patches).toEqual([{ path: `/admin/v1/groups/${group.id}/members/${member.body.id}`, body: { weight: 3 } }]);
  });
});

describe("the 'Add a member' form's credentials", () => {
  it('masks them without focus, refuses invalid JSON without quoting it, and clears the form after the add', async () => {
    const secret = 'sk-live-SECRET-0123456789';
    const group = await createGroup(server.db, { name: 'keyed-members' });
    await open(`/groups/${group.id}`, 'Group keyed-members');
    const add = page.getByRole('form', { name: 'Add a member' });
    await add.getByLabel('Member name').fill('keyed');
    await add.getByLabel('Provider', { exact: true }).click();
    await page.getByRole('option', { name: 'openai', exact: true }).click();
    await add.getByLabel('Models').fill('local-image-1');
    const field = add.getByLabel('Credentials');
    // The key's quotes forgotten: V8's JSON.parse message would quote `"api_key": sk-live-SE`.
    await field.fill(`{\n  "api_key": ${secret}\n}`);
    expect(await field.inputValue()).toContain(secret); // shown while it is typed
    await add.getByRole('button', { name: 'Add member' }).click();

    const error = add.getByTestId('api-error');
    await error.waitFor();
    expect(await error.textContent()).toContain('The credentials must be a JSON object, e.g. {"api_key": "…"}.');
    expect(await page.locator('body').innerText()).not.toContain('sk-live');
    expect(await field.inputValue()).not.toContain('sk-live'); // masked once the field has lost focus

    // As an operator pastes over it: click in, select all, paste (a multi-line JSON object).
    await field.click();
    expect(await field.inputValue()).toContain(secret); // shown again while it has focus
    await page.keyboard.press('ControlOrMeta+A');
    await page.keyboard.insertText(`{\n  "api_key": "${secret}"\n}`);
    await add.getByRole('button', { name: 'Add member' }).click();
    await add.page().getByRole('status').filter({ hasText: 'Member “keyed” added.' }).waitFor();
    const members = (await api(`/admin/v1/groups/${group.id}/members`)).body.data as Json[];
    expect(members).toMatchObject([{ name: 'keyed', provider: 'openai', has_credentials: true }]);
    expect(await add.getByLabel('Member name').inputValue()).toBe('');
    await add.getByLabel('Credentials').focus();
    expect(await add.getByLabel('Credentials').inputValue()).toBe('');
  });
});

describe('the task listing linked with the API comma form', () => {
  it('lists ?status=queued,in_progress as both statuses', async () => {
    const listed = page.waitForRequest((req) => new URL(req.url()).pathname === '/admin/v1/tasks');
    await page.goto(`${server.directUrl}/console/tasks?status=queued,in_progress`);
    expect(new URL((await listed).url()).searchParams.get('status')).toBe('queued,in_progress');
  });

  it('left no page errors and sent nothing off the machine', () => {
    expect(pageErrors).toEqual([]);
    expect(outside).toEqual([]);
  });
});
