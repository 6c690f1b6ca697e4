import createClient from 'openapi-fetch';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { paths } from '../../generated/api.d.ts';
import { decryptSecret } from '../../server/lib/secret-box.ts';
import { createGroup, createMember, imageTaskToHold, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

const direct = () => createClient<paths>({ baseUrl: server.directUrl, headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
const SECRET = 'sk-proj-THIS-MUST-NEVER-LEAK-0123456789';

async function newGroup(name: string, description?: string | null) {
  const { data, response } = await server.admin().POST('/admin/v1/groups', { body: { name, ...(description === undefined ? {} : { description }) } });
  expect(response.status).toBe(201);
  return data!;
}

const memberRow = (id: string) => server.db.selectFrom('groupMembers').selectAll().where('id', '=', id).executeTakeFirstOrThrow();

describe('backend groups', () => {
  it('creates a group, and 409 conflict for a taken name', async () => {
    const group = await newGroup('premium', 'Dedicated accounts.');
    expect(group).toEqual({
      id: expect.stringMatching(/^grp_[0-9A-Za-z]+$/),
      name: 'premium',
      description: 'Dedicated accounts.',
      member_count: 0,
      created_at: expect.any(String),
      updated_at: expect.any(String),
    });
    const { response, error } = await server.admin().POST('/admin/v1/groups', { body: { name: 'premium' } });
    expect(response.status).toBe(409);
    expect(error?.error).toMatchObject({ code: 'conflict', param: 'name' });
  });

  it('rejects a name outside ^[a-z0-9][a-z0-9_-]*$', async () => {
    const { response, error } = await direct().POST('/admin/v1/groups', { body: { name: 'Not Valid' } });
    expect(response.status).toBe(400);
    expect(error?.error).toMatchObject({ code: 'invalid_request', param: 'name' });
  });

  it('gets a group with its member count, and 404 group_not_found for an unknown id', async () => {
    const group = await newGroup('counted');
    await createMember(server.db, group.id);
    await createMember(server.db, group.id, { enabled: false });
    const { data } = await server.admin().GET('/admin/v1/groups/{group_id}', { params: { path: { group_id: group.id } } });
    expect(data).toEqual({ ...group, member_count: 2 });
    const missing = await server.admin().GET('/admin/v1/groups/{group_id}', { params: { path: { group_id: 'grp_nope' } } });
    expect(missing.response.status).toBe(404);
    expect(missing.error?.error.code).toBe('group_not_found');
  });

  it('renames a group and clears its description; 409 on a taken name', async () => {
    const group = await newGroup('rename-me', 'text');
    await newGroup('taken');
    const { data } = await server.admin().PATCH('/admin/v1/groups/{group_id}', { params: { path: { group_id: group.id } }, body: { name: 'renamed', description: null } });
    expect(data).toMatchObject({ id: group.id, name: 'renamed', description: null });
    expect(await server.db.selectFrom('backendGroups').select(['name', 'description']).where('id', '=', group.id).executeTakeFirst()).toEqual({
      name: 'renamed',
      description: null,
    });
    const clash = await server.admin().PATCH('/admin/v1/groups/{group_id}', { params: { path: { group_id: group.id } }, body: { name: 'taken' } });
    expect(clash.response.status).toBe(409);
  });

  it('answers 404 group_not_found for an unknown group even when the new name is taken', async () => {
    await newGroup('held-name');
    const { response, error } = await server.admin().PATCH('/admin/v1/groups/{group_id}', { params: { path: { group_id: 'grp_doesnotexist' } }, body: { name: 'held-name' } });
    expect(response.status).toBe(404);
    expect(error?.error.code).toBe('group_not_found');
  });

  it('walks every group exactly once in name order', async () => {
    for (const name of ['walk-c', 'walk-a', 'walk-e', 'walk-b', 'walk-d']) await createGroup(server.db, { name });
    const seen: string[] = [];
    let cursor: string | undefined;
    do {
      const { data } = await server.admin().GET('/admin/v1/groups', { params: { query: { limit: 2, ...(cursor ? { cursor } : {}) } } });
      seen.push(...data!.data.map((g) => g.name));
      cursor = data!.next_cursor ?? undefined;
    } while (cursor);
    const expected = await server.db.selectFrom('backendGroups').select('name').orderBy('name').execute();
    expect(seen).toEqual(expected.map((r) => r.name));
    const bad = await server.admin().GET('/admin/v1/groups', { params: { query: { cursor: 'garbage' } } });
    expect(bad.error?.error.code).toBe('invalid_cursor');
  });
});

describe('group members', () => {
  it('stores credentials encrypted and never returns them', async () => {
    const group = await newGroup('with-openai');
    const { data, response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'openai-main', provider: 'openai', credentials: { api_key: SECRET }, models: ['local-image-1'], priority: 10, concurrency_limit: 8 },
    });
    expect(response.status).toBe(201);
    expect(data).toEqual({
      id: expect.stringMatching(/^mem_[0-9A-Za-z]+$/),
      group_id: group.id,
      name: 'openai-main',
      provider: 'openai',
      base_url: null,
      enabled: true,
      models: ['local-image-1'],
      model_map: {},
      priority: 10,
      weight: 1,
      concurrency_limit: 8,
      has_credentials: true,
      health: {
        in_flight: 0,
        cooldown_until: null,
        cooldown_reason: null,
        circuit: 'closed',
        credentials_rejected: false,
        account_disabled: null,
        model_faults: [],
        last_error: null,
        last_error_at: null,
        last_success_at: null,
        recent: { since: null, successes: 0, failures: 0 },
      },
      created_at: expect.any(String),
      updated_at: expect.any(String),
    });
    const row = await memberRow(data!.id);
    expect(row.credentialsCiphertext).toBeInstanceOf(Buffer);
    expect(row.credentialsCiphertext!.toString('utf8')).not.toContain(SECRET);
    expect(JSON.parse(decryptSecret(server.secretKey, row.credentialsCiphertext!))).toEqual({ api_key: SECRET });

    const listed = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: group.id } } });
    expect(listed.data).toEqual({ data: [data] });
    expect(JSON.stringify([data, listed.data])).not.toContain(SECRET);
    expect(server.logs.join('\n')).not.toContain(SECRET);
  });

  it('rotates credentials on update, still without returning them', async () => {
    const group = await newGroup('rotate');
    const created = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'kling', provider: 'kling', credentials: { access_key: 'ak-1', secret_key: 'sk-1' }, models: ['local-video-1'] },
    });
    const path = { group_id: group.id, member_id: created.data!.id };
    const { data } = await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', {
      params: { path },
      body: { credentials: { access_key: 'ak-2', secret_key: SECRET }, concurrency_limit: 16, enabled: false, base_url: 'https://api.example.com' },
    });
    expect(data).toMatchObject({ has_credentials: true, concurrency_limit: 16, enabled: false, base_url: 'https://api.example.com', provider: 'kling' });
    expect(JSON.stringify(data)).not.toContain(SECRET);
    const row = await memberRow(created.data!.id);
    expect(JSON.parse(decryptSecret(server.secretKey, row.credentialsCiphertext!))).toEqual({ access_key: 'ak-2', secret_key: SECRET });
  });

  it('requires credentials for every provider but local', async () => {
    const group = await newGroup('no-creds');
    const { response, error } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'gemini', provider: 'gemini', models: ['local-image-1'] },
    });
    expect(response.status).toBe(400);
    expect(error?.error).toMatchObject({ code: 'invalid_request', param: 'credentials' });
    const local = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'local', provider: 'local', models: ['local-image-1', 'local-video-1'] },
    });
    expect(local.data).toMatchObject({ provider: 'local', has_credentials: false, base_url: null, weight: 1, priority: 0, enabled: true });
  });

  it('rejects a base_url that is not http(s), and any base_url or credentials for local', async () => {
    const group = await newGroup('bad-urls');
    const cases = [
      { body: { name: 'ftp', provider: 'openai' as const, credentials: { api_key: 'k' }, base_url: 'ftp://example.com', models: ['local-image-1'] }, param: 'base_url' },
      { body: { name: 'local-url', provider: 'local' as const, base_url: 'https://example.com', models: ['local-image-1'] }, param: 'base_url' },
      { body: { name: 'local-creds', provider: 'local' as const, credentials: { api_key: 'k' }, models: ['local-image-1'] }, param: 'credentials' },
    ];
    for (const { body, param } of cases) {
      const { response, error } = await server.admin().POST('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: group.id } }, body });
      expect(response.status).toBe(400);
      expect(error?.error).toMatchObject({ code: 'invalid_request', param });
    }
    expect(await server.db.selectFrom('groupMembers').select('id').where('groupId', '=', group.id).execute()).toEqual([]);
  });

  it('answers 404 model_not_found naming models for an unknown model', async () => {
    const group = await newGroup('bad-models');
    const { response, error } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'local', provider: 'local', models: ['local-image-1', 'no-such-model'] },
    });
    expect(response.status).toBe(404);
    expect(error?.error).toMatchObject({ code: 'model_not_found', param: 'models' });
    expect(await server.db.selectFrom('groupMembers').select('id').where('groupId', '=', group.id).execute()).toEqual([]);
  });

  it("refuses a model of a kind the member's provider does not run (a video-only provider and an image model), on create and on update", async () => {
    const group = await newGroup('kinds');
    const created = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'mm', provider: 'minimax', credentials: { api_key: 'mm-key' }, models: ['local-video-1', 'local-image-1'] },
    });
    expect(created.response.status).toBe(400);
    expect(created.error?.error).toMatchObject({ code: 'invalid_request', param: 'models', message: "Provider 'minimax' runs video models only; 'local-image-1' is an image model." });
    expect(await server.db.selectFrom('groupMembers').select('id').where('groupId', '=', group.id).execute()).toEqual([]);

    const ok = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'mm', provider: 'minimax', credentials: { api_key: 'mm-key' }, models: ['local-video-1'] },
    });
    expect(ok.response.status).toBe(201);
    const updated = await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', {
      params: { path: { group_id: group.id, member_id: ok.data!.id } },
      body: { models: ['local-video-1', 'local-image-pro'] },
    });
    expect([updated.response.status, updated.error?.error.param]).toEqual([400, 'models']);
    expect((await memberRow(ok.data!.id)).models).toEqual(['local-video-1']);
  });

  it('answers 409 for a taken member name, 404 for an unknown group or a member of another group', async () => {
    const group = await newGroup('members-errors');
    const other = await newGroup('members-other');
    const member = await createMember(server.db, group.id, { name: 'dup' });
    const foreign = await createMember(server.db, other.id);
    const dup = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'dup', provider: 'local', models: ['local-image-1'] },
    });
    expect(dup.response.status).toBe(409);
    const noGroup = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: 'grp_nope' } } });
    expect(noGroup.error?.error.code).toBe('group_not_found');
    const wrongGroup = await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', {
      params: { path: { group_id: group.id, member_id: foreign.id } },
      body: { enabled: false },
    });
    expect(wrongGroup.response.status).toBe(404);
    expect(wrongGroup.error?.error.code).toBe('member_not_found');
    expect((await memberRow(foreign.id)).enabled).toBe(true);
    const badModels = await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', {
      params: { path: { group_id: group.id, member_id: member.id } },
      body: { models: ['nope'] },
    });
    expect(badModels.error?.error).toMatchObject({ code: 'model_not_found', param: 'models' });
  });

  it('refuses to change the provider', async () => {
    const group = await newGroup('fixed-provider');
    const member = await createMember(server.db, group.id);
    const res = await fetch(`${server.directUrl}/admin/v1/groups/${group.id}/members/${member.id}`, {
      method: 'PATCH',
      headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ provider: 'openai' }),
    });
    expect(res.status).toBe(400);
    expect((await memberRow(member.id)).provider).toBe('local');
  });

  it('lists members by descending priority, then name', async () => {
    const group = await newGroup('ordering');
    for (const [name, priority] of [['b', 1], ['a', 1], ['z', 5], ['c', 0]] as const) {
      await server.admin().POST('/admin/v1/groups/{group_id}/members', {
        params: { path: { group_id: group.id } },
        body: { name, provider: 'local', models: ['local-image-1'], priority },
      });
    }
    const { data } = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: group.id } } });
    expect(data!.data.map((m) => m.name)).toEqual(['z', 'a', 'b', 'c']);
  });
});

