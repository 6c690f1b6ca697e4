/**
 * The `openai` video adapter through the public API against a fake OpenAI `/v1/videos` upstream:
 * the wire format it sends, the task's steps (submit, poll, finalize) and what each kind of
 * upstream failure does to the task and its credits.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startOpenAIVideosFake, type OpenAIVideosFake } from '../fakes/openai-video-upstream.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until, waitVideoFinished } from '../support/tasks.ts';
import { SORA_2, addUpstreamMember } from '../support/upstreams.ts';

let server: TestServer;
let fake: OpenAIVideosFake;
let seq = 0;

beforeAll(async () => {
  fake = await startOpenAIVideosFake({ apiKeys: ['sk-test', 'sk-second'], jobDurationMs: 300, durationFor: (p) => (p.includes('never') ? 'never' : undefined) });
  server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', TASK_LEASE_MS: '3000' } });
  await seedCatalog(server.db, [SORA_2, { ...SORA_2, id: 'sora-any-length', capabilities: { ...SORA_2.capabilities, durations: [4, 6, 8] } }]);
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

async function customer(balance = 10) {
  const account = await createAccount(server.db, { balance });
  const group = await createGroup(server.db);
  await addUpstreamMember(server.db, server.secretKey, { groupId: group.id, provider: 'openai', baseUrl: `${fake.url}/v1`, credentials: { api_key: 'sk-test' }, models: [SORA_2.id, 'sora-any-length'] });
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { accountId: account.id, groupId: group.id, key: key.key };
}

async function create(key: string, overrides: Record<string, unknown> = {}) {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `oa-${Date.now()}-${++seq}`, prompt: 'a paper boat on a river', model: 'sora-2', seconds: 4, aspectRatio: '16:9', resolution: '720p', ...overrides }),
  });
  return { status: res.status, body: (await res.json()) as { id: string; error?: { code: string; message: string } } };
}

const jobOf = async (taskId: string) => {
  const row = await server.db.selectFrom('videoTasks').select(['upstreamJobId', 'memberId', 'attempt', 'retries']).where('id', '=', taskId).executeTakeFirstOrThrow();
  return { row, job: row.upstreamJobId ? fake.jobs.get(row.upstreamJobId) : undefined };
};

describe('openai videos: the wire format and the happy path', () => {
  it('submits multipart with string seconds, size and the first frame resized to it, polls, streams the content and captures once', async () => {
    const c = await customer();
    const frame = await sharp({ create: { width: 64, height: 48, channels: 3, background: '#204080' } }).png().toBuffer();
    const created = await create(c.key, { seconds: 8, aspectRatio: '9:16', firstFrame: `data:image/png;base64,${frame.toString('base64')}` });
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    expect(task.billing).toMatchObject({ quotedCredits: 0.8, actualCredits: 0.8 });

    const { job } = await jobOf(created.body.id);
    expect(job).toMatchObject({ model: 'sora-2', seconds: '8', size: '720x1280', idempotencyKey: created.body.id, inputReference: { mimeType: 'image/png' }, downloads: 1 });
    const submit = fake.requests.find((r) => r.method === 'POST' && r.headers['idempotency-key'] === created.body.id)!;
    expect(submit.headers['content-type']).toMatch(/^multipart\/form-data; boundary=/);
    expect(submit.headers.authorization).toBe('Bearer sk-test');

    const url = new URL(task.video_url!);
    const download = await fetch(`${server.directUrl}${url.pathname}${url.search}`);
    const bytes = Buffer.from(await download.arrayBuffer());
    expect([download.status, download.headers.get('content-type'), bytes.length]).toEqual([200, 'video/mp4', 64 * 1024]);
    expect(bytes.subarray(4, 8).toString('latin1')).toBe('ftyp');
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'captured', captured: 800_000 });
  });

  it('refuses at creation, before any charge, what the upstream cannot express', async () => {
    const c = await customer();
    const res = await create(c.key, { model: 'sora-any-length', seconds: 6 });
    expect([res.status, res.body.error?.code]).toEqual([400, 'unsupported_by_upstream']);
    expect(res.body.error?.message).toContain('4, 8, 12 seconds');
    const holds = await server.db.selectFrom('creditHolds').select('id').where('accountId', '=', c.accountId).execute();
    expect(holds).toEqual([]);
  });
});

describe('openai videos: upstream failures', () => {
  it('retries 5xx and 429 (honouring retry-after) and still submits one job', async () => {
    const c = await customer();
    fake.faults.push('create', { status: 500, body: { error: { message: 'The server had an error', type: 'server_error', param: null, code: null } } });
    fake.rateLimitNext('create', 3);
    const created = await create(c.key);
    const { task } = await waitVideoFinished(server, c.key, created.body.id, 60_000);
    expect(task.status).toBe('completed');
    // Three submits: the 500, the 429, the one accepted.
    const creates = fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/videos') && r.headers['idempotency-key'] === created.body.id);
    expect(creates).toHaveLength(3);
    const jobs = [...fake.jobs.values()].filter((j) => j.idempotencyKey === created.body.id);
    expect(jobs).toHaveLength(1);
    // The delays the engine chose, as it logged them: after the 500 the first backoff (0.5–1 s);
    // after the 429 its retry-after (3 s, plus up to 10% jitter), longer than any backoff of a
    // second failure (1–2 s) would have been. And the retry did wait that long.
    const retries = server.logs
      .filter((l) => l.includes(created.body.id) && l.includes('task step failed; retrying'))
      .map((l) => (JSON.parse(l) as { retryInMs: number }).retryInMs);
    expect(retries).toHaveLength(2);
    expect(retries[0]).toBeGreaterThanOrEqual(500);
    expect(retries[0]).toBeLessThanOrEqual(1000);
    expect(retries[1]).toBeGreaterThanOrEqual(3000);
    expect(retries[1]).toBeLessThanOrEqual(3300);
    expect(creates[2]!.receivedAt - creates[1]!.receivedAt).toBeGreaterThanOrEqual(2900);
  });

  it('a job the upstream reports failed (moderation) fails the task with a policy code and its reason, and releases the hold', async () => {
    const c = await customer();
    const created = await create(c.key, { prompt: 'please fail-me' });
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('failed');
    expect(task.error).toMatchObject({ code: 'content_policy_violation', message: 'Your request was blocked by our moderation system.' });
    expect(task.billing).toMatchObject({ actualCredits: 0 });
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('a submit answered 200 with an error envelope (some gateways do) fails the task with its mapped code and reason, without submitting again', async () => {
    const c = await customer();
    fake.faults.push('create', { status: 200, body: { error: { message: 'Your request was blocked by our moderation system.', type: 'invalid_request_error', param: null, code: 'moderation_blocked' } } });
    const created = await create(c.key);
    expect(created.status).toBe(202);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('failed');
    expect(task.error).toEqual({ code: 'content_policy_violation', message: 'Your request was blocked by our moderation system.' });
    expect(fake.requests.filter((r) => r.method === 'POST' && r.headers['idempotency-key'] === created.body.id)).toHaveLength(1);
    expect([...fake.jobs.values()].filter((j) => j.idempotencyKey === created.body.id)).toEqual([]);
    expect((await jobOf(created.body.id)).row.upstreamJobId).toBeNull();
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('an upstream that refuses the model of the member (not the request) fails the task as having no member for it, refunded, with the reason in member health', async () => {
    const c = await customer();
    fake.faults.push('create', { status: 400, body: { error: { message: "Invalid value: 'sora-2'. Your organization cannot use this model.", type: 'invalid_request_error', param: 'model', code: 'invalid_value' } } });
    const created = await create(c.key);
    const { task } = await waitVideoFinished(server, c.key, created.body.id, 15_000);
    expect(task.error).toMatchObject({ code: 'no_reachable_member' });
    expect(task.error!.message).not.toContain('organization');
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
    const health = (await server.admin().GET('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: c.groupId } } })).data!.data[0]!.health;
    expect(health.model_faults).toEqual([expect.objectContaining({ model: 'sora-2', kind: 'misconfigured', reason: expect.stringContaining('Your organization cannot use this model') })]);
  });

  it('an upstream refusal of the request itself fails the task with upstream_rejected and its reason, and no charge', async () => {
    const c = await customer();
    fake.faults.push('create', { status: 400, body: { error: { message: "Invalid value: '4'. Supported values are: '4', '8', and '12'.", type: 'invalid_request_error', param: 'seconds', code: 'invalid_value' } } });
    const created = await create(c.key);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.error).toMatchObject({ code: 'upstream_rejected' });
    expect(task.error!.message).toBe("Invalid value: '4'. Supported values are: '4', '8', and '12'.");
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('records why a retried video task waits: an unreachable member leaves its reason on the task for the operator, not in the client\'s lookup', async () => {
    const c = await customer();
    await server.db.updateTable('groupMembers').set({ baseUrl: 'http://127.0.0.1:9/v1' }).where('groupId', '=', c.groupId).execute();
    const created = await create(c.key);
    const admin = await until(async () => {
      const got = (await server.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: created.body.id } } })).data!;
      return got.last_error ? got : undefined;
    }, 15_000, 'a last error on the task');
    expect(admin.last_error).toEqual({ message: 'The upstream video submit could not be reached. (retryable)', at: expect.any(String) });
    const lookup = await fetch(`${server.directUrl}/v1/videos/${created.body.id}`, { headers: { Authorization: `Bearer ${c.key}` } });
    const body = (await lookup.json()) as Record<string, unknown>;
    expect(body.status).toMatch(/queued|in_progress/);
    expect(body).not.toHaveProperty('error');
    expect(body).not.toHaveProperty('last_error');
  });

  it('expired content fails the task and refunds it', async () => {
    const c = await customer();
    fake.faults.push('content', { status: 404, body: { error: { message: 'The content of this video has expired.', type: 'invalid_request_error', param: null, code: null } } });
    const created = await create(c.key);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('failed');
    expect(task.error!.message).toMatch(/expired/);
    expect(await holdOf(server.db, created.body.id)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('never polls a job again once a poll said it finished: a download answered 429 is retried alone, after its Retry-After', async () => {
    const c = await customer();
    for (const _ of [1, 2, 3]) {
      fake.rateLimitNext('content', 1);
      fake.rateLimitNext('content', 1);
      const created = await create(c.key);
      const { task } = await waitVideoFinished(server, c.key, created.body.id, 30_000);
      expect(task.status).toBe('completed');
      const { job } = await jobOf(created.body.id);
      const polls = fake.requests.filter((r) => r.method === 'GET' && r.path.endsWith(`/videos/${job!.id}`));
      const downloads = fake.requests.filter((r) => r.method === 'GET' && r.path.endsWith(`/videos/${job!.id}/content`));
      // One poll saw the job completed; none after it, whatever the downloads met.
      expect(polls.filter((p) => p.receivedAt >= job!.doneAt!)).toHaveLength(1);
      expect(downloads).toHaveLength(3);
      for (let i = 1; i < downloads.length; i++) expect(downloads[i]!.receivedAt - downloads[i - 1]!.receivedAt).toBeGreaterThanOrEqual(950);
      const row = await server.db.selectFrom('videoTasks').select(['upstreamOutput', 'upstreamDoneAt']).where('id', '=', created.body.id).executeTakeFirstOrThrow();
      expect(row.upstreamOutput).toEqual({});
      expect(row.upstreamDoneAt).toBeInstanceOf(Date);
      const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.body.id).orderBy('id').execute();
      expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
    }
  });

  it('fails and refunds a finished job whose download keeps failing once the download retries are used up', async () => {
    const strict = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100', VIDEO_DOWNLOAD_RETRIES: '1' } });
    try {
      await seedCatalog(strict.db, [SORA_2]);
      const account = await createAccount(strict.db, { balance: 10 });
      const group = await createGroup(strict.db);
      await addUpstreamMember(strict.db, strict.secretKey, { groupId: group.id, provider: 'openai', baseUrl: `${fake.url}/v1`, credentials: { api_key: 'sk-test' }, models: [SORA_2.id] });
      const key = await createApiKey(strict.db, { accountId: account.id, groupId: group.id });
      fake.faults.push('content', { status: 503, body: { error: { message: 'The engine is currently overloaded', type: 'server_error', param: null, code: null } } }, 2);
      const res = await fetch(`${strict.directUrl}/v1/videos/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${key.key}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ client_request_id: `oa-strict-${Date.now()}`, prompt: 'a paper boat', model: 'sora-2', seconds: 4, aspectRatio: '16:9', resolution: '720p' }),
      });
      const id = ((await res.json()) as { id: string }).id;
      const { task } = await waitVideoFinished(strict, key.key, id, 30_000);
      expect(task.status).toBe('failed');
      expect(task.error!.message).toMatch(/^The video was generated, but its download failed 2 times \(last: .*overloaded/);
      expect(await holdOf(strict.db, id)).toMatchObject({ status: 'released', captured: 0 });
      const row = await strict.db.selectFrom('videoTasks').select('upstreamJobId').where('id', '=', id).executeTakeFirstOrThrow();
      expect(fake.requests.filter((r) => r.path.endsWith(`/videos/${row.upstreamJobId}/content`))).toHaveLength(2);
    } finally {
      await strict.close();
    }
  });

  it('a worker that loses its lease mid-download stops; the next claim downloads again and completes once with one stored output', async () => {
    const c = await customer();
    const downloadsBefore = fake.counts.content;
    fake.faults.push('content', { delayMs: 2_500 }); // a slow (but successful) download
    const created = await create(c.key);
    await expect.poll(() => fake.counts.content, { timeout: 10_000, interval: 20 }).toBeGreaterThan(downloadsBefore);
    // Another worker takes the row over (as after this worker's lease expired): the attempt moves
    // on, so this worker's heartbeat fails and its step must stop without writing anything.
    await server.db
      .updateTable('videoTasks')
      .set((eb) => ({ attempt: eb('attempt', '+', 1), leaseOwner: 'another-worker', leaseExpiresAt: new Date(Date.now() + 1_500) }))
      .where('id', '=', created.body.id)
      .execute();
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    expect(fake.counts.content - downloadsBefore).toBe(2);
    expect(server.logs.some((l) => l.includes(created.body.id) && l.includes('it resumes after its lease expires'))).toBe(true);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.body.id).orderBy('id').execute();
    expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
    const outputs = await server.db.selectFrom('files').select('id').where('taskId', '=', created.body.id).where('purpose', '=', 'video_output').execute();
    expect(outputs).toHaveLength(1);
  });

  it('a crash after the submit and before the job id is saved resubmits to the same member with the same idempotency key, says so, and completes once', async () => {
    const c = await customer();
    // The submit reaches the upstream and its answer is slow; meanwhile the worker loses the task
    // (as when its process dies): the step stops without saving a job id.
    fake.faults.push('create', { delayMs: 2_000 });
    const before = fake.jobs.size;
    const created = await create(c.key);
    await expect.poll(() => fake.requests.filter((r) => r.method === 'POST' && r.headers['idempotency-key'] === created.body.id).length, { timeout: 10_000, interval: 20 }).toBe(1);
    const { row } = await jobOf(created.body.id);
    await server.db
      .updateTable('videoTasks')
      .set((eb) => ({ attempt: eb('attempt', '+', 1), leaseOwner: 'a-dead-worker', leaseExpiresAt: new Date(Date.now() + 1_000) }))
      .where('id', '=', created.body.id)
      .execute();
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    expect(fake.requests.filter((r) => r.method === 'POST' && r.headers['idempotency-key'] === created.body.id)).toHaveLength(2);
    expect(server.logs.some((l) => l.includes(created.body.id) && l.includes('resubmitting'))).toBe(true);
    expect((await jobOf(created.body.id)).row.memberId).toBe(row.memberId);
    // This upstream does not honour Idempotency-Key (the API does not document it for videos): the
    // first submit's job runs there too, as the contract says; the task follows one job only.
    await expect.poll(() => fake.jobs.size - before, { timeout: 5_000 }).toBe(2);
    const followed = (await jobOf(created.body.id)).row.upstreamJobId;
    expect([...fake.jobs.values()].filter((j) => j.idempotencyKey === created.body.id).map((j) => j.id)).toContain(followed);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.body.id).orderBy('id').execute();
    expect(entries.map((e) => e.kind)).toEqual(['hold', 'capture']);
  });

  it('a submit whose connection drops is sent again with the same idempotency key and runs once', async () => {
    const c = await customer();
    fake.faults.push('create', { destroy: true });
    const before = fake.jobs.size;
    const created = await create(c.key);
    const { task } = await waitVideoFinished(server, c.key, created.body.id);
    expect(task.status).toBe('completed');
    expect(fake.requests.filter((r) => r.method === 'POST' && r.headers['idempotency-key'] === created.body.id)).toHaveLength(2);
    expect(fake.jobs.size - before).toBe(1);
  });
});

describe('openai videos through the pool', () => {
  async function twoMembers(o: { concurrencyLimit?: number } = {}) {
    const account = await createAccount(server.db, { balance: 10 });
    const group = await createGroup(server.db);
    const ids: string[] = [];
    for (const [i, key] of ['sk-test', 'sk-second'].entries()) {
      const member = await addUpstreamMember(server.db, server.secretKey, {
        groupId: group.id,
        provider: 'openai',
        baseUrl: `${fake.url}/v1`,
        credentials: { api_key: key },
        models: [SORA_2.id],
        // Equal priority and weight: both members take jobs.
        concurrencyLimit: o.concurrencyLimit ?? null,
        name: `m${i}`,
      });
      ids.push(member.id);
    }
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    return { key: key.key, ids };
  }
  const keyOf = (r: { headers: Record<string, unknown> }) => String(r.headers.authorization).replace('Bearer ', '');

  it('polls and downloads every job on the member that accepted it', async () => {
    const c = await twoMembers();
    const created = await Promise.all(Array.from({ length: 16 }, () => create(c.key)));
    for (const t of created) expect((await waitVideoFinished(server, c.key, t.body.id)).task.status).toBe('completed');
    const accepted = new Set<string>();
    for (const t of created) {
      const { job } = await jobOf(t.body.id);
      const submitKey = keyOf(fake.requests.find((r) => r.method === 'POST' && r.headers['idempotency-key'] === t.body.id)!);
      accepted.add(submitKey);
      const followUps = fake.requests.filter((r) => r.method === 'GET' && r.path.startsWith(`/v1/videos/${job!.id}`));
      expect(followUps.length).toBeGreaterThanOrEqual(2); // at least one poll and the download
      expect(new Set(followUps.map(keyOf))).toEqual(new Set([submitKey]));
    }
    expect(accepted.size).toBe(2); // both members took jobs (16 draws at 50/50: 1 in 32,768 to miss; 8 missed once in a local run)
  });

  it('keeps a video task queued while every member is at its concurrency limit, and never exceeds it', async () => {
    const c = await twoMembers({ concurrencyLimit: 1 });
    const created = await Promise.all(Array.from({ length: 4 }, () => create(c.key)));
    // Two run (one per member); the other two wait queued, with no retry counted.
    await expect.poll(async () => (await server.db.selectFrom('videoTasks').select('id').where('id', 'in', created.map((t) => t.body.id)).where('upstreamJobId', 'is not', null).execute()).length, { timeout: 5_000 }).toBeGreaterThanOrEqual(2);
    // The client sees the waiting ones as queued (claimed and put back, but no member took them), the running ones as in_progress.
    const rowsOf = () => server.db.selectFrom('videoTasks').select(['id', 'memberId', 'upstreamJobId']).where('id', 'in', created.map((t) => t.body.id)).execute();
    const before = await rowsOf();
    const seen = new Map<string, string>();
    for (const t of created) seen.set(t.body.id, (await (await fetch(`${server.directUrl}/v1/videos/${t.body.id}`, { headers: { Authorization: `Bearer ${c.key}` } })).json() as { status: string }).status);
    const after = await rowsOf();
    const waiting = before.filter((r) => r.memberId === null && after.find((a) => a.id === r.id)!.memberId === null).map((r) => r.id);
    expect(waiting.length).toBeGreaterThanOrEqual(1);
    for (const id of waiting) expect([id, seen.get(id)]).toEqual([id, 'queued']);
    for (const r of before.filter((r) => r.upstreamJobId !== null)) expect(['in_progress', 'completed']).toContain(seen.get(r.id));
    for (const t of created) expect((await waitVideoFinished(server, c.key, t.body.id)).task.status).toBe('completed');
    const jobs = await Promise.all(created.map(async (t) => ({ ...(await jobOf(t.body.id)), id: t.body.id })));
    expect(jobs.every((j) => j.row.retries === 0)).toBe(true);
    // Per member, each job was submitted only after the previous one finished upstream.
    for (const memberId of c.ids) {
      const mine = jobs.filter((j) => j.row.memberId === memberId).map((j) => j.job!).sort((a, b) => a.createdAt - b.createdAt);
      for (let i = 1; i < mine.length; i++) expect(mine[i]!.createdAt).toBeGreaterThanOrEqual(mine[i - 1]!.doneAt!);
    }
    const entries = await server.db.selectFrom('ledgerEntries').select(['taskId', 'kind']).where('taskId', 'in', created.map((t) => t.body.id)).execute();
    expect(entries.filter((e) => e.kind === 'capture')).toHaveLength(4);
  });
});
