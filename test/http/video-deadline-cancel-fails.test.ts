/**
 * The cancel of a job past its task's deadline is best effort: when it cannot even start (the
 * member's credentials no longer decrypt) the task is failed and refunded all the same, by an
 * engine's step or by the task sweeper, whose run goes on with the rest of its tasks and its
 * holds. A stop while a cancel is waited for refunds nothing: the refund without the cancel would
 * leave the job running upstream, so the task is left to its lease, and so are the tasks the
 * sweeper claimed after it. The provider is a scripted stand-in whose cancel can hang.
 */
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import type { VideoProvider } from '../../server/providers/types.ts';
import type { VideoTaskRow } from '../../server/repositories/video-task.repository.ts';
import { createCustomer, createMember, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';

/** The jobs asked to be cancelled; `cancelHangs` keeps each cancel waiting until its signal ends. */
const cancels: string[] = [];
let cancelHangs = false;
const provider: VideoProvider = {
  pollIntervalMs: 0,
  submit: async (_account, job) => `job-${job.taskId}`,
  poll: async () => ({ state: 'running' }),
  download: async () => ({ stream: Readable.from([Buffer.from('x')]), contentType: 'video/mp4', bytes: 1 }),
  cancel: (_account, jobId, signal) => {
    cancels.push(jobId);
    if (!cancelHangs) return Promise.resolve();
    return new Promise<void>((_, reject) => signal.addEventListener('abort', () => reject(signal.reason), { once: true }));
  },
};

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({ workers: false, overrides: { providers: { local: { video: provider } } } });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

const silent = createLogger('silent');
const rowOf = (id: string) => server.db.selectFrom('videoTasks').select(['status', 'errorCode']).where('id', '=', id).executeTakeFirstOrThrow();

async function createVideo(key: string): Promise<string> {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `r-${Date.now()}-${Math.random()}`, prompt: 'a lighthouse', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' }),
  });
  expect(res.status).toBe(202);
  return ((await res.json()) as { id: string }).id;
}

/** A task with a job on `memberId`, in progress, past its deadline, unleased, not due for a step. */
async function overdue(id: string, memberId: string) {
  await server.db
    .updateTable('videoTasks')
    .set({ status: 'in_progress', memberId, upstreamJobId: `job-${id}`, submitStartedAt: new Date(), deadlineAt: new Date(Date.now() - 1000), nextRunAt: new Date(Date.now() + 3600_000) })
    .where('id', '=', id)
    .execute();
}

/** A customer, its working member, and a member whose stored credentials do not open (a wrong MEDIAGATE_SECRET_KEY, a damaged row). */
async function customerWithBrokenMember() {
  const c = await createCustomer(server.db, { balance: 100 });
  const good = (await server.db.selectFrom('groupMembers').select('id').where('groupId', '=', c.groupId).executeTakeFirstOrThrow()).id;
  const broken = await createMember(server.db, c.groupId, { name: 'broken-credentials', enabled: false, credentials: Buffer.from('01' + '00'.repeat(40), 'hex') });
  return { ...c, good, broken: broken.id };
}

/** Claims `id` as an engine would (attempt + 1, a lease) and returns its row. */
async function claim(id: string): Promise<VideoTaskRow> {
  await server.db.updateTable('videoTasks').set({ nextRunAt: new Date() }).where('id', '=', id).execute();
  const claimed = (await server.ctx.runners.video.leases.claimDue('w_test', 50, 60_000)) as VideoTaskRow[];
  const task = claimed.find((t) => t.id === id);
  expect(claimed.map((t) => t.id)).toEqual([id]);
  return task!;
}

describe('a task past its deadline whose cancel cannot start', () => {
  it('is failed and refunded by an engine\'s step, the cancel logged as not done', async () => {
    const c = await customerWithBrokenMember();
    const id = await createVideo(c.key);
    await overdue(id, c.broken);
    const task = await claim(id);
    const never = new AbortController().signal;
    await server.ctx.runners.video.step(task, never, server.ctx.log.child({ taskId: id }), never);
    expect(await rowOf(id)).toEqual({ status: 'failed', errorCode: 'timeout' });
    expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
    expect(server.logs.some((l) => l.includes(id) && l.includes('could not cancel the upstream job'))).toBe(true);
  });

  it('is failed and refunded by the task sweeper, whose run ends the rest of its tasks and settles stranded holds', async () => {
    const c = await customerWithBrokenMember();
    const poisoned = await createVideo(c.key);
    const healthy = await createVideo(c.key);
    const stranded = await createVideo(c.key);
    await overdue(poisoned, c.broken);
    await overdue(healthy, c.good);
    // A failed task whose hold is still held (what the holds phase mends).
    await server.db.updateTable('videoTasks').set({ status: 'failed', completedAt: new Date(), errorMessage: 'x', nextRunAt: new Date(Date.now() + 3600_000) }).where('id', '=', stranded).execute();
    cancels.length = 0;

    expect(await server.ctx.taskSweeper.run()).toEqual({ videos: 2, images: 0, holds: 1 });
    for (const id of [poisoned, healthy]) {
      expect(await rowOf(id)).toEqual({ status: 'failed', errorCode: 'timeout' });
      expect(await holdOf(server.db, id)).toMatchObject({ status: 'released' });
    }
    expect(await holdOf(server.db, stranded)).toMatchObject({ status: 'released' });
    expect(cancels).toEqual([`job-${healthy}`]);
  });
});

describe('a stop while the cancel at the deadline is waited for', () => {
  it('refunds nothing in an engine\'s step: the step ends as stopped and the task waits for its lease', async () => {
    const c = await customerWithBrokenMember();
    const id = await createVideo(c.key);
    await overdue(id, c.good);
    const task = await claim(id);
    cancels.length = 0;
    cancelHangs = true;
    try {
      const stop = new AbortController();
      const step = server.ctx.runners.video.step(task, stop.signal, silent, new AbortController().signal);
      await until(() => cancels.length === 1, 5000, 'the cancel to be asked');
      stop.abort(new Error('worker stopping'));
      await expect(step).rejects.toThrow('worker stopping');
    } finally {
      cancelHangs = false;
    }
    expect(await rowOf(id)).toEqual({ status: 'in_progress', errorCode: null });
    expect(await holdOf(server.db, id)).toMatchObject({ status: 'held' });
  });

  it('refunds nothing in a sweeper run: the task and the rest of its claim wait for their leases', async () => {
    const c = await customerWithBrokenMember();
    const first = await createVideo(c.key);
    const second = await createVideo(c.key);
    await overdue(first, c.good);
    await overdue(second, c.good);
    cancels.length = 0;
    cancelHangs = true;
    const sweeper = server.ctx.taskSweeper;
    try {
      const run = sweeper.run();
      await until(() => cancels.length === 1, 5000, 'the first cancel to be asked');
      sweeper.stop();
      expect(await run).toEqual({ videos: 0, images: 0, holds: 0 });
    } finally {
      cancelHangs = false;
    }
    expect(cancels).toHaveLength(1);
    for (const id of [first, second]) {
      expect(await rowOf(id)).toEqual({ status: 'in_progress', errorCode: null });
      expect(await holdOf(server.db, id)).toMatchObject({ status: 'held' });
    }
  });
});
