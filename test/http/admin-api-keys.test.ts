import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import createClient from 'openapi-fetch';
import type { paths } from '../../generated/api.d.ts';
import { createAccount, createGroup, createMember, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
let defaultGroupId: string;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

const direct = () => createClient<paths>({ baseUrl: server.directUrl, headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });

async function createKey(body: paths['/admin/v1/api-keys']['post']['requestBody']['content']['application/json']) {
  const { data, response, error } = await server.admin().POST('/admin/v1/api-keys', { body });
  expect(error).toBeUndefined();
  expect(response.status).toBe(201);
  return { key: data!, response };
}

describe('API keys', () => {
  it('without a `default` group, a key without group_id is 400 invalid_request naming group_id', async () => {
    const account = await createAccount(server.db);
    const { response, error } = await server.admin().POST('/admin/v1/api-keys', { body: { account_id: account.id, name: 'orphan' } });
    expect(response.status).toBe(400);
    expect(error?.error).toMatchObject({ code: 'invalid_request', param: 'group_id' });
    expect(await server.db.selectFrom('apiKeys').select('id').where('accountId', '=', account.id).execute()).toEqual([]);

    defaultGroupId = (await createGroup(server.db, { name: 'default' })).id;
    await createMember(server.db, defaultGroupId);
  });

  it('creates a key: the full key once, only its hash stored; it works on GET /v1/credits', async () => {
    const account = await createAccount(server.db, { balance: 12 });
    const { key, response } = await createKey({ account_id: account.id, name: 'production backend', credit_limit: 20 });
    expect(response.headers.get('cache-control')).toBe('no-store');
    expect(key).toEqual({
      id: expect.stringMatching(/^key_[0-9A-Za-z]+$/),
      account_id: account.id,
      group_id: defaultGroupId,
      name: 'production backend',
      key_prefix: key.key.slice(0, 8),
      last_four: key.key.slice(-4),
      is_active: true,
      credit_limit: 20,
      credits_used: 0,
      credits_remaining: 20,
      unlimited: false,
      requests_per_minute: 'default',
      max_in_flight: 'default',
      last_used_at: null,
      created_at: expect.any(String),
      key: expect.stringMatching(/^mg_[0-9A-Za-z]{33}$/),
    });
    const row = await server.db.selectFrom('apiKeys').selectAll().where('id', '=', key.id).executeTakeFirstOrThrow();
    expect(row.keyHash.equals(createHash('sha256').update(key.key).digest())).toBe(true);
    expect(row.creditLimit).toBe(20_000_000);
    expect(Object.values(row).map(String)).not.toContain(key.key);

    const credits = await server.client(key.key).GET('/v1/credits');
    expect(credits.response.status).toBe(200);
  });

  it('get and list never show the full key', async () => {
    const account = await createAccount(server.db);
    const { key } = await createKey({ account_id: account.id, name: 'secret', group_id: defaultGroupId });
    const { key: full, ...shown } = key;
    const got = await server.admin().GET('/admin/v1/api-keys/{key_id}', { params: { path: { key_id: key.id } } });
    expect(got.data).toEqual(shown);
    const listed = await server.admin().GET('/admin/v1/api-keys', { params: { query: { account_id: account.id } } });
    expect(listed.data).toEqual({ data: [shown], next_cursor: null });
    expect(JSON.stringify([got.data, listed.data])).not.toContain(full);
    expect(JSON.stringify([got.data, listed.data])).not.toContain('"key"');
  });

  it('creates an unlimited key when credit_limit is null or omitted', async () => {
    const account = await createAccount(server.db);
    const { key } = await createKey({ account_id: account.id, name: 'unlimited', credit_limit: null });
    expect(key).toMatchObject({ credit_limit: null, credits_remaining: null, unlimited: true });
  });

  it('answers 404 with param for an unknown account or group', async () => {
    const account = await createAccount(server.db);
    const noAccount = await server.admin().POST('/admin/v1/api-keys', { body: { account_id: 'acct_nope', name: 'x' } });
    expect(noAccount.response.status).toBe(404);
    expect(noAccount.error?.error).toMatchObject({ code: 'account_not_found', param: 'account_id' });
    const noGroup = await server.admin().POST('/admin/v1/api-keys', { body: { account_id: account.id, name: 'x', group_id: 'grp_nope' } });
    expect(noGroup.response.status).toBe(404);
    expect(noGroup.error?.error).toMatchObject({ code: 'group_not_found', param: 'group_id' });
  });

  it('answers 400 invalid_request for a credit_limit with more than 6 fractional digits', async () => {
    const account = await createAccount(server.db);
    const { response, error } = await direct().POST('/admin/v1/api-keys', { body: { account_id: account.id, name: 'x', credit_limit: 0.1234567 } });
    expect(response.status).toBe(400);
    expect(error?.error).toMatchObject({ code: 'invalid_request', param: 'credit_limit' });
  });

  it('deactivating a key makes it 403 api_key_inactive at once (auth cache invalidated)', async () => {
    const account = await createAccount(server.db);
    const { key } = await createKey({ account_id: account.id, name: 'to-deactivate' });
    expect((await server.client(key.key).GET('/v1/credits')).response.status).toBe(200); // cached now
    const updated = await server.admin().PATCH('/admin/v1/api-keys/{key_id}', { params: { path: { key_id: key.id } }, body: { is_active: false } });
    expect(updated.data?.is_active).toBe(false);
    const denied = await server.client(key.key).GET('/v1/credits');
    expect(denied.response.status).toBe(403);
    expect(denied.error?.error.code).toBe('api_key_inactive');
    await server.admin().PATCH('/admin/v1/api-keys/{key_id}', { params: { path: { key_id: key.id } }, body: { is_active: true } });
    expect((await server.client(key.key).GET('/v1/credits')).response.status).toBe(200);
  });

  it('updates name, quota and group', async () => {
    const account = await createAccount(server.db);
    const other = await createGroup(server.db);
    const { key } = await createKey({ account_id: account.id, name: 'before' });
    await server.db.updateTable('apiKeys').set({ creditsUsed: 7_500_000 }).where('id', '=', key.id).execute();
    const path = { key_id: key.id };

    const limited = await server.admin().PATCH('/admin/v1/api-keys/{key_id}', { params: { path }, body: { name: 'after', credit_limit: 5, group_id: other.id } });
    expect(limited.data).toMatchObject({ name: 'after', credit_limit: 5, credits_used: 7.5, credits_remaining: 0, unlimited: false, group_id: other.id });
    expect(await server.db.selectFrom('apiKeys').select(['name', 'creditLimit', 'groupId']).where('id', '=', key.id).executeTakeFirst()).toEqual({
      name: 'after',
      creditLimit: 5_000_000,
      groupId: other.id,
    });

    const unlimited = await server.admin().PATCH('/admin/v1/api-keys/{key_id}', { params: { path }, body: { credit_limit: null } });
    expect(unlimited.data).toMatchObject({ credit_limit: null, credits_remaining: null, unlimited: true });

    const badGroup = await server.admin().PATCH('/admin/v1/api-keys/{key_id}', { params: { path }, body: { group_id: 'grp_nope' } });
    expect(badGroup.response.status).toBe(404);
    expect(badGroup.error?.error).toMatchObject({ code: 'group_not_found', param: 'group_id' });
    const missing = await server.admin().PATCH('/admin/v1/api-keys/{key_id}', { params: { path: { key_id: 'key_nope' } }, body: { name: 'x' } });
    expect(missing.response.status).toBe(404);
    expect(missing.error?.error.code).toBe('api_key_not_found');
  });

  it('refuses to change the owning account (unknown member)', async () => {
    const account = await createAccount(server.db);
    const { key } = await createKey({ account_id: account.id, name: 'fixed' });
    const res = await fetch(`${server.directUrl}/admin/v1/api-keys/${key.id}`, {
      method: 'PATCH',
      headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ account_id: 'acct_other' }),
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('invalid_request');
  });

  it('walks every key of an account exactly once, newest first', async () => {
    const account = await createAccount(server.db);
    for (let i = 0; i < 5; i++) await createKey({ account_id: account.id, name: `k${i}` });
    const seen: string[] = [];
    let cursor: string | undefined;
    do {
      const { data } = await server.admin().GET('/admin/v1/api-keys', { params: { query: { account_id: account.id, limit: 2, ...(cursor ? { cursor } : {}) } } });
      seen.push(...data!.data.map((k) => k.id));
      cursor = data!.next_cursor ?? undefined;
    } while (cursor);
    const expected = await server.db.selectFrom('apiKeys').select('id').where('accountId', '=', account.id).orderBy('createdAt', 'desc').orderBy('id', 'desc').execute();
    expect(seen).toEqual(expected.map((r) => r.id));
    expect(seen).toHaveLength(5);

    const empty = await server.admin().GET('/admin/v1/api-keys', { params: { query: { account_id: 'acct_unknown' } } });
    expect(empty.data).toEqual({ data: [], next_cursor: null });
  });
});
