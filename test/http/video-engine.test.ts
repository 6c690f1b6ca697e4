/**
 * The task engine end to end: queued → in_progress → completed | failed, capture or release exactly
 * once, the local provider's real MP4 behind a signed URL, fenced writes, maximum lifetime.
 */
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { probeMp4 } from '../../server/providers/local/video/render-video.ts';
import { failingVideoProvider, neverFinishingVideoProvider } from '../fakes/providers.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf as holdOfTask, waitVideoFinished } from '../support/tasks.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';

let seq = 0;
const crid = () => `engine-${Date.now()}-${++seq}`;

async function create(server: TestServer, key: string, overrides: Record<string, unknown> = {}) {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: crid(), prompt: 'a lighthouse at dusk', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', ...overrides }),
  });
  expect(res.status).toBe(202);
  return (await res.json()) as { id: string; billing: { quotedCredits: number } };
}

const waitFinished = waitVideoFinished;
const holdOf = async (server: TestServer, taskId: string) => {
  const { status, amount, captured } = await holdOfTask(server.db, taskId);
  return { status, amount, captured };
};

describe('with the local provider', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ workers: true });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('renders a real MP4, completes the task, captures the quote once and serves the video by signed URL', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const created = await create(server, c.key, { seconds: 2, aspectRatio: '9:16', resolution: '360p', generate_audio: true });
    const { task } = await waitFinished(server, c.key, created.id);
    expect(task.status).toBe('completed');
    expect(task.completed_at).toMatch(/^\d{4}-/);
    expect(task.video_url).toMatch(new RegExp(`/v1/files/file_[0-9A-Za-z]+\\?expires=\\d+&signature=`));
    expect(task.data).toEqual([{ url: task.video_url }]);
    expect(task.billing).toMatchObject({ kind: 'snapshot', quotedCredits: 0.1, actualCredits: 0.1 });

    const url = new URL(task.video_url!);
    const download = await fetch(`${server.directUrl}${url.pathname}${url.search}`);
    expect(download.status).toBe(200);
    expect(download.headers.get('content-type')).toBe('video/mp4');
    expect(download.headers.get('cache-control')).toMatch(/^private, max-age=\d+$/);
    const bytes = Buffer.from(await download.arrayBuffer());
    expect(bytes.subarray(4, 8).toString('latin1')).toBe('ftyp');
    const path = join(await mkdtemp(join(tmpdir(), 'mg-video-')), 'out.mp4');
    await writeFile(path, bytes);
    const info = await probeMp4(path);
    expect(info).toMatchObject({ width: 360, height: 640, videoCodec: 'h264', audioCodec: 'aac' });
    expect(info.durationSeconds).toBeCloseTo(2, 0);

    expect(await holdOf(server, created.id)).toEqual({ status: 'captured', amount: 100_000, captured: 100_000 });
    const account = await server.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', c.accountId).executeTakeFirstOrThrow();
    expect(account).toEqual({ balance: 9_900_000, totalSpent: 100_000 });
    const captures = await server.db.selectFrom('ledgerEntries').select('amount').where('taskId', '=', created.id).where('kind', '=', 'capture').execute();
    expect(captures).toEqual([{ amount: 100_000 }]);
  });

  it('renders without an audio track when audio is off', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const created = await create(server, c.key, { resolution: '360p', aspectRatio: '1:1' });
    const { task } = await waitFinished(server, c.key, created.id);
    const url = new URL(task.video_url!);
    const bytes = Buffer.from(await (await fetch(`${server.directUrl}${url.pathname}${url.search}`)).arrayBuffer());
    const path = join(await mkdtemp(join(tmpdir(), 'mg-video-')), 'out.mp4');
    await writeFile(path, bytes);
    expect(await probeMp4(path)).toMatchObject({ width: 360, height: 360, audioCodec: null });
  });

  it('answers one 404 for a tampered, expired or unknown file URL', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const created = await create(server, c.key);
    const { task } = await waitFinished(server, c.key, created.id);
    const url = new URL(task.video_url!);
    const fileId = url.pathname.split('/').pop()!;
    const expires = Number(url.searchParams.get('expires'));
    const signature = url.searchParams.get('signature')!;
    const variants = [
      `/v1/files/${fileId}?expires=${expires + 1}&signature=${signature}`,
      // The first character changes (its six bits are all the signature's; the last one's low bits are padding).
      `/v1/files/${fileId}?expires=${expires}&signature=${signature[0] === 'A' ? 'B' : 'A'}${signature.slice(1)}`,
      `/v1/files/file_unknown?expires=${expires}&signature=${signature}`,
      `/v1/files/${fileId}?expires=1000&signature=${signature}`,
    ];
    const bodies = new Set<string>();
    for (const v of variants) {
      const res = await fetch(`${server.directUrl}${v}`);
      expect(res.status).toBe(404);
      const body = (await res.json()) as { error: { code: string; message: string } };
      expect(body.error.code).toBe('file_not_found');
      bodies.add(body.error.message);
    }
    expect(bodies.size).toBe(1);
  });
});