describe('deleting a member', () => {
  const del = (group_id: string, member_id: string) => server.admin().DELETE('/admin/v1/groups/{group_id}/members/{member_id}', { params: { path: { group_id, member_id } } });

  it('removes a disabled one with its health, from the listing and from routing; an enabled one is 409; again, or in another group, is 404', async () => {
    const group = await newGroup('retiring');
    const other = await newGroup('retiring-other');
    const created = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'typo', provider: 'openai', credentials: { api_key: SECRET }, models: ['local-image-1'] },
    });
    const id = created.data!.id;
    await server.db.insertInto('memberHealth').values({ memberId: id, lastError: 'boom', lastErrorAt: new Date() }).execute();
    // Enabled, it may take new work at any moment: disabled first.
    const enabled = await del(group.id, id);
    expect([enabled.response.status, enabled.error?.error.code]).toEqual([409, 'member_in_use']);
    expect(enabled.error?.error.message).toContain('set enabled: false first');
    await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', { params: { path: { group_id: group.id, member_id: id } }, body: { enabled: false } });
    // Its group is not the one named: nothing happens.
    const wrongGroup = await del(other.id, id);
    expect([wrongGroup.response.status, wrongGroup.error?.error.code]).toEqual([404, 'member_not_found']);
    const unknownGroup = await del('grp_0000000000000000000000000', id);
    expect([unknownGroup.response.status, unknownGroup.error?.error.code]).toEqual([404, 'group_not_found']);

    expect(await server.ctx.pool.account(id)).toMatchObject({ memberId: id });
    const res = await del(group.id, id);
    expect(res.response.status).toBe(204);
    expect(await server.db.selectFrom('groupMembers').select('id').where('id', '=', id).executeTakeFirst()).toBeUndefined();
    expect(await server.db.selectFrom('memberHealth').select('memberId').where('memberId', '=', id).executeTakeFirst()).toBeUndefined();
    const listed = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: group.id } } });
    expect(listed.data).toEqual({ data: [] });
    // The instance forgot its cached credentials at once (the admin change drops the caches).
    expect(await server.ctx.pool.account(id)).toBeUndefined();
    const again = await del(group.id, id);
    expect([again.response.status, again.error?.error.code]).toEqual([404, 'member_not_found']);
  });

  it('409 member_in_use while a task that has not finished runs on it; deleted once it has finished', async () => {
    const group = await newGroup('busy');
    const created = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'busy-one', provider: 'openai', credentials: { api_key: SECRET }, models: ['local-image-1'], enabled: false },
    });
    const id = created.data!.id;
    const task = await imageTaskToHold(server.db);
    await server.db.insertInto('imageTasks').values({ ...task.row, memberId: id }).execute();

    const refused = await del(group.id, id);
    expect([refused.response.status, refused.error?.error.code]).toEqual([409, 'member_in_use']);
    expect(refused.error?.error.message).toContain('1 task that has not finished runs');
    expect(refused.error?.error.message).toContain('enabled: false');
    expect(await server.db.selectFrom('groupMembers').select('id').where('id', '=', id).executeTakeFirst()).toBeDefined();

    await server.db.updateTable('imageTasks').set({ status: 'needs_attention' }).where('id', '=', task.taskId).execute();
    expect((await del(group.id, id)).response.status).toBe(409);

    await server.db.updateTable('imageTasks').set({ status: 'failed', errorMessage: 'x', completedAt: new Date() }).where('id', '=', task.taskId).execute();
    expect((await del(group.id, id)).response.status).toBe(204);
    // The task keeps the member's id as history.
    expect((await server.db.selectFrom('imageTasks').select('memberId').where('id', '=', task.taskId).executeTakeFirstOrThrow()).memberId).toBe(id);
  });
});

