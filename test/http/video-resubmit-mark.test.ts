/**
 * A video submit that may have been accepted (here: a 2xx answer without the job's id) leaves its
 * mark on the task: the member it went to, which may be running the job. The resubmit to that
 * member can be answered with something that says nothing about the first submit (a 429, refused
 * credentials): the mark stays, and the next attempt asks the same member again, never another
 * one, where a second account would run (and bill) the job too (design §8). Two members of the fake
 * Kling API serve the model; `a` comes first by priority.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { startKlingFake, type KlingFake } from '../fakes/kling.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until, waitVideoFinished } from '../support/tasks.ts';

const MODEL = 'kling-v3-std';

let server: TestServer;
let fake: KlingFake;
let seq = 0;

beforeAll(async () => {
  fake = await startKlingFake({
    accounts: [
      { accessKey: 'ak-a', secretKey: 'sk-a-secret' },
      { accessKey: 'ak-b', secretKey: 'sk-b-secret' },
    ],
    jobDurationMs: 200,
  });
  server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_POLL_MS: '100', POOL_CACHE_TTL_MS: '0' } });
  const { response } = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(`kling/${MODEL}`)!.model });
  expect(response.status).toBe(201);
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

/** A customer whose group has two Kling members, `a` (priority 10) and `b` (priority 0). */
async function customer() {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const ids: Record<string, string> = {};
  for (const m of [
    { name: 'a', ak: 'ak-a', sk: 'sk-a-secret', priority: 10 },
    { name: 'b', ak: 'ak-b', sk: 'sk-b-secret', priority: 0 },
  ]) {
    const { data, response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: m.name, provider: 'kling', base_url: fake.url, credentials: { access_key: m.ak, secret_key: m.sk }, models: [MODEL], priority: m.priority },
    });
    expect(response.status).toBe(201);
    ids[m.name] = data!.id;
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { groupId: group.id, key: key.key, ids };
}

async function create(key: string): Promise<string> {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `resubmit-mark-${Date.now()}-${++seq}`, prompt: 'a paper boat on a river', model: MODEL, seconds: 5, aspectRatio: '16:9', resolution: '720p' }),
  });
  expect(res.status).toBe(202);
  return ((await res.json()) as { id: string }).id;
}

/** The access keys of the creates Kling got for a task (its external_task_id), in order. */
function submitsOf(taskId: string): string[] {
  return fake.requests
    .filter((r) => r.method === 'POST' && (r.json as Record<string, unknown> | undefined)?.external_task_id === taskId)
    .map((r) => keyOf(r.headers.authorization));
}

/** The access key a request was signed with (its JWT's `iss`). */
function keyOf(authorization: string | string[] | undefined): string {
  return JSON.parse(Buffer.from(String(authorization).split('.')[1]!, 'base64url').toString()).iss as string;
}

/** The task's row once `n` creates reached Kling and the step that sent the last one handed the task back. */
async function afterSubmits(taskId: string, n: number) {
  await until(() => submitsOf(taskId).length >= n, 15_000, `${n} creates at Kling`);
  return until(
    async () => {
      const row = await server.db.selectFrom('videoTasks').select(['memberId', 'submitStartedAt', 'upstreamJobId', 'leaseOwner', 'retries']).where('id', '=', taskId).executeTakeFirstOrThrow();
      return row.leaseOwner === null && row.retries >= n && row;
    },
    15_000,
    'the task handed back after its resubmit',
  );
}

async function healthOf(groupId: string) {
  const { data } = await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: groupId } } });
  return Object.fromEntries(data!.data.map((m) => [m.name, m.health]));
}

/** The first create is answered 200 without a task id: Kling may have taken it (maybe accepted). */
function answerWithoutTaskIdNext() {
  fake.faults.push('submit', { status: 200, body: { code: 0, message: 'SUCCEED', request_id: 'req-no-id', data: { task_status: 'submitted' } } });
}

describe('the mark of a submit that may have been accepted', () => {
  it('stays when the resubmit is rate-limited: the next attempt goes to the same (cooling) member, never to the free one', async () => {
    const c = await customer();
    answerWithoutTaskIdNext();
    // The resubmit: 429 with a long Retry-After, so `a` is still cooling down at the next attempt.
    fake.rateLimitNext('submit', 30);
    const id = await create(c.key);

    const marked = await afterSubmits(id, 2);
    expect(submitsOf(id)).toEqual(['ak-a', 'ak-a']);
    expect((await healthOf(c.groupId)).a!.cooldown_reason).toBe('rate_limited');
    // A 429 says nothing of whether the first create made a task: `a` stays named.
    expect(marked).toMatchObject({ memberId: c.ids.a, upstreamJobId: null });
    expect(marked.submitStartedAt).not.toBeNull();

    // The Retry-After has not passed for the member; the task's next attempt is brought forward.
    await server.db.updateTable('videoTasks').set({ nextRunAt: new Date() }).where('id', '=', id).where('leaseOwner', 'is', null).execute();
    const { task } = await waitVideoFinished(server, c.key, id);
    expect(task.status).toBe('completed');
    expect(submitsOf(id)).toEqual(['ak-a', 'ak-a', 'ak-a']);
    const upstream = [...fake.tasks.values()].filter((t) => t.externalTaskId === id);
    expect(upstream.map((t) => t.accessKey)).toEqual(['ak-a']);
    const row = await server.db.selectFrom('videoTasks').select('memberId').where('id', '=', id).executeTakeFirstOrThrow();
    expect(row.memberId).toBe(c.ids.a);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', id).orderBy('id').execute();
    expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
  });

  it('stays when the resubmit meets refused credentials: the next attempt asks the same member again, not the other one', async () => {
    const c = await customer();
    answerWithoutTaskIdNext();
    fake.errorNext('submit', 1000);
    const id = await create(c.key);

    const marked = await afterSubmits(id, 2);
    expect(marked).toMatchObject({ memberId: c.ids.a, upstreamJobId: null });
    const { task } = await waitVideoFinished(server, c.key, id);
    expect(task.status).toBe('completed');
    expect(submitsOf(id)).toEqual(['ak-a', 'ak-a', 'ak-a']);
    expect([...fake.tasks.values()].filter((t) => t.externalTaskId === id).map((t) => t.accessKey)).toEqual(['ak-a']);
  });
});

describe('a submit that never reached the upstream', () => {
  it('leaves the task queued, never in_progress with nothing running: its member is cleared and it is tried again', async () => {
    const account = await createAccount(server.db, { balance: 100 });
    const group = await createGroup(server.db);
    // Nothing listens there: every create is refused before the upstream saw it.
    const { response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
      params: { path: { group_id: group.id } },
      body: { name: 'gone', provider: 'kling', base_url: 'http://127.0.0.1:1', credentials: { access_key: 'ak-a', secret_key: 'sk-a-secret' }, models: [MODEL] },
    });
    expect(response.status).toBe(201);
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    const id = await create(key.key);
    const row = await until(
      async () => {
        const r = await server.db.selectFrom('videoTasks').select(['status', 'startedAt', 'memberId', 'lastError', 'leaseOwner', 'retries']).where('id', '=', id).executeTakeFirstOrThrow();
        return r.leaseOwner === null && r.retries >= 1 && r;
      },
      15_000,
      'a failed submit handed back',
    );
    expect(row).toMatchObject({ status: 'queued', startedAt: null, memberId: null });
    const polled = await server.client(key.key).GET('/v1/videos/{id}', { params: { path: { id } } });
    expect(polled.data).toMatchObject({ status: 'queued' });
    expect(polled.data).not.toHaveProperty('completed_at');
  });
});
