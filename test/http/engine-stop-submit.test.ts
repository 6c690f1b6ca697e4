/**
 * A stopping worker and the work it has in flight upstream. A video submit the upstream accepted
 * while the engine stopped (a rolling deploy) is answered and its job id saved before the stop
 * ends: one upstream job, which the next engine polls — never a second submit, which an upstream
 * without idempotency keys (Ark, MiniMax, DashScope) would bill as a second job. A lease another
 * worker took over still cuts the submit short. And a task sweeper stopped while it takes its lease
 * claims nothing.
 */
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { VideoProvider } from '../../server/providers/types.ts';
import type { SweeperRepository } from '../../server/repositories/sweeper.repository.ts';
import type { TaskSweepRepository } from '../../server/repositories/task-sweep.repository.ts';
import { LeaseLost } from '../../server/services/tasks/task-runner.ts';
import { TaskSweeper, type TaskSweeperDeps } from '../../server/services/tasks/task-sweeper.ts';
import { TaskEngine, type StepOutcome } from '../../server/workers/task-engine.ts';
import { createCustomer, createMember, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until, waitVideoFinished } from '../support/tasks.ts';

/** What the fake upstream does with a submit: `submits` records each one it received (and billed). */
let onSubmit: (taskId: string, signal: AbortSignal) => Promise<string>;
const submits: string[] = [];
const polls: string[] = [];
const provider: VideoProvider = {
  pollIntervalMs: 0,
  submit: (_account, job, signal) => {
    submits.push(job.taskId);
    return onSubmit(job.taskId, signal);
  },
  poll: async (_account, jobId) => {
    polls.push(jobId);
    return { state: 'succeeded', output: {} };
  },
  download: async () => ({ stream: Readable.from([Buffer.from('mp4 bytes')]), contentType: 'video/mp4', bytes: 9 }),
  // An upstream that never answers a cancel: it ends only when its signal aborts.
  cancel: (_account, _jobId, signal) => aborted(signal),
};

/** Rejects with the signal's reason once it aborts: what upstreamFetch does, even after the body went out. */
function aborted(signal: AbortSignal): Promise<never> {
  return new Promise<never>((_, reject) => signal.addEventListener('abort', () => reject(signal.reason), { once: true }));
}

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({ workers: false, env: { TASK_LEASE_MS: '1000' }, overrides: { providers: { local: { video: provider } } } });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

const LEASE = { leaseMs: 1000, pollMs: 50, concurrency: 4 };

async function createVideo(key: string): Promise<string> {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `stop-${Date.now()}-${Math.random()}`, prompt: 'a lighthouse', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' }),
  });
  expect(res.status).toBe(202);
  return ((await res.json()) as { id: string }).id;
}

const rowOf = (id: string) => server.db.selectFrom('videoTasks').selectAll().where('id', '=', id).executeTakeFirstOrThrow();

