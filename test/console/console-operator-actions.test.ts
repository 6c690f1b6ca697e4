/**
 * What an operator could not do from the console, in headless Chromium (Debian's /usr/bin/chromium,
 * driven by playwright-core) against the real app: put a member the upstream took out back in
 * rotation (an Edit with nothing changed sends nothing), delete a disabled member, see a member out for some models as trouble
 * on the dashboard and its group page, add a catalog model from its POST body (and be told so when a
 * member names a model the catalog lacks), rename a key and move it to another group, and keep the
 * filters of the task, webhook and ledger lists in the URL, so that Back and a reload show the same list.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { chromium, type Browser, type Page, type Request } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAccount, createApiKey, createGroup, createMember, imageTaskToHold, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { repoRoot } from '../support/server-process.ts';
import { ensureConsoleBuild } from './console-build.ts';
import { accessibilityProblems } from '../support/console-a11y.ts';

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

// The page's `document`, for a function that runs in the page: this project's tsconfig has no DOM library.
declare const document: any; // eslint-disable-line @typescript-eslint/no-explicit-any

let server: TestServer;
let browser: Browser;
let page: Page;
const outside: string[] = [];
const pageErrors: string[] = [];
/** The admin API writes (PATCH, POST) the page sent, in order. */
const writes: { method: string; path: string; body: Json }[] = [];