describe('with upstream failures', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ workers: true, overrides: { providers: { local: { video: failingVideoProvider('The upstream rejected the prompt.') } } } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('fails the task with error.message, releases the hold, keeps quotedCredits and sets actualCredits to 0', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const created = await create(server, c.key, { seconds: 4, resolution: '720p' });
    const { task } = await waitFinished(server, c.key, created.id);
    expect(task.status).toBe('failed');
    expect(task.error).toEqual({ message: 'The upstream rejected the prompt.', code: 'upstream_error' });
    expect(task).not.toHaveProperty('video_url');
    expect(task.billing).toMatchObject({ quotedCredits: 0.48, actualCredits: 0 });
    expect(await holdOf(server, created.id)).toEqual({ status: 'released', amount: 480_000, captured: 0 });
    const account = await server.db.selectFrom('accounts').select(['balance', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', c.accountId).executeTakeFirstOrThrow();
    expect(account).toEqual({ balance: 10_000_000, totalSpent: 0 });
    const key = await server.db.selectFrom('apiKeys').select('creditsUsed').where('id', '=', c.apiKeyId).executeTakeFirstOrThrow();
    expect(key.creditsUsed).toBe(0);
    const row = await server.db.selectFrom('videoTasks').select(['upstreamJobId', 'errorCode']).where('id', '=', created.id).executeTakeFirstOrThrow();
    expect(row).toEqual({ upstreamJobId: 'job-1', errorCode: 'upstream_error' });
  });
});

describe('maximum lifetime', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ workers: true, overrides: { providers: { local: { video: neverFinishingVideoProvider(50) } } }, env: { TASK_MAX_LIFETIME_SECONDS: '1' } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('fails and refunds a task that outlives its maximum lifetime', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const created = await create(server, c.key);
    const { task } = await waitFinished(server, c.key, created.id);
    expect(task.status).toBe('failed');
    expect(task.error?.message).toMatch(/maximum lifetime/);
    // The contract's refund rule: quotedCredits unchanged, actualCredits 0.
    expect(task.billing).toMatchObject({ quotedCredits: created.billing.quotedCredits, actualCredits: 0 });
    expect(created.billing.quotedCredits).toBeGreaterThan(0);
    // It was claimed and started by a worker before its lifetime ran out (not failed at creation).
    const row = await server.db.selectFrom('videoTasks').select(['attempt', 'startedAt', 'upstreamJobId']).where('id', '=', created.id).executeTakeFirstOrThrow();
    expect(row.attempt).toBeGreaterThanOrEqual(1);
    expect(row.startedAt).toBeInstanceOf(Date);
    expect(await holdOf(server, created.id)).toMatchObject({ status: 'released' });
  });
});

describe('leases and fencing', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer();
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it('a worker whose lease was taken over cannot complete or fail the task', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const created = await create(server, c.key);
    const tasks = server.ctx.repositories.videoTasks;
    const { leases } = tasks;
    const [first] = await leases.claimDue('worker-a', 10, 60_000);
    // A claim alone does not start the task: it is in_progress once a member takes the job.
    expect(first).toMatchObject({ id: created.id, attempt: 1, status: 'queued', leaseOwner: 'worker-a' });
    // Leased: nobody else can claim it.
    expect(await leases.claimDue('worker-b', 10, 60_000)).toEqual([]);
    // The lease expires (worker-a died or stalled); worker-b takes over with attempt 2.
    await server.db.updateTable('videoTasks').set({ leaseExpiresAt: new Date(Date.now() - 1000) }).where('id', '=', created.id).execute();
    const [second] = await leases.claimDue('worker-b', 10, 60_000);
    expect(second).toMatchObject({ id: created.id, attempt: 2, leaseOwner: 'worker-b' });
    // worker-a's writes are fenced off.
    expect(await leases.heartbeat({ id: created.id, attempt: 1 }, 'worker-a', 60_000)).toBe(false);
    expect(await tasks.setUpstreamJob({ id: created.id, attempt: 1 }, 'mem_x', 'job-a')).toBe(false);
    expect((await server.ctx.settlement.failVideo(first!, 'upstream_error', 'late')) !== undefined).toBe(false);
    expect(await leases.heartbeat({ id: created.id, attempt: 2 }, 'worker-b', 60_000)).toBe(true);
    expect(await tasks.setUpstreamJob({ id: created.id, attempt: 2 }, 'mem_x', 'job-b')).toBe(true);
    const row = await tasks.find(created.id);
    expect(row).toMatchObject({ status: 'in_progress', attempt: 2, upstreamJobId: 'job-b' });
  });

  it('finishing a task whose hold was already settled changes nothing: the one statement aborts', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const created = await create(server, c.key);
    const [claimed] = await server.ctx.repositories.videoTasks.leases.claimDue('worker-a', 10, 60_000);
    expect(claimed!.id).toBe(created.id);
    // Something settled the hold behind the task's back (a bug): the release gave the credits back.
    expect(await server.ctx.repositories.ledger.settleForTask(created.id, 0, server.db)).toBe(true);
    const balance = async () => (await server.db.selectFrom('accounts').select('balance').where('id', '=', c.accountId).executeTakeFirstOrThrow()).balance;
    const before = await balance();
    await expect(server.ctx.settlement.failVideo(claimed!, 'upstream_error', 'late')).rejects.toThrow(/hold of task .* is missing or was already settled/);
    expect(await server.ctx.repositories.videoTasks.find(created.id)).toMatchObject({ status: 'queued', attempt: 1, completedAt: null });
    expect(await balance()).toBe(before);
    expect(await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', created.id).execute()).toEqual([{ kind: 'hold' }, { kind: 'release' }]);
  });

  it('finished tasks stay finished and the billing snapshot is immutable', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const created = await create(server, c.key);
    await expect(server.db.updateTable('videoTasks').set({ quotedCredits: 1 }).where('id', '=', created.id).execute()).rejects.toThrow(/immutable/);
    await server.db.updateTable('videoTasks').set({ status: 'failed', errorMessage: 'x', completedAt: new Date() }).where('id', '=', created.id).execute();
    await expect(server.db.updateTable('videoTasks').set({ status: 'queued', completedAt: null }).where('id', '=', created.id).execute()).rejects.toThrow(/already failed/);
  });
});