describe('a worker stopping while a video submit is in flight', () => {
  it('lets the submit the upstream accepted finish and saves its job id: one upstream job, polled by the next engine', async () => {
    const { key } = await createCustomer(server.db, { balance: 100 });
    let arrived!: () => void;
    const arrival = new Promise<void>((r) => (arrived = r));
    let answer!: () => void;
    const answered = new Promise<void>((r) => (answer = r));
    let submitSignal: AbortSignal | undefined;
    onSubmit = async (_taskId, signal) => {
      // The upstream created the job (billed); its answer comes once the test lets it.
      submitSignal = signal;
      arrived();
      await Promise.race([answered, aborted(signal)]);
      return `job-${submits.length}`;
    };
    const id = await createVideo(key);
    const first = new TaskEngine(server.ctx.runners.video, server.ctx.log, LEASE);
    first.start();
    await arrival;
    let stopped = false;
    const stopping = first.stop().then(() => (stopped = true));
    // The stop waits for the answer instead of cutting the call short.
    await new Promise((r) => setTimeout(r, 100));
    expect(submitSignal!.aborted).toBe(false);
    expect(stopped).toBe(false);
    answer();
    await stopping;
    const row = await rowOf(id);
    expect(row.upstreamJobId).toBe('job-1');
    expect(row.leaseOwner).toBeNull();

    const second = new TaskEngine(server.ctx.runners.video, server.ctx.log, LEASE);
    second.start();
    try {
      const { task } = await waitVideoFinished(server, key, id);
      expect(task.status).toBe('completed');
    } finally {
      await second.stop();
    }
    expect(submits.filter((t) => t === id)).toHaveLength(1);
    expect(polls).toContain('job-1');
  });

  it('starts no submit on another member once it is stopping: a failed one is left for the next worker', async () => {
    const { key, groupId } = await createCustomer(server.db, { balance: 100 });
    await createMember(server.db, groupId, { name: 'spare' });
    let arrived!: () => void;
    const arrival = new Promise<void>((r) => (arrived = r));
    let answer!: () => void;
    const answered = new Promise<void>((r) => (answer = r));
    onSubmit = async () => {
      arrived();
      await answered;
      // Answered (not maybe accepted): a running worker would fail over to the spare member.
      throw new ProviderError('retryable', 'upstream answered 503', { upstreamStatus: 503 });
    };
    const id = await createVideo(key);
    const engine = new TaskEngine(server.ctx.runners.video, createLogger('silent'), LEASE);
    engine.start();
    await arrival;
    const stopping = engine.stop();
    answer();
    await stopping;
    // The spare member was not asked: a submit started now the stop's deadline could cut (billed,
    // and submitted again by the next worker on an upstream without idempotency keys).
    expect(submits.filter((t) => t === id)).toHaveLength(1);
    expect((await rowOf(id)).upstreamJobId).toBeNull();
  });

  it('sends no submit at all from a step that starts once the stop has fired (claimed in the same pass), nor a resubmit', async () => {
    const { key } = await createCustomer(server.db, { balance: 100 });
    onSubmit = async () => 'job-never';
    const id = await createVideo(key);
    const runner = server.ctx.runners.video;
    const claimed = (await runner.leases.claimDue('w_test', 50, 60_000)) as Parameters<typeof runner.step>[0][];
    const task = claimed.find((t) => t.id === id)!;
    // What TaskEngine.run passes once stop() has fired: the step's signal aborted, the lease-lost one not.
    const stopped = new AbortController();
    stopped.abort(new Error('worker stopping'));
    const lost = new AbortController();
    await expect(runner.step(task, stopped.signal, createLogger('silent'), lost.signal)).rejects.toThrow(/not submitting/);
    expect(submits.filter((t) => t === id)).toHaveLength(0);
    expect(await rowOf(id)).toMatchObject({ upstreamJobId: null, submitStartedAt: null });

    // A task whose earlier submit may have reached its member: the resubmit waits for the next worker too.
    const member = (await server.db.selectFrom('groupMembers').select('id').limit(1).executeTakeFirstOrThrow()).id;
    await expect(runner.step({ ...task, submitStartedAt: new Date(), memberId: member }, stopped.signal, createLogger('silent'), lost.signal)).rejects.toThrow(/not submitting/);
    expect(submits.filter((t) => t === id)).toHaveLength(0);
  });

  it('still cuts the submit short when another worker took the lease over', async () => {
    const { key } = await createCustomer(server.db, { balance: 100 });
    let arrived!: () => void;
    const arrival = new Promise<void>((r) => (arrived = r));
    let cutWith: unknown;
    onSubmit = async (_taskId, signal) => {
      arrived();
      return aborted(signal).catch((err: unknown) => {
        cutWith = err;
        throw err;
      });
    };
    const id = await createVideo(key);
    const outcomes: StepOutcome[] = [];
    const engine = new TaskEngine(server.ctx.runners.video, createLogger('silent'), { ...LEASE, onStep: (o) => outcomes.push(o) });
    engine.start();
    try {
      await arrival;
      // Another worker holds the row now (for long enough that this engine cannot claim it back).
      await server.db.updateTable('videoTasks').set({ leaseOwner: 'w_other', leaseExpiresAt: new Date(Date.now() + 60_000) }).where('id', '=', id).execute();
      await until(() => outcomes.length > 0, 5000, 'the step to end');
    } finally {
      await engine.stop();
    }
    expect(cutWith).toBeInstanceOf(LeaseLost);
    expect(outcomes).toEqual(['lost']);
    const row = await rowOf(id);
    expect(row.upstreamJobId).toBeNull();
    expect(row.leaseOwner).toBe('w_other');
  });
});

describe('the task sweeper', () => {
  it('claims nothing when stopped while it takes its lease', async () => {
    const calls: string[] = [];
    let taken!: (lease: { cursor: string | null }) => void;
    const sweepers = {
      take: () => {
        calls.push('take');
        return new Promise<{ cursor: string | null }>((r) => (taken = r));
      },
      save: async (_name: string, _owner: string, _cursor: string | null, release: boolean) => void calls.push(`save release=${release}`),
    } as unknown as SweeperRepository;
    const repo = {
      claimOverdueVideos: async () => (calls.push('claim videos'), []),
      claimOverdueImages: async () => (calls.push('claim images'), []),
      strandedHolds: async () => (calls.push('stranded holds'), []),
    } as unknown as TaskSweepRepository;
    const sweeper = new TaskSweeper({ sweepers, repo, log: createLogger('silent'), taskMaxLifetimeSeconds: 3600 } as unknown as TaskSweeperDeps);
    const run = sweeper.run();
    await until(() => calls.includes('take'));
    sweeper.stop();
    taken({ cursor: null });
    expect(await run).toBeUndefined();
    // The lease it took is given back at once, so that another instance runs the next sweep.
    expect(calls).toEqual(['take', 'save release=true']);
  });
});

describe('a task past its deadline whose upstream never answers the cancel', () => {
  it('is failed and refunded once the cancel has had its time (15 s), not held for as long as the upstream is silent', async () => {
    const { key } = await createCustomer(server.db, { balance: 100 });
    onSubmit = async () => `job-silent-${Date.now()}`;
    const id = await createVideo(key);
    const engine = new TaskEngine(server.ctx.runners.video, createLogger('silent'), { ...LEASE, leaseMs: 60_000 });
    engine.start();
    try {
      await until(async () => (await rowOf(id)).upstreamJobId ?? undefined, 10_000, 'the job id');
      await server.db.updateTable('videoTasks').set({ deadlineAt: new Date(Date.now() - 1000), nextRunAt: new Date() }).where('id', '=', id).execute();
      await until(async () => ((await rowOf(id)).status === 'failed' ? true : undefined), 25_000, 'the refund');
    } finally {
      await engine.stop();
    }
  }, 40_000);
});