async function api(path: string, init: RequestInit = {}): Promise<{ status: number; body: Json }> {
  const res = await fetch(`${server.directUrl}${path}`, { ...init, headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' } });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as Json) : {} };
}

async function open(path: string, heading: string): Promise<void> {
  await page.goto(`${server.directUrl}/console${path}`);
  await page.getByRole('heading', { level: 1, name: heading }).waitFor();
}

/** The console's path and query now (without the origin). */
const here = () => {
  const url = new URL(page.url());
  return decodeURIComponent(`${url.pathname}${url.search}`);
};

/** The next list request the page sends to `path`, as its query. */
async function nextListing(path: string, action: () => Promise<unknown>): Promise<URLSearchParams> {
  const listed = page.waitForRequest((req: Request) => req.method() === 'GET' && new URL(req.url()).pathname === path);
  await action();
  return new URL((await listed).url()).searchParams;
}


beforeAll(async () => {
  ensureConsoleBuild();
  server = await startTestServer();
  await seedCatalog(server.db);
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'] });
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
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
    const { pathname } = new URL(req.url());
    if ((req.method() === 'PATCH' || req.method() === 'POST') && pathname.startsWith('/admin/')) writes.push({ method: req.method(), path: pathname, body: req.postDataJSON() as Json });
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

describe('members the pool keeps out', () => {
  it('puts a member back in rotation from its Edit dialog and from its row: one PATCH of `enabled` as it is, and the fault is gone', async () => {
    const group = await createGroup(server.db, { name: 'rotation' });
    const billing = await createMember(server.db, group.id, { name: 'billing-out', models: ['local-image-1'] });
    const modelOut = await createMember(server.db, group.id, { name: 'model-out', models: ['local-image-1', 'local-video-1'] });
    await createMember(server.db, group.id, { name: 'switched-off', models: ['local-image-1'], enabled: false });
    await sql`insert into member_health (member_id, account_disabled_at, account_disabled_reason) values (${billing.id}, now(), 'balance exhausted')`.execute(server.db);
    await sql`insert into member_model_faults (member_id, model, kind, reason, until) values (${modelOut.id}, 'local-video-1', 'model_not_open', 'not activated', null)`.execute(server.db);
    const health = async (id: string) => ((await api(`/admin/v1/groups/${group.id}/members`)).body.data as Json[]).find((m) => m.id === id)!.health;

    await open(`/groups/${group.id}`, 'Group rotation');
    const row = (name: string) => page.getByRole('table', { name: 'Members' }).getByRole('row').filter({ hasText: name });
    await row('billing-out').getByText('upstream account disabled').waitFor();

    // The operator paid the bill: Edit says what is wrong and puts it back, though no field changes.
    await page.getByRole('button', { name: 'Edit member billing-out' }).click();
    const dialog = page.getByRole('dialog', { name: 'Edit member billing-out' });
    await dialog.getByTestId('member-out-notice').waitFor();
    expect(await accessibilityProblems(dialog.getByTestId('member-out-notice'))).toEqual([]);
    writes.length = 0;
    await dialog.getByRole('button', { name: 'Put back in rotation: billing-out' }).click();
    await page.getByTestId('member-put-back').filter({ hasText: 'billing-out' }).waitFor();
    await dialog.waitFor({ state: 'detached' });
    expect(writes).toEqual([{ method: 'PATCH', path: `/admin/v1/groups/${group.id}/members/${billing.id}`, body: { enabled: true } }]);
    expect((await health(billing.id)).account_disabled).toBeNull();
    await row('billing-out').getByText('healthy', { exact: true }).waitFor();
    expect(await accessibilityProblems(page.getByTestId('member-put-back'))).toEqual([]);
    expect(await accessibilityProblems(row('model-out').getByRole('cell').nth(6))).toEqual([]);

    // From the row: a member out for one model.
    writes.length = 0;
    await row('model-out').getByRole('button', { name: 'Put back in rotation: model-out' }).click();
    await page.getByTestId('member-put-back').filter({ hasText: 'model-out' }).waitFor();
    expect(writes).toEqual([{ method: 'PATCH', path: `/admin/v1/groups/${group.id}/members/${modelOut.id}`, body: { enabled: true } }]);
    expect((await health(modelOut.id)).model_faults).toEqual([]);
    await row('model-out').getByText('healthy', { exact: true }).waitFor();

    // A disabled member is put back by Enable, not by this.
    expect(await row('switched-off').getByRole('button', { name: /Put back in rotation/ }).count()).toBe(0);
    expect(await row('billing-out').getByRole('button', { name: /Put back in rotation/ }).count()).toBe(0);
  }, 60_000);

  it('deletes a disabled member once no task runs on it; while one does, says why and keeps it', async () => {
    const group = await createGroup(server.db, { name: 'retire' });
    const active = await createMember(server.db, group.id, { name: 'still-on', models: ['local-image-1'] });
    const retired = await createMember(server.db, group.id, { name: 'retired-one', models: ['local-image-1'], enabled: false });
    const task = await imageTaskToHold(server.db);
    await server.db.insertInto('imageTasks').values({ ...task.row, memberId: retired.id }).execute();
    await open(`/groups/${group.id}`, 'Group retire');
    const row = (name: string) => page.getByRole('table', { name: 'Members' }).getByRole('row').filter({ hasText: name });
    await row('retired-one').waitFor();
    // Only a disabled member offers Delete.
    expect(await row('still-on').getByRole('button', { name: /Delete member/ }).count()).toBe(0);
    const confirmDelete = async () => {
      await row('retired-one').getByRole('button', { name: 'Delete member retired-one' }).click();
      await page.getByRole('dialog', { name: 'Delete this member?' }).getByRole('button', { name: 'Delete member' }).click();
    };
    await confirmDelete();
    await page.getByText('1 task that has not finished runs').waitFor();
    expect(await server.db.selectFrom('groupMembers').select('id').where('id', '=', retired.id).executeTakeFirst()).toBeDefined();

    await server.db.updateTable('imageTasks').set({ status: 'failed', errorMessage: 'x', completedAt: new Date() }).where('id', '=', task.taskId).execute();
    await confirmDelete();
    await page.getByTestId('member-put-back').filter({ hasText: 'Member “retired-one” deleted.' }).waitFor();
    await row('retired-one').waitFor({ state: 'detached' });
    expect(await server.db.selectFrom('groupMembers').select('id').where('id', '=', retired.id).executeTakeFirst()).toBeUndefined();
    expect(await server.db.selectFrom('groupMembers').select('id').where('id', '=', active.id).executeTakeFirst()).toBeDefined();
  }, 60_000);

  it('counts a member out for some models as trouble: listed on the dashboard, and an orange badge rather than "healthy" on its group page', async () => {
    const group = await createGroup(server.db, { name: 'faults' });
    const member = await createMember(server.db, group.id, { name: 'not-open', models: ['local-image-1', 'local-video-1'] });
    await sql`insert into member_model_faults (member_id, model, kind, reason, until) values (${member.id}, 'local-image-1', 'model_not_open', 'The account has not activated this model', null)`.execute(server.db);

    await open('/', 'Dashboard');
    const table = page.getByRole('table', { name: 'Members needing attention' });
    await table.or(page.getByText('Every member is enabled and healthy.')).waitFor();
    const listed = table.getByRole('row').filter({ hasText: 'not-open' });
    await listed.waitFor();
    expect(await listed.locator('.mantine-Badge-root').innerText()).toMatch(/^out for 1 model$/i);
    expect(await listed.innerText()).toContain('local-image-1: model_not_open');
    expect(await listed.innerText()).toContain('until an admin updates it');
    expect(await accessibilityProblems(listed)).toEqual([]);

    await open(`/groups/${group.id}`, 'Group faults');
    const row = page.getByRole('table', { name: 'Members' }).getByRole('row').filter({ hasText: 'not-open' });
    await row.getByText('model_not_open', { exact: false }).waitFor();
    const badge = row.locator('.mantine-Badge-root');
    expect(await badge.innerText()).toMatch(/^out for 1 model$/i);
    expect(await badge.getAttribute('style')).toContain('orange');
  }, 60_000);
});

describe('catalog models and keys', () => {
  const definition = JSON.parse(readFileSync(join(repoRoot, 'server/catalog/definitions/openai/gpt-image-1.5.json'), 'utf8')).model as Json;

  it('creates a catalog model from its POST body: the server names the field it refuses, and the new model opens', async () => {
    await open('/models', 'Models & prices');
    const form = page.getByRole('form', { name: 'Create a model' });
    expect(await form.innerText()).toContain('npm run admin -- models definitions');
    const field = form.getByLabel('Model (JSON)');

    await field.fill(JSON.stringify({ ...definition, image: { ...definition.image, aspect_ratios: ['1:1', '4:1'] } }, null, 2));
    await form.getByRole('button', { name: 'Create model' }).click();
    const error = form.getByTestId('api-error');
    await error.waitFor();
    expect(await error.innerText()).toContain('4:1');
    expect(await error.innerText()).toContain('image.aspect_ratios');
    expect(await accessibilityProblems(form)).toEqual([]);
    expect((await api('/admin/v1/models/gpt-image-1.5')).status).toBe(404);

    writes.length = 0;
    await field.fill(JSON.stringify(definition, null, 2));
    await form.getByRole('button', { name: 'Create model' }).click();
    await page.getByRole('heading', { level: 1, name: 'GPT Image 1.5 gpt-image-1.5' }).waitFor();
    expect(here()).toBe('/console/models/gpt-image-1.5');
    expect(writes).toEqual([{ method: 'POST', path: '/admin/v1/models', body: definition }]);
    expect((await api('/admin/v1/models/gpt-image-1.5')).body).toMatchObject({ id: 'gpt-image-1.5', kind: 'image', pricing: definition.pricing });
  }, 60_000);

  it("points the member form's unknown-model error to creating the model", async () => {
    const group = await createGroup(server.db, { name: 'new-models' });
    await open(`/groups/${group.id}`, 'Group new-models');
    const form = page.getByRole('form', { name: 'Add a member' });
    await form.getByLabel('Member name').fill('openai-main');
    await form.getByLabel('Provider', { exact: true }).click();
    await page.getByRole('option', { name: 'openai', exact: true }).click();
    await form.getByLabel('Models').fill('gpt-image-2');
    await form.getByLabel('Credentials').fill('{"api_key": "sk-x"}');
    await form.getByRole('button', { name: 'Add member' }).click();
    expect(await form.getByTestId('api-error').innerText()).toContain('Unknown catalog model: gpt-image-2.');
    const hint = form.getByTestId('unknown-model-hint');
    expect(await hint.innerText()).toContain('npm run admin -- models definitions --provider openai');
    expect(await accessibilityProblems(hint)).toEqual([]);

    await hint.getByRole('link', { name: /Create a model/ }).click();
    await page.getByRole('heading', { level: 1, name: 'Models & prices' }).waitFor();
    const field = page.getByRole('form', { name: 'Create a model' }).getByLabel('Model (JSON)');
    await expect.poll(() => field.evaluate((el) => el === document.activeElement)).toBe(true);
  }, 60_000);

  it('renames a key and moves it to another group, sending only what changed', async () => {
    const { id: accountId } = await createAccount(server.db, { name: 'movers' });
    const from = await createGroup(server.db, { name: 'old-group' });
    const to = await createGroup(server.db, { name: 'new-group' });
    const key = await createApiKey(server.db, { accountId, groupId: from.id, name: 'mover' });
    await open(`/keys?account_id=${accountId}`, 'API keys');
    await page.getByRole('button', { name: 'Rename or move key mover' }).click();
    const dialog = page.getByRole('dialog', { name: 'Key mover' });
    await dialog.getByLabel('Key name').fill('mover-2');
    await dialog.getByLabel('Group', { exact: true }).click();
    await page.getByRole('option', { name: 'new-group', exact: true }).click();
    await dialog.getByTestId('key-move-notice').waitFor();
    expect(await accessibilityProblems(dialog.getByTestId('key-move-notice'))).toEqual([]);
    writes.length = 0;
    await dialog.getByRole('button', { name: 'Save key' }).click();
    await dialog.waitFor({ state: 'detached' });
    expect(writes).toEqual([{ method: 'PATCH', path: `/admin/v1/api-keys/${key.id}`, body: { name: 'mover-2', group_id: to.id } }]);
    expect((await api(`/admin/v1/api-keys/${key.id}`)).body).toMatchObject({ name: 'mover-2', group_id: to.id });
    await page.getByRole('table', { name: 'API keys' }).getByRole('row').filter({ hasText: 'mover-2' }).getByText('new-group').waitFor();

    // The name alone: the group is not sent.
    await page.getByRole('button', { name: 'Rename or move key mover-2' }).click();
    const again = page.getByRole('dialog', { name: 'Key mover-2' });
    await again.getByLabel('Key name').fill('mover-3');
    writes.length = 0;
    await again.getByRole('button', { name: 'Save key' }).click();
    await again.waitFor({ state: 'detached' });
    expect(writes).toEqual([{ method: 'PATCH', path: `/admin/v1/api-keys/${key.id}`, body: { name: 'mover-3' } }]);
  }, 60_000);
});

describe('list filters in the URL', () => {
  let accountId = '';

  beforeAll(async () => {
    const group = await createGroup(server.db, { name: 'listed' });
    await createMember(server.db, group.id, { name: 'listed-local' });
    accountId = (await createAccount(server.db, { name: 'listed-account', balance: 100 })).id;
    const { key } = await createApiKey(server.db, { accountId, groupId: group.id });
    const post = (path: string, body: Json) => fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    expect((await post('/v1/images/generations', { model: 'local-image-1', prompt: 'x' })).status).toBe(200);
    expect((await post('/v1/videos/generations', { client_request_id: 'listed-1', prompt: 'x', model: 'local-video-1', seconds: 4, aspectRatio: '16:9', resolution: '720p' })).status).toBeLessThan(300);
  });

  it('tasks: Apply writes the filters into the URL; Back from a task and a reload list the same tasks', async () => {
    await open(`/tasks?account_id=${accountId}`, 'Tasks');
    const form = page.getByRole('form', { name: 'Task filters' });
    await form.getByRole('combobox', { name: 'Kind' }).click();
    await page.getByRole('option', { name: 'Video', exact: true }).click();
    await form.getByLabel('Created after').fill('2020-01-02T03:04');
    const after = await page.evaluate(() => new Date('2020-01-02T03:04').toISOString());
    const query = await nextListing('/admin/v1/tasks', () => form.getByRole('button', { name: 'Apply filters' }).click());
    expect(Object.fromEntries(query)).toMatchObject({ kind: 'video', account_id: accountId, created_after: after });
    expect(here()).toBe(`/console/tasks?kind=video&account_id=${accountId}&created_after=${after}`);

    const ids = () => page.locator('table[aria-label="Tasks"] tbody tr[data-task-id]').evaluateAll((trs) => trs.map((t) => t.getAttribute('data-task-id')!));
    await expect.poll(async () => (await ids()).length).toBe(1);
    expect((await ids())[0]).toMatch(/^vid_/);

    await page.locator('table[aria-label="Tasks"] tbody a').first().click();
    await page.getByRole('heading', { level: 1, name: /Video task/ }).waitFor();
    const back = await nextListing('/admin/v1/tasks', () => page.goBack());
    expect(back.get('kind')).toBe('video');
    expect(back.get('created_after')).toBe(after);
    await expect.poll(async () => (await ids()).length).toBe(1);
    expect((await ids())[0]).toMatch(/^vid_/);
    expect(await form.getByRole('combobox', { name: 'Kind' }).inputValue()).toBe('Video');
    expect(await form.getByLabel('Created after').inputValue()).toBe('2020-01-02T03:04');

    const reloaded = await nextListing('/admin/v1/tasks', () => page.reload());
    expect(reloaded.get('kind')).toBe('video');
    expect(await form.getByLabel('Account id').inputValue()).toBe(accountId);
  }, 60_000);

  it('webhook deliveries: a link with ?status= lists that state, and Apply keeps the filters in the URL', async () => {
    const linked = await nextListing('/admin/v1/webhook-deliveries', () => page.goto(`${server.directUrl}/console/webhooks?status=failed,gone`));
    expect(linked.get('status')).toBe('failed,gone');
    const form = page.getByRole('form', { name: 'Webhook filters' });
    await form.getByText('failed', { exact: true }).waitFor();
    await form.getByText('gone', { exact: true }).waitFor();

    await form.getByLabel('Account id').fill(accountId);
    const applied = await nextListing('/admin/v1/webhook-deliveries', () => form.getByRole('button', { name: 'Apply filters' }).click());
    expect(Object.fromEntries(applied)).toMatchObject({ status: 'failed,gone', account_id: accountId });
    expect(here()).toBe(`/console/webhooks?status=failed,gone&account_id=${accountId}`);

    const back = await nextListing('/admin/v1/webhook-deliveries', () => page.goBack());
    expect(back.get('account_id')).toBeNull();
    expect(back.get('status')).toBe('failed,gone');
  }, 60_000);

  it('ledger: Apply writes the filters into the URL; Back from an account lists the same entries', async () => {
    await open(`/ledger?account_id=${accountId}`, 'Ledger');
    const form = page.getByRole('form', { name: 'Ledger filters' });
    await form.getByLabel('Kind').click();
    await page.getByRole('option', { name: 'capture', exact: true }).click();
    await page.keyboard.press('Escape');
    const applied = await nextListing('/admin/v1/ledger', () => form.getByRole('button', { name: 'Apply filters' }).click());
    expect(Object.fromEntries(applied)).toMatchObject({ account_id: accountId, kind: 'capture' });
    expect(here()).toBe(`/console/ledger?account_id=${accountId}&kind=capture`);
    const entries = page.getByRole('table', { name: 'Ledger entries' }).getByRole('row');
    await entries.filter({ hasText: 'capture' }).first().waitFor();
    expect(await entries.filter({ hasText: 'grant' }).count()).toBe(0);

    await entries.filter({ hasText: 'capture' }).first().getByRole('link', { name: accountId }).click();
    await page.getByRole('heading', { level: 1, name: 'listed-account' }).waitFor();
    const back = await nextListing('/admin/v1/ledger', () => page.goBack());
    expect(back.get('kind')).toBe('capture');
    await form.getByText('capture', { exact: true }).waitFor();
  }, 60_000);

  it('left no page errors and sent nothing off the machine', () => {
    expect(pageErrors).toEqual([]);
    expect(outside).toEqual([]);
  });
});
