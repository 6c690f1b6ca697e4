/**
 * What an upstream's account-level answers do to a member (issue 28's kinds, the pool's side):
 * an account the upstream disabled for billing (Kling's arrears or exhausted resource pack, Ark's
 * overdue account) is out until an admin updates it; an account that has not activated a model
 * (Ark's `ModelNotOpen`) is out for that model only, with no expiry. Both fail over to the next
 * member, billed once, and both show in member health.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LocalImageProvider } from '../../server/providers/local/local-image.provider.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { ImageProvider } from '../../server/providers/types.ts';
import { createAccount, createApiKey, createGroup, createMember, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
/** Per member id: what the upstream answers it (absent: it renders). */
const answers = new Map<string, (model: string) => ProviderError | undefined>();
const calls: { memberId: string; model: string }[] = [];

/** The local image provider, answering some members as an upstream with account trouble would. */
function accountAwareProvider(): ImageProvider {
  const local = new LocalImageProvider();
  return {
    async generate(account, job, signal, events) {
      calls.push({ memberId: account.memberId, model: job.model });
      const refusal = answers.get(account.memberId)?.(job.model);
      if (refusal) throw refusal;
      return local.generate(account, job, signal, events);
    },
  };
}

beforeAll(async () => {
  server = await startTestServer({ overrides: { providers: { local: { image: accountAwareProvider() } } } });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

async function customer() {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const top = await createMember(server.db, group.id, { name: 'top' });
  await server.db.updateTable('groupMembers').set({ priority: 10 }).where('id', '=', top.id).execute();
  const spare = await createMember(server.db, group.id, { name: 'spare' });
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, groupId: group.id, top: top.id, spare: spare.id, key: key.key };
}

async function generate(key: string, model = 'local-image-1') {
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, prompt: 'a lighthouse' }),
  });
  // The whole answer: its status and head arrive while the task settles, its last byte after the commit.
  await res.arrayBuffer();
  return { status: res.status, taskId: res.headers.get('x-task-id')! };
}

async function healthOf(groupId: string, memberId: string) {
  const members = (await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } } })).data!.data;
  return members.find((m) => m.id === memberId)!.health;
}

const ledgerKinds = async (taskId: string) => (await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', taskId).orderBy('id').execute()).map((e) => e.kind);

describe('account-level answers of an upstream', () => {
  it('takes a member whose account the upstream disabled out of rotation until an admin updates it', async () => {
    const c = await customer();
    answers.set(c.top, () => new ProviderError('account_disabled', 'the resource pack of the account is used up', { upstreamCode: '1102' }));
    const first = await generate(c.key);
    expect(first.status).toBe(200);
    expect(await ledgerKinds(first.taskId)).toEqual(['hold', 'capture']);
    expect((await healthOf(c.groupId, c.top)).account_disabled).toEqual({ reason: 'the resource pack of the account is used up', since: expect.any(String) });
    expect(server.logs.some((l) => l.includes('"level":50') && l.includes('upstream account cannot take work'))).toBe(true);

    const before = calls.length;
    for (let i = 0; i < 3; i++) expect((await generate(c.key)).status).toBe(200);
    expect(calls.slice(before).map((x) => x.memberId)).toEqual([c.spare, c.spare, c.spare]);

    // The operator tops the account up and touches the member: it serves again.
    answers.delete(c.top);
    const patched = await server.admin().PATCH('/admin/v1/groups/{group_id}/members/{member_id}', { params: { path: { group_id: c.groupId, member_id: c.top } }, body: { enabled: true } });
    expect(patched.data!.health.account_disabled).toBeNull();
    const after = calls.length;
    expect((await generate(c.key)).status).toBe(200);
    expect(calls.slice(after).map((x) => x.memberId)).toEqual([c.top]);
  });

  it('leaves a member whose account has not activated a model out for that model only, until an admin updates it', async () => {
    const c = await customer();
    answers.set(c.top, (model) => (model === 'local-image-1' ? new ProviderError('model_not_open', 'Your account has not activated the model.', { upstreamStatus: 404, upstreamCode: 'ModelNotOpen' }) : undefined));
    expect((await generate(c.key, 'local-image-1')).status).toBe(200);
    const faults = (await healthOf(c.groupId, c.top)).model_faults;
    expect(faults).toEqual([{ model: 'local-image-1', kind: 'model_not_open', reason: 'HTTP 404 ModelNotOpen: Your account has not activated the model.', since: expect.any(String), until: null }]);

    const before = calls.length;
    expect((await generate(c.key, 'local-image-1')).status).toBe(200);
    expect((await generate(c.key, 'local-image-pro')).status).toBe(200);
    // The other model still goes to the top member; the one it lacks goes to the spare.
    expect(calls.slice(before)).toEqual([
      { memberId: c.spare, model: 'local-image-1' },
      { memberId: c.top, model: 'local-image-pro' },
    ]);
    expect((await healthOf(c.groupId, c.top)).account_disabled).toBeNull();
  });
});
