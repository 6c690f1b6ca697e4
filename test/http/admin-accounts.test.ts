import createClient from 'openapi-fetch';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { paths } from '../../generated/api.d.ts';
import { createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';

let server: TestServer;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

const direct = (token = ADMIN_TOKEN) =>
  createClient<paths>({ baseUrl: server.directUrl, headers: { Authorization: `Bearer ${token}` } });

const ledgerOf = (accountId: string) =>
  server.db.selectFrom('ledgerEntries').select(['id', 'kind', 'amount', 'reason']).where('accountId', '=', accountId).orderBy('id').execute();
const accountRow = (id: string) =>
  server.db.selectFrom('accounts').select(['balance', 'totalEarned', totalSpentOf('accounts').as('totalSpent'), 'status', 'name']).where('id', '=', id).executeTakeFirstOrThrow();

async function newAccount(name: string, initialCredits?: number) {
  const { data, response } = await server.admin().POST('/admin/v1/accounts', { body: { name, ...(initialCredits === undefined ? {} : { initial_credits: initialCredits }) } });
  expect(response.status).toBe(201);
  return data!;
}

describe('admin API gate', () => {
  it('answers 404 not_found on every admin path while ADMIN_TOKEN is unset', async () => {
    const disabled = await startTestServer({ env: { ADMIN_TOKEN: '' } });
    try {
      const res = await fetch(`${disabled.directUrl}/admin/v1/accounts`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
      expect(res.status).toBe(404);
      expect(await res.json()).toEqual({ error: { message: 'Not found.', type: 'not_found_error', code: 'not_found', param: null } });
    } finally {
      await disabled.close();
    }
  });

  it('answers 401 invalid_admin_token for a wrong or missing token', async () => {
    const wrong = await direct('not-the-admin-token-at-all').GET('/admin/v1/accounts');
    expect(wrong.response.status).toBe(401);
    expect(wrong.error).toEqual({ error: { message: 'Missing or invalid admin token.', type: 'authentication_error', code: 'invalid_admin_token', param: null } });
    const missing = await fetch(`${server.directUrl}/admin/v1/accounts`);
    expect(missing.status).toBe(401);
    expect(((await missing.json()) as { error: { code: string } }).error.code).toBe('invalid_admin_token');
    // Paths match in any letter case, and so does the blame: not the client key's 401.
    const shouting = await fetch(`${server.directUrl}/ADMIN/v1/accounts`);
    expect(shouting.status).toBe(401);
    expect(((await shouting.json()) as { error: { code: string } }).error.code).toBe('invalid_admin_token');
    expect(shouting.headers.get('www-authenticate')).toBeNull();
  });
});

describe('accounts', () => {
  it('creates an account with initial credits recorded as a grant', async () => {
    const { data, response } = await server.admin().POST('/admin/v1/accounts', { body: { name: 'acme-studio', initial_credits: 100.5 } });
    expect(response.status).toBe(201);
    expect(data).toEqual({
      id: expect.stringMatching(/^acct_[0-9A-Za-z]+$/),
      name: 'acme-studio',
      status: 'active',
      balance: 100.5,
      total_earned: 100.5,
      total_spent: 0,
      output_retention_days: null,
      input_retention_days: null,
      requests_per_minute: 'default',
      max_in_flight: 'default',
      created_at: expect.any(String),
      updated_at: expect.any(String),
    });
    expect(await accountRow(data!.id)).toEqual({ balance: 100_500_000, totalEarned: 100_500_000, totalSpent: 0, status: 'active', name: 'acme-studio' });
    expect(await ledgerOf(data!.id)).toEqual([{ id: expect.any(Number), kind: 'grant', amount: 100_500_000, reason: 'initial credits' }]);
  });

  it('records nothing in the ledger without initial credits, and honours status', async () => {
    const { data } = await server.admin().POST('/admin/v1/accounts', { body: { name: 'no-credits', status: 'suspended' } });
    expect(data).toMatchObject({ status: 'suspended', balance: 0, total_earned: 0 });
    expect(await ledgerOf(data!.id)).toEqual([]);
  });

  it('answers 409 conflict for a taken name', async () => {
    await newAccount('taken-name');
    const { response, error } = await server.admin().POST('/admin/v1/accounts', { body: { name: 'taken-name' } });
    expect(response.status).toBe(409);
    expect(error?.error).toEqual({ message: "An account named 'taken-name' already exists.", type: 'conflict_error', code: 'conflict', param: 'name' });
  });

  it('answers 400 invalid_request for initial credits with more than 6 fractional digits', async () => {
    const { response, error } = await direct().POST('/admin/v1/accounts', { body: { name: 'too-precise', initial_credits: 1.0000001 } });
    expect(response.status).toBe(400);
    expect(error?.error).toMatchObject({ code: 'invalid_request', param: 'initial_credits' });
    expect(await server.db.selectFrom('accounts').select('id').where('name', '=', 'too-precise').execute()).toEqual([]);
  });

  it('gets an account, and 404 account_not_found for an unknown id', async () => {
    const account = await newAccount('get-me', 3);
    const { data } = await server.admin().GET('/admin/v1/accounts/{account_id}', { params: { path: { account_id: account.id } } });
    expect(data).toEqual(account);
    const missing = await server.admin().GET('/admin/v1/accounts/{account_id}', { params: { path: { account_id: 'acct_unknown' } } });
    expect(missing.response.status).toBe(404);
    expect(missing.error?.error).toMatchObject({ code: 'account_not_found', type: 'not_found_error' });
  });

  it('walks every account exactly once with cursor pagination, newest first', async () => {
    for (let i = 0; i < 7; i++) await newAccount(`page-${i}`);
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const { data, response } = await server.admin().GET('/admin/v1/accounts', { params: { query: { limit: 3, ...(cursor ? { cursor } : {}) } } });
      expect(response.status).toBe(200);
      expect(data!.data.length).toBeLessThanOrEqual(3);
      seen.push(...data!.data.map((a) => a.id));
      cursor = data!.next_cursor ?? undefined;
      pages++;
    } while (cursor && pages < 50);
    const expected = await server.db.selectFrom('accounts').select('id').orderBy('createdAt', 'desc').orderBy('id', 'desc').execute();
    expect(seen).toEqual(expected.map((r) => r.id));
    expect(new Set(seen).size).toBe(seen.length);
  });

  it('filters the list by status', async () => {
    const { data } = await server.admin().GET('/admin/v1/accounts', { params: { query: { status: 'suspended', limit: 200 } } });
    const expected = await server.db.selectFrom('accounts').select('id').where('status', '=', 'suspended').execute();
    expect(data!.data.map((a) => a.id).sort()).toEqual(expected.map((r) => r.id).sort());
    expect(data!.data.every((a) => a.status === 'suspended')).toBe(true);
  });

  it('answers 400 invalid_cursor for a cursor the server did not issue', async () => {
    for (const cursor of ['not-a-cursor', Buffer.from('{"c":"x","i":1}').toString('base64url')]) {
      const { response, error } = await server.admin().GET('/admin/v1/accounts', { params: { query: { cursor } } });
      expect(response.status).toBe(400);
      expect(error?.error).toMatchObject({ code: 'invalid_cursor', param: 'cursor' });
    }
  });

  it('renames an account and 409s on a taken name', async () => {
    const account = await newAccount('old-name');
    await newAccount('other-name');
    const renamed = await server.admin().PATCH('/admin/v1/accounts/{account_id}', { params: { path: { account_id: account.id } }, body: { name: 'new-name' } });
    expect(renamed.data).toMatchObject({ id: account.id, name: 'new-name' });
    expect((await accountRow(account.id)).name).toBe('new-name');
    const clash = await server.admin().PATCH('/admin/v1/accounts/{account_id}', { params: { path: { account_id: account.id } }, body: { name: 'other-name' } });
    expect(clash.response.status).toBe(409);
    const missing = await server.admin().PATCH('/admin/v1/accounts/{account_id}', { params: { path: { account_id: 'acct_nope' } }, body: { status: 'active' } });
    expect(missing.response.status).toBe(404);
    expect(missing.error?.error.code).toBe('account_not_found');
  });

  it('suspending an account makes its keys 403 account_suspended at once; reactivating restores them', async () => {
    const account = await newAccount('suspend-me', 10);
    const group = await createGroup(server.db);
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    expect((await server.client(key.key).GET('/v1/credits')).response.status).toBe(200); // now cached

    const suspended = await server.admin().PATCH('/admin/v1/accounts/{account_id}', { params: { path: { account_id: account.id } }, body: { status: 'suspended' } });
    expect(suspended.data?.status).toBe('suspended');
    const denied = await server.client(key.key).GET('/v1/credits');
    expect(denied.response.status).toBe(403);
    expect(denied.error?.error.code).toBe('account_suspended');

    await server.admin().PATCH('/admin/v1/accounts/{account_id}', { params: { path: { account_id: account.id } }, body: { status: 'active' } });
    expect((await server.client(key.key).GET('/v1/credits')).response.status).toBe(200);
  });
});

describe('credit adjustments', () => {
  it('a grant and a debit write ledger entries and move balance, total_earned and total_spent', async () => {
    const account = await newAccount('adjust-me', 10);
    const path = { account_id: account.id };

    const grant = await server.admin().POST('/admin/v1/accounts/{account_id}/credits', { params: { path }, body: { amount: 50.25, reason: 'Top-up, invoice 42' } });
    expect(grant.response.status).toBe(200);
    expect(grant.data).toEqual({
      account: { ...account, balance: 60.25, total_earned: 60.25, total_spent: 0, updated_at: expect.any(String) },
      entry: {
        id: expect.stringMatching(/^led_\d+$/),
        kind: 'grant',
        amount: 50.25,
        balance_change: 50.25,
        account_id: account.id,
        api_key_id: null,
        task_id: null,
        hold_id: null,
        reason: 'Top-up, invoice 42',
        created_at: expect.any(String),
      },
      replayed: false,
    });

    const debit = await server.admin().POST('/admin/v1/accounts/{account_id}/credits', { params: { path }, body: { amount: -0.000001, reason: 'rounding' } });
    expect(debit.response.status).toBe(200);
    expect(debit.data?.account).toMatchObject({ balance: 60.249999, total_earned: 60.25, total_spent: 0.000001 });
    expect(debit.data?.entry).toMatchObject({ kind: 'debit', amount: -0.000001, balance_change: -0.000001, reason: 'rounding' });

    expect(await accountRow(account.id)).toMatchObject({ balance: 60_249_999, totalEarned: 60_250_000, totalSpent: 1 });
    const ledger = await ledgerOf(account.id);
    expect(ledger.map(({ kind, amount, reason }) => ({ kind, amount, reason }))).toEqual([
      { kind: 'grant', amount: 10_000_000, reason: 'initial credits' },
      { kind: 'grant', amount: 50_250_000, reason: 'Top-up, invoice 42' },
      { kind: 'debit', amount: 1, reason: 'rounding' },
    ]);
    expect(debit.data?.entry.id).toBe(`led_${ledger[2]!.id}`);
  });

  it('a debit beyond the balance is 402 insufficient_balance and changes nothing', async () => {
    const account = await newAccount('poor', 5);
    const before = { row: await accountRow(account.id), ledger: await ledgerOf(account.id) };
    const { response, error } = await server.admin().POST('/admin/v1/accounts/{account_id}/credits', {
      params: { path: { account_id: account.id } },
      body: { amount: -5.000001, reason: 'too much' },
    });
    expect(response.status).toBe(402);
    expect(error?.error).toEqual({
      message: 'The debit is larger than the available balance of the account.',
      type: 'insufficient_credits',
      code: 'insufficient_balance',
      param: null,
    });
    expect({ row: await accountRow(account.id), ledger: await ledgerOf(account.id) }).toEqual(before);
  });

  it('a debit of exactly the balance leaves zero', async () => {
    const account = await newAccount('exact', 5);
    const { data } = await server.admin().POST('/admin/v1/accounts/{account_id}/credits', { params: { path: { account_id: account.id } }, body: { amount: -5, reason: 'all' } });
    expect(data?.account).toMatchObject({ balance: 0, total_spent: 5 });
  });

  it('concurrent debits never overdraw', async () => {
    const account = await newAccount('race', 10);
    const results = await Promise.all(
      Array.from({ length: 8 }, () =>
        server.admin().POST('/admin/v1/accounts/{account_id}/credits', { params: { path: { account_id: account.id } }, body: { amount: -3, reason: 'race' } }),
      ),
    );
    expect(results.filter((r) => r.response.status === 200)).toHaveLength(3);
    expect(results.filter((r) => r.response.status === 402)).toHaveLength(5);
    expect(await accountRow(account.id)).toMatchObject({ balance: 1_000_000, totalSpent: 9_000_000 });
  });

  it('answers 404 account_not_found for an unknown account and 400 for a zero or too precise amount', async () => {
    const missing = await server.admin().POST('/admin/v1/accounts/{account_id}/credits', { params: { path: { account_id: 'acct_nope' } }, body: { amount: -1, reason: 'x' } });
    expect(missing.response.status).toBe(404);
    expect(missing.error?.error.code).toBe('account_not_found');
    const account = await newAccount('precise', 1);
    for (const amount of [0, 1.0000001]) {
      const { response, error } = await direct().POST('/admin/v1/accounts/{account_id}/credits', { params: { path: { account_id: account.id } }, body: { amount, reason: 'x' } });
      expect(response.status).toBe(400);
      expect(error?.error).toMatchObject({ code: 'invalid_request', param: 'amount' });
    }
    expect(await ledgerOf(account.id)).toHaveLength(1);
  });
});
