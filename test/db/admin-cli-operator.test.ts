/**
 * The admin CLI's operator views (issue 32): `tasks list|show`, `ledger list`, `webhooks list` and
 * `usage` print what the admin API answers (the same services), and refuse bad filters as usage
 * errors before touching anything.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';
import { adminCli, type CliRun } from '../support/admin-cli.ts';

let server: TestServer;

/** `npm run admin -- …` on the server's database, in this process (test/support/admin-cli.ts); PUBLIC_BASE_URL: the server's base (its listen address), on which output URLs are signed. */
function admin(...args: string[]): Promise<CliRun> {
  return adminCli(args, { DATABASE_URL: server.config.databaseUrl!, MEDIAGATE_SECRET_KEY: server.secretKey.toString('hex'), PUBLIC_BASE_URL: server.directUrl });
}

async function api(path: string, accept = 'application/json') {
  const res = await fetch(`${server.directUrl}${path}`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, Accept: accept } });
  expect(res.status).toBe(200);
  return accept === 'text/csv' ? res.text() : res.json();
}

let c: Awaited<ReturnType<typeof createCustomer>>;
let image: string;
let video: string;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
  c = await createCustomer(server.db, { balance: 10 });
  const post = async (path: string, body: object) => {
    const res = await fetch(`${server.directUrl}${path}`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    return { body: (await res.json()) as { id?: string }, taskId: res.headers.get('x-task-id') };
  };
  image = (await post('/v1/images/generations', { model: 'local-image-1', prompt: 'x', response_format: 'url' })).taskId!;
  video = (await post('/v1/videos/generations', { client_request_id: 'cli-1', prompt: 'x', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' })).body.id!;
});
afterAll(async () => server?.close());

describe('admin CLI: operator views', { timeout: 120_000 }, () => {
  it('tasks list and tasks show print what the admin API answers', async () => {
    const [listed, shown] = await Promise.all([admin('tasks', 'list', '--account', c.accountId, '--status', 'queued,completed', '--json'), admin('tasks', 'show', image, '--json')]);
    expect([listed.code, listed.stderr]).toEqual([0, '']);
    expect(JSON.parse(listed.stdout)).toEqual(await api(`/admin/v1/tasks?account_id=${c.accountId}&status=queued,completed`));
    expect(JSON.parse(listed.stdout).data.map((t: { id: string }) => t.id)).toEqual([video, image]);
    // An output URL's expiry is the second it was signed plus the TTL: compared without it.
    const unsigned = (value: unknown) => {
      const task = value as { outputs: { url: string }[] };
      return { ...task, outputs: task.outputs.map((o) => ({ ...o, url: o.url.replace(/\?.*$/, '') })) };
    };
    expect(unsigned(JSON.parse(shown.stdout))).toEqual(unsigned(await api(`/admin/v1/tasks/${image}`)));
    expect(JSON.parse(shown.stdout).outputs).toHaveLength(1);
    const text = await admin('tasks', 'show', video);
    expect(text.stdout).toMatch(/quote:\n[\s\S]*per_second[\s\S]*hold:\n[\s\S]*held[\s\S]*upstream attempts:\n\(none\)/);
  });

  it('ledger list, webhooks list and usage (JSON and CSV)', async () => {
    const from = new Date(Date.now() - 3_600_000).toISOString();
    const to = new Date(Date.now() + 3_600_000).toISOString();
    const [ledger, hooks, usage, csv] = await Promise.all([
      admin('ledger', 'list', '--account', c.accountId, '--kind', 'hold,capture', '--json'),
      admin('webhooks', 'list', '--status', 'failed', '--json'),
      admin('usage', '--from', from, '--to', to, '--account', c.accountId, '--group-by', 'model', '--json'),
      admin('usage', 'report', '--from', from, '--to', to, '--account', c.accountId, '--group-by', 'model', '--csv'),
    ]);
    expect(JSON.parse(ledger.stdout)).toEqual(await api(`/admin/v1/ledger?account_id=${c.accountId}&kind=hold,capture`));
    expect(JSON.parse(ledger.stdout).data.map((e: { kind: string }) => e.kind)).toEqual(['hold', 'capture', 'hold']);
    expect(JSON.parse(hooks.stdout)).toEqual({ data: [], next_cursor: null });
    const q = `from=${encodeURIComponent(from)}&to=${encodeURIComponent(to)}&account_id=${c.accountId}&group_by=model`;
    expect(JSON.parse(usage.stdout)).toEqual(await api(`/admin/v1/usage?${q}`));
    expect(`${csv.stdout}`).toBe(await api(`/admin/v1/usage?${q}`, 'text/csv'));
  });

  it('refuses bad filters as usage errors (exit 2)', async () => {
    const runs = await Promise.all([
      admin('tasks', 'list', '--status', 'done'),
      admin('ledger', 'list', '--after', 'yesterday'),
      admin('usage', '--to', '2026-01-01T00:00:00Z'),
    ]);
    expect(runs.map((r) => r.code)).toEqual([2, 2, 2]);
    expect(runs[0]!.stderr).toContain("--status takes processing, needs_attention, queued, in_progress, completed, failed (comma-separated), not 'done'");
    expect(runs[1]!.stderr).toContain('--after takes an RFC 3339 time');
    expect(runs[2]!.stderr).toContain('from');
  });
});
