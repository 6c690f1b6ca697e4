/**
 * "One admin path, two doors": every body the admin CLI sends (accounts, keys, groups, members,
 * credit adjustments) is checked against the contract's request schema as the admin API's validator
 * checks it. A value the API refuses is refused by the CLI with the API's code and message (the
 * field named by its flag), exit code 2, and nothing is stored (the CLI once stored a priority of 5000 or a group named
 * 'Bad Name!', after which the API's own listings could not answer within their schema).
 */
import createClient from 'openapi-fetch';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { paths } from '../../generated/api.d.ts';
import { adminCli } from '../support/admin-cli.ts';
import { seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
let groupId: string;
let accountId: string;

const api = () => createClient<paths>({ baseUrl: server.directUrl, headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
const cli = (...args: string[]) => adminCli(args, { DATABASE_URL: server.config.databaseUrl!, MEDIAGATE_SECRET_KEY: server.secretKey.toString('hex') });

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
  const group = await api().POST('/admin/v1/groups', { body: { name: 'bodies' } });
  groupId = group.data!.id;
  const account = await api().POST('/admin/v1/accounts', { body: { name: 'bodies-acct' } });
  accountId = account.data!.id;
  const member = await cli('members', 'add', '--group', 'bodies', '--name', 'm1', '--provider', 'local', '--models', 'local-image-1');
  expect([member.code, member.stderr]).toEqual([0, '']);
});
afterAll(async () => server?.close());

/**
 * The line the CLI prints for an error the API answers with `error`: its code and message, the
 * field it names given as the flag that sets it (every field these cases refuse has the flag of its
 * name, `_` as `-`: `concurrency_limit` is `--concurrency-limit`).
 */
function lineOf(res: { error?: unknown; response: Response }): string {
  expect(res.response.status).toBe(400);
  const { code, param, message } = (res.error as { error: { code: string; param: string | null; message: string } }).error;
  const flag = param && `--${param.replaceAll('_', '-')}`;
  return `error: ${flag ? message.replace(`'${param}'`, flag) : message} (${code}${flag ? `, ${flag}` : ''})\n`;
}

describe('admin CLI bodies, checked as the admin API checks them', () => {
  it('refuses what the API refuses, with its error and exit code 2, and stores nothing', async () => {
    const long = 'x'.repeat(300);
    const members = `/admin/v1/groups/{group_id}/members` as const;
    const member = (body: Record<string, unknown>) => api().POST(members, { params: { path: { group_id: groupId } }, body: { name: 'm2', provider: 'local', models: ['local-image-1'], ...body } as never });
    const memberId = (await api().GET(members, { params: { path: { group_id: groupId } } })).data!.data[0]!.id;
    const update = (body: Record<string, unknown>) =>
      api().PATCH(`${members}/{member_id}`, { params: { path: { group_id: groupId, member_id: memberId } }, body: body as never });
    const add = ['members', 'add', '--group', 'bodies', '--name', 'm2', '--provider', 'local', '--models', 'local-image-1'];
    const cases: [string[], Promise<{ error?: unknown; response: Response }>][] = [
      [[...add, '--priority', '5000'], member({ priority: 5000 })],
      [[...add, '--weight', '50000'], member({ weight: 50000 })],
      [[...add, '--concurrency-limit', '50000'], member({ concurrency_limit: 50000 })],
      [[...add, '--weight', '0'], member({ weight: 0 })],
      [['members', 'add', '--group', 'bodies', '--name', long, '--provider', 'local', '--models', 'local-image-1'], member({ name: long })],
      [['members', 'add', '--group', 'bodies', '--name', 'm3', '--provider', 'openai', '--models', 'local-image-1', '--credential', 'api_key=x', '--base-url', 'https://exa mple.com'],
        member({ name: 'm3', provider: 'openai', credentials: { api_key: 'x' }, base_url: 'https://exa mple.com' })],
      [['members', 'update', 'm1', '--group', 'bodies', '--priority', '5000'], update({ priority: 5000 })],
      [['members', 'update', 'm1', '--group', 'bodies', '--concurrency-limit', '50000'], update({ concurrency_limit: 50000 })],
      [['groups', 'create', '--name', 'Bad Name!'], api().POST('/admin/v1/groups', { body: { name: 'Bad Name!' } })],
      [['groups', 'create', '--name', long], api().POST('/admin/v1/groups', { body: { name: long } })],
      [['groups', 'update', 'bodies', '--name', 'Bad Name!'], api().PATCH('/admin/v1/groups/{group_id}', { params: { path: { group_id: groupId } }, body: { name: 'Bad Name!' } })],
      [['accounts', 'create', '--name', long], api().POST('/admin/v1/accounts', { body: { name: long } })],
      [['accounts', 'update', 'bodies-acct', '--name', long], api().PATCH('/admin/v1/accounts/{account_id}', { params: { path: { account_id: accountId } }, body: { name: long } })],
      [['accounts', 'update', 'bodies-acct'], api().PATCH('/admin/v1/accounts/{account_id}', { params: { path: { account_id: accountId } }, body: {} })],
      [['accounts', 'credit', 'bodies-acct', '--amount', '1', '--reason', 'r'.repeat(501)],
        api().POST('/admin/v1/accounts/{account_id}/credits', { params: { path: { account_id: accountId } }, body: { amount: 1, reason: 'r'.repeat(501) } })],
      [['keys', 'create', '--account', 'bodies-acct', '--name', long], api().POST('/admin/v1/api-keys', { body: { account_id: accountId, name: long } })],
    ];
    for (const [args, answered] of cases) {
      const run = await cli(...args);
      expect({ args, ...run }).toEqual({ args, code: 2, stdout: '', stderr: lineOf(await answered) });
    }

    // Nothing of it was stored, and the API's listings answer (response validation on).
    const listed = await api().GET(members, { params: { path: { group_id: groupId } } });
    expect(listed.response.status).toBe(200);
    expect(listed.data!.data.map((m) => [m.name, m.priority, m.weight, m.concurrency_limit])).toEqual([['m1', 0, 1, null]]);
    const groups = await api().GET('/admin/v1/groups', { params: { query: { limit: 100 } } });
    expect(groups.response.status).toBe(200);
    expect(groups.data!.data.map((g) => g.name)).not.toContain('Bad Name!');
    const accounts = await api().GET('/admin/v1/accounts', { params: { query: { limit: 100 } } });
    expect(accounts.response.status).toBe(200);
    expect(accounts.data!.data.map((a) => a.name)).not.toContain(long);
  });

  it('still sends what the API takes, with the same defaults', async () => {
    const run = await cli('members', 'add', '--group', 'bodies', '--name', 'm4', '--provider', 'openai', '--models', 'local-image-1', '--credential', 'api_key=x', '--base-url', 'https://api.example.com/v1', '--priority', '1000', '--weight', '1000', '--concurrency-limit', '10000', '--json');
    expect([run.code, run.stderr]).toEqual([0, '']);
    expect(JSON.parse(run.stdout)).toMatchObject({ name: 'm4', priority: 1000, weight: 1000, concurrency_limit: 10000, enabled: true, base_url: 'https://api.example.com/v1' });
    const group = await cli('groups', 'update', 'bodies', '--description', 'none', '--json');
    expect([group.code, group.stderr]).toEqual([0, '']);
    const account = await cli('accounts', 'create', '--name', 'bodies-2', '--json');
    expect([account.code, account.stderr]).toEqual([0, '']);
    expect(JSON.parse(account.stdout)).toMatchObject({ name: 'bodies-2', status: 'active', requests_per_minute: 'default' });
  });
});
