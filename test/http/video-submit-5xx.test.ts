/**
 * A video submit answered 500, 502, 504 or 524 usually got that answer from the upstream's edge
 * after its origin received the whole request, which may have created the job (billed): it is
 * maybe accepted, as a timeout is. It is never sent to another member (a second account would run
 * it again); it counts as an unanswered submit and is resubmitted to the same member, at most
 * MAX_UNANSWERED_SUBMITS times where the upstream cannot tell a resubmit from a new job. A 503 (the
 * upstream takes no work now) still fails over. A scripted stand-in with two local members, then
 * the real Ark adapter against its fake, whose edge answers an HTML 504.
 */
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { VideoProvider } from '../../server/providers/types.ts';
import { startArkFake, type ArkFake } from '../fakes/ark.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { createLocalVideo, twoMemberVideoKey, waitVideoFinished } from '../support/tasks.ts';

/** Each submit: the member it went to and the task. A prompt's words script its submits' answers. */
const submits: { memberId: string; taskId: string }[] = [];
const answered = (status: number) => new ProviderError('retryable', `the upstream video submit answered HTTP ${status}`, { upstreamStatus: status });
const provider: VideoProvider = {
  pollIntervalMs: 0,
  submit: async (account, job) => {
    submits.push({ memberId: account.memberId, taskId: job.taskId });
    const nth = submits.filter((s) => s.taskId === job.taskId).length;
    const status = Number(/HTTP (\d{3})/.exec(job.prompt)?.[1]);
    // An answer in the upstream's own envelope (its error code read): the upstream refused the job.
    if (nth === 1 && job.prompt.includes('coded')) throw new ProviderError('retryable', 'server_error', { upstreamStatus: status, upstreamCode: '1000' });
    if (nth === 1 && job.prompt.includes('first')) throw answered(status);
    if (job.prompt.includes('then always')) {
      if (nth === 1) throw new ProviderError('retryable', 'the upstream video submit timed out', { maybeAccepted: true });
      throw answered(status);
    }
    return `job-${job.taskId}-${nth}`;
  },
  poll: async () => ({ state: 'succeeded', output: {} }),
  download: async () => ({ stream: Readable.from([Buffer.from('mp4 bytes')]), contentType: 'video/mp4', bytes: 9 }),
};

describe('a video submit answered 5xx, scripted', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ workers: true, overrides: { providers: { local: { video: provider } } } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());



  it.each([500, 502, 504, 524])('answered %i first: resubmitted to the same member, never to the other one, counted as unanswered; the task completes there', async (status) => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, `HTTP ${status} first`);
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(2);
    expect(mine[1]!.memberId).toBe(mine[0]!.memberId);
    const row = await server.db.selectFrom('videoTasks').select(['unansweredSubmits', 'memberId']).where('id', '=', id).executeTakeFirstOrThrow();
    expect(row).toEqual({ unansweredSubmits: 2, memberId: mine[0]!.memberId });
  });

  it('answered 504 to every resubmit: counted, so not sent a third time; failed and refunded', async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'HTTP 504 then always');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('failed');
    expect(task.error?.message).toMatch(/None of the 2 submits of this job got an answer.*refunded/);
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(2);
    expect(mine[1]!.memberId).toBe(mine[0]!.memberId);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', id).execute();
    expect(entries.map((e) => e.kind).sort()).toEqual(['hold', 'release']);
  });

  it("answered 500 in the upstream's own envelope (its error code: the API answered, not an edge): moves to the other member, uncounted", async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'HTTP 500 coded');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(2);
    expect(mine[1]!.memberId).not.toBe(mine[0]!.memberId);
  });

  it("answered 504 in the upstream's own envelope (Kling's 5002 timeout, Veo's DEADLINE_EXCEEDED: the job may still be made): resubmitted to the same member", async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'HTTP 504 coded');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(2);
    expect(mine[1]!.memberId).toBe(mine[0]!.memberId);
  });

  it('answered 503 first (the upstream takes no work now): moves to the other member, uncounted', async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'HTTP 503 first');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(2);
    expect(mine[1]!.memberId).not.toBe(mine[0]!.memberId);
    const row = await server.db.selectFrom('videoTasks').select('unansweredSubmits').where('id', '=', id).executeTakeFirstOrThrow();
    expect(row.unansweredSubmits).toBe(1);
  });
});

describe('a Seedance submit whose edge answers an HTML 504, through the Ark adapter', () => {
  const MODEL = 'seedance-1-0-pro-250528';
  let server: TestServer;
  let fake: ArkFake;
  beforeAll(async () => {
    fake = await startArkFake({ accounts: { 'ark-a': {}, 'ark-b': {} }, queuedMs: 20, runningMs: 20 });
    server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100' } });
    const created = await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(`ark/${MODEL}`)!.model });
    expect(created.response.status).toBe(201);
  });
  afterAll(async () => {
    await server?.close();
    await fake?.close();
  });

  it('is resubmitted to the same account, never run on the second one', async () => {
    const account = await createAccount(server.db, { balance: 100 });
    const group = await createGroup(server.db);
    for (const [name, priority] of [['a', 10], ['b', 0]] as const) {
      const member = await server.admin().POST('/admin/v1/groups/{group_id}/members', {
        params: { path: { group_id: group.id } },
        body: { name, provider: 'ark', base_url: `${fake.url}/api/v3`, credentials: { api_key: `ark-${name}` }, models: [MODEL], priority },
      });
      expect(member.response.status).toBe(201);
    }
    const { key } = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    fake.faults.push('submit', { status: 504, body: Buffer.from('<html><body>504 Gateway Time-out</body></html>'), headers: { 'content-type': 'text/html' } });

    const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ client_request_id: `ark-504-${Date.now()}`, prompt: 'a boat', model: MODEL, seconds: 5, aspectRatio: '16:9', resolution: '720p' }),
    });
    expect(res.status).toBe(202);
    const { id } = (await res.json()) as { id: string };
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const sent = fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/contents/generations/tasks'));
    expect(sent.map((r) => r.headers.authorization)).toEqual(['Bearer ark-a', 'Bearer ark-a']);
    expect([...fake.tasks.values()].map((t) => t.apiKey)).toEqual(['ark-a']);
  });
});
