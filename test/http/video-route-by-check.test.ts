/**
 * One catalog video model served through two provider kinds (an `ark` member and a `fal` member,
 * the fal one through the model's fal mapping), where Ark cannot express a request fal can (a
 * negative prompt): creation lets the request in for fal, and routing sends it only to a member
 * whose upstream can run it, whatever the priorities; a request both can run goes by priority.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { startArkFake, type ArkFake } from '../fakes/ark.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until, waitVideoFinished } from '../support/tasks.ts';

/** Seedance 1.0 Pro, with a fal mapping beside Ark's own API (the endpoint the fal fake serves). */
const MODEL = 'seedance-1-0-pro-250528';

let server: TestServer;
let ark: ArkFake;
let fal: FalFake;
let seq = 0;

beforeAll(async () => {
  ark = await startArkFake({ accounts: { 'ark-a': {} } });
  fal = await startFalFake({ apiKeys: ['fal-a:secret'], queueMs: 50, jobDurationMs: 200 });
  server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000' } });
  const falMapping = findCatalogDefinition('fal/wan-2.5-t2v-fal')!.model.upstream_mappings!.fal!;
  const body = { ...findCatalogDefinition(`ark/${MODEL}`)!.model, upstream_mappings: { fal: falMapping } };
  expect((await server.admin().POST('/admin/v1/models', { body })).response.status).toBe(201);
});
afterAll(async () => {
  await server?.close();
  await ark?.close();
  await fal?.close();
});

/** A customer whose group serves the model through an Ark member (first by priority) and a fal member. */
async function customer() {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const ids: Record<string, string> = {};
  const members = [
    { name: 'ark', provider: 'ark' as const, base_url: `${ark.url}/api/v3`, credentials: { api_key: 'ark-a' }, priority: 10 },
    { name: 'fal', provider: 'fal' as const, base_url: fal.url, credentials: { api_key: 'fal-a:secret' }, priority: 0 },
  ];
  for (const m of members) {
    const { data, response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: group.id } }, body: { ...m, models: [MODEL] } });
    expect(response.status).toBe(201);
    ids[m.name] = data!.id;
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, key: key.key, ids };
}

async function create(key: string, overrides: Record<string, unknown> = {}) {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `route-check-${Date.now()}-${++seq}`, model: MODEL, prompt: 'a paper boat on a river', seconds: 5, aspectRatio: '16:9', resolution: '720p', ...overrides }),
  });
  return { status: res.status, body: (await res.json()) as Record<string, any> };
}

async function rowOf(taskId: string) {
  return until(async () => {
    const r = await server.db.selectFrom('videoTasks').select(['memberId', 'upstreamJobId']).where('id', '=', taskId).executeTakeFirstOrThrow();
    return r.upstreamJobId ? r : undefined;
  }, 10_000, 'the upstream job id');
}

/** The members each submit of a task was sent to (its recorded attempts). */
async function submittedTo(taskId: string) {
  const rows = await server.db.selectFrom('taskAttempts').select(['memberId', 'outcome']).where('taskId', '=', taskId).where('step', '=', 'submit').orderBy('id').execute();
  return rows.map((r) => `${r.memberId} ${r.outcome}`);
}

describe('a video model served through two provider kinds', () => {
  it('runs a negative prompt Ark cannot take on the fal member, never trying the Ark member first in priority; charged once', async () => {
    const c = await customer();
    const arkTasks = ark.tasks.size;
    const created = await create(c.key, { negative_prompt: 'blur' });
    expect(created.status, JSON.stringify(created.body)).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status, JSON.stringify(task.error)).toBe('completed');
    const row = await rowOf(created.body.id);
    expect(row.memberId).toBe(c.ids.fal);
    expect(fal.jobs.get(row.upstreamJobId!.split('/').at(-1)!)!.input).toMatchObject({ prompt: 'a paper boat on a river', negative_prompt: 'blur' });
    expect(await submittedTo(created.body.id)).toEqual([`${c.ids.fal} ok`]);
    expect(ark.tasks.size).toBe(arkTasks);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured' });
  });

  it('runs a request both can take on the Ark member, first by priority', async () => {
    const c = await customer();
    const created = await create(c.key);
    expect(created.status, JSON.stringify(created.body)).toBe(202);
    expect((await waitVideoFinished(server, c.key, created.body.id)).task.status).toBe('completed');
    expect((await rowOf(created.body.id)).memberId).toBe(c.ids.ark);
    expect(await submittedTo(created.body.id)).toEqual([`${c.ids.ark} ok`]);
  });
});