describe('member model maps', () => {
  it('maps catalog models to upstream ids, refuses keys the member does not serve, and drops mappings of models removed from the list', async () => {
    const group = await newGroup('mapped');
    const created = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'mapped', provider: 'openai', credentials: { api_key: SECRET }, models: ['local-image-1', 'local-video-1'], model_map: { 'local-image-1': 'gpt-image-1.5' } },
    });
    expect(created.response.status).toBe(201);
    expect(created.data!.model_map).toEqual({ 'local-image-1': 'gpt-image-1.5' });
    expect((await memberRow(created.data!.id)).modelMap).toEqual({ 'local-image-1': 'gpt-image-1.5' });

    const stray = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'stray', provider: 'openai', credentials: { api_key: SECRET }, models: ['local-image-1'], model_map: { 'local-video-1': 'sora-2' } },
    });
    expect(stray.response.status).toBe(400);
    expect(stray.error).toMatchObject({ error: { code: 'invalid_request', param: 'model_map' } });

    const patch = (body: Record<string, unknown>) =>
      server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', { params: { path: { group_id: group.id, member_id: created.data!.id } }, body });
    expect((await patch({ model_map: { 'local-video-1': 'sora-2-pro' } })).data!.model_map).toEqual({ 'local-video-1': 'sora-2-pro' });
    expect((await patch({ models: ['local-image-1'] })).data!.model_map).toEqual({});
    const bad = await patch({ model_map: { 'local-video-1': 'x' } });
    expect(bad.response.status).toBe(400);
    expect(bad.error).toMatchObject({ error: { param: 'model_map' } });
  });
});
