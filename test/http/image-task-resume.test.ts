/**
 * A background image task (`Prefer: respond-async`) on a job-queue upstream (fal, Kling; Replicate
 * through the same kit loop) whose step stops while its upstream job runs (the engine stopping, a
 * crash, a lost lease): the job was recorded as it was accepted (`image_tasks.upstream_job`), is
 * left running, and the task's next step collects that same job on the same member instead of
 * submitting (and paying the upstream for) a second one. The engines are driven by the test: one
 * is stopped mid-job, another takes the task over once the lease has run out. So does a step that
 * fails in passing while its recorded job is still there (a finished job whose output the CDN fails
 * to serve, a Kling task slower than the adapter's wait: Kling cannot cancel): the next try collects
 * it. A step cut during a Kling submit (its worker died), before the task was recorded, finds it by
 * its external_task_id (the task's id) on the next step; a stop during the submit waits for its
 * answer instead, and the task is recorded. A resumed job whose outputs are gone is given
 * up and the next try submits afresh (on Kling, under the next external id: Kling keeps the first).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { createLogger } from '../../server/logger.ts';
import { FalImageProvider } from '../../server/providers/fal/fal-image.provider.ts';
import { KlingImageProvider } from '../../server/providers/kling/kling-image.provider.ts';
import { TaskEngine } from '../../server/workers/task-engine.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { startKlingFake, type KlingFake } from '../fakes/kling.ts';
import { createAccount, createApiKey, createGroup } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';

/** A job long enough to stop its step while it runs, short enough for the resumed wait (FAL_WAIT_MS, KLING_WAIT_MS). */
const SLOW_MS = 2500;
const FAL_WAIT_MS = 3500;
const KLING_WAIT_MS = 3500;
/** A Kling task longer than the adapter's wait, shorter than two. */
const LATE_MS = 5000;
const slow = (prompt: string) => (prompt.includes('[forever]') ? ('never' as const) : prompt.includes('[slow]') ? SLOW_MS : prompt.includes('[late]') ? LATE_MS : undefined);

let server: TestServer;
let fal: FalFake;
let kling: KlingFake;

beforeAll(async () => {
  fal = await startFalFake({ apiKeys: ['fal-a:secret'], queueMs: 50, jobDurationMs: 200, durationFor: slow });
  kling = await startKlingFake({ accounts: [{ accessKey: 'ak-a', secretKey: 'sk-a-secret' }], jobDurationMs: 200, durationFor: slow });
  // No engines of the server's own: each test runs (and stops) its own.
  server = await startTestServer({
    workers: false,
    overrides: { providers: { fal: { image: new FalImageProvider(50, FAL_WAIT_MS) }, kling: { image: new KlingImageProvider({ pollIntervalMs: 50, timeoutMs: KLING_WAIT_MS }) } } },
  });
  for (const id of ['fal/flux-dev-fal', 'kling/kling-v3']) expect((await server.admin().POST('/admin/v1/models', { body: findCatalogDefinition(id)!.model })).response.status, id).toBe(201);
});
afterAll(async () => {
  await server?.close();
  await fal?.close();
  await kling?.close();
});

async function customer(provider: 'fal' | 'kling') {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const member: { base_url: string; credentials: Record<string, string>; models: string[] } =
    provider === 'fal'
      ? { base_url: fal.url, credentials: { api_key: 'fal-a:secret' }, models: ['flux-dev-fal'] }
      : { base_url: kling.url, credentials: { access_key: 'ak-a', secret_key: 'sk-a-secret' }, models: ['kling-v3'] };
  const { response } = await server.admin().POST('/admin/v1/groups/{group_id}/members', { params: { path: { group_id: group.id } }, body: { name: 'a', provider, priority: 0, ...member } });
  expect(response.status).toBe(201);
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { key: key.key };
}

function engine() {
  const e = new TaskEngine(server.ctx.runners.image, createLogger('silent'), { leaseMs: 1000, pollMs: 50, concurrency: 4 });
  e.start();
  return e;
}

async function startAsync(key: string, model: string, prompt: string): Promise<string> {
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', Prefer: 'respond-async' },
    body: JSON.stringify({ model, prompt, size: '1024x1024' }),
  });
  expect(res.status).toBe(202);
  await res.arrayBuffer();
  return res.headers.get('x-task-id')!;
}

const rowOf = (id: string) => server.db.selectFrom('imageTasks').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
/** The task's row once it is no longer processing. */
const finished = (id: string, timeoutMs: number) =>
  until(async () => {
    const row = await rowOf(id);
    return row.status !== 'processing' && row;
  }, timeoutMs, 'the task to finish');

describe('a background image task whose step stops while its upstream job runs', () => {
  it('fal: leaves the queued request running and collects that same request on its next step', async () => {
    const c = await customer('fal');
    const id = await startAsync(c.key, 'flux-dev-fal', `a lighthouse [slow] ${Date.now()}`);
    const first = engine();
    const submitted = await until(() => {
      const jobs = [...fal.jobs.values()].filter((j) => String(j.input.prompt).includes('lighthouse'));
      return jobs.length > 0 && jobs;
    }, 10_000, 'the fal request to be submitted');
    await until(async () => (await rowOf(id)).upstreamJob !== null, 5000, 'the upstream job to be recorded');
    // The process stops while fal runs the request.
    await first.stop();
    const stopped = await rowOf(id);
    expect(stopped).toMatchObject({ status: 'processing', memberId: expect.any(String) });
    expect(stopped.upstreamJob).toEqual(expect.stringContaining(submitted[0]!.id));
    expect(submitted[0]!.cancelled).toBe(false);

    const second = engine();
    try {
      const done = await finished(id, 15_000);
      expect(done).toMatchObject({ status: 'completed', delivered: 1, upstreamJob: stopped.upstreamJob });
      // One request, collected: none cancelled, none submitted again.
      const jobs = [...fal.jobs.values()].filter((j) => String(j.input.prompt).includes('lighthouse'));
      expect(jobs.map((j) => [j.id, j.cancelled])).toEqual([[submitted[0]!.id, false]]);
      expect(await holdOf(server.db, id)).toMatchObject({ status: 'captured' });
      // The operator sees the job the task ran upstream.
      const story = await server.admin().GET('/admin/v1/tasks/{task_id}', { params: { path: { task_id: id } } });
      expect(story.data?.upstream_job_id).toContain(submitted[0]!.id);
    } finally {
      await second.stop();
    }
  });

  it('Kling: collects the image task its first step created instead of creating another', async () => {
    const c = await customer('kling');
    const id = await startAsync(c.key, 'kling-v3', `a harbour [slow] ${Date.now()}`);
    const first = engine();
    await until(async () => (await rowOf(id)).upstreamJob !== null, 10_000, 'the Kling task to be recorded');
    await first.stop();
    const created = [...kling.tasks.values()].filter((t) => t.kind === 'image' && t.prompt.includes('harbour'));
    expect(created).toHaveLength(1);
    expect((await rowOf(id)).upstreamJob).toBe(created[0]!.taskId);

    const second = engine();
    try {
      const done = await finished(id, 15_000);
      expect(done).toMatchObject({ status: 'completed', delivered: 1 });
      expect([...kling.tasks.values()].filter((t) => t.kind === 'image' && t.prompt.includes('harbour'))).toHaveLength(1);
    } finally {
      await second.stop();
    }
  });

  it('Kling: a step cut during its submit (its worker died), before the task was recorded, finds that task by its external_task_id on the next step', async () => {
    const c = await customer('kling');
    const id = await startAsync(c.key, 'kling-v3', `a quay ${Date.now()}`);
    const createdOf = () => [...kling.tasks.values()].filter((t) => t.kind === 'image' && t.prompt.includes('quay'));
    // Kling creates the task at once and answers long after the step was cut.
    kling.delayAnswerNext('image-submit', 10_000);
    const first = engine();
    await until(() => createdOf().length > 0, 10_000, 'the Kling task to be created');
    // The worker is gone (a stop would wait for the answer and record the task): its lease is
    // another's now, which cuts the submit, and then runs out.
    await server.db.updateTable('imageTasks').set({ leaseOwner: 'w_dead', leaseExpiresAt: new Date(Date.now() + 60_000) }).where('id', '=', id).execute();
    await first.stop();
    expect(await rowOf(id)).toMatchObject({ status: 'processing', upstreamJob: null, memberId: expect.any(String) });
    await server.db.updateTable('imageTasks').set({ leaseExpiresAt: new Date(Date.now() - 1000) }).where('id', '=', id).execute();

    const second = engine();
    try {
      const done = await finished(id, 15_000);
      const created = createdOf();
      expect(created.map((t) => t.externalTaskId)).toEqual([id]);
      // The cut submit counts as a try (ImageRunner.step): Kling found it, nothing was paid twice.
      expect(done).toMatchObject({ status: 'completed', delivered: 1, upstreamJob: created[0]!.taskId, retries: 1 });
      expect(await holdOf(server.db, id)).toMatchObject({ status: 'captured' });
    } finally {
      await second.stop();
    }
  });

  it('Kling: a stop during its submit waits for the answer and records the task, which the next step collects: one Kling task, no retry', async () => {
    const c = await customer('kling');
    const id = await startAsync(c.key, 'kling-v3', `a jetty ${Date.now()}`);
    const createdOf = () => [...kling.tasks.values()].filter((t) => t.kind === 'image' && t.prompt.includes('jetty'));
    kling.delayAnswerNext('image-submit', 1000);
    const first = engine();
    await until(() => createdOf().length > 0, 10_000, 'the Kling task to be created');
    await first.stop();
    expect(await rowOf(id)).toMatchObject({ status: 'processing', upstreamJob: createdOf()[0]!.taskId });

    const second = engine();
    try {
      const done = await finished(id, 15_000);
      expect(createdOf()).toHaveLength(1);
      expect(done).toMatchObject({ status: 'completed', delivered: 1, upstreamJob: createdOf()[0]!.taskId, retries: 0 });
    } finally {
      await second.stop();
    }
  });
});

describe('a background image task whose step fails in passing while its recorded job is still there', () => {
  it('Kling: a finished task whose image the CDN fails to serve is collected by the next try, not created again', async () => {
    const c = await customer('kling');
    const createdOf = () => [...kling.tasks.values()].filter((t) => t.kind === 'image' && t.prompt.includes('beacon'));
    // Every download attempt of the first try (three) meets a 503.
    kling.serverErrorNext('cdn', 503, 3);
    const id = await startAsync(c.key, 'kling-v3', `a beacon ${Date.now()}`);
    const e = engine();
    try {
      const retried = await until(async () => {
        const row = await rowOf(id);
        return row.retries === 1 && row;
      }, 15_000, 'the first retry to be scheduled');
      // The task stays recorded on its member for the next try.
      expect(retried).toMatchObject({ status: 'processing', upstreamJob: createdOf()[0]!.taskId, memberId: expect.any(String) });
      const done = await finished(id, 15_000);
      expect(done).toMatchObject({ status: 'completed', delivered: 1 });
      expect(createdOf()).toHaveLength(1);
      expect(await holdOf(server.db, id)).toMatchObject({ status: 'captured' });
    } finally {
      await e.stop();
    }
  });

  it('Kling: a task slower than the adapter\'s wait is waited for again by the next try, not created again', async () => {
    const c = await customer('kling');
    const id = await startAsync(c.key, 'kling-v3', `a dune [late] ${Date.now()}`);
    const createdOf = () => [...kling.tasks.values()].filter((t) => t.kind === 'image' && t.prompt.includes('dune'));
    const e = engine();
    try {
      const retried = await until(async () => {
        const row = await rowOf(id);
        return row.retries === 1 && row;
      }, 15_000, 'the first retry to be scheduled');
      // Kling cannot cancel it: it stays recorded on its member for the next try.
      expect(retried).toMatchObject({ status: 'processing', upstreamJob: createdOf()[0]!.taskId, memberId: expect.any(String) });
      const done = await finished(id, 20_000);
      expect(done).toMatchObject({ status: 'completed', delivered: 1, upstreamJob: createdOf()[0]!.taskId });
      expect(createdOf()).toHaveLength(1);
    } finally {
      await e.stop();
    }
  }, 30_000);

  it('fal: a completed request whose output the CDN fails to serve is collected by the next try: one request, never cancelled', async () => {
    const c = await customer('fal');
    fal.serverErrorNext('cdn', 3);
    const id = await startAsync(c.key, 'flux-dev-fal', `an estuary ${Date.now()}`);
    const e = engine();
    try {
      const done = await finished(id, 15_000);
      expect(done).toMatchObject({ status: 'completed', delivered: 1 });
      expect(done.retries).toBeGreaterThanOrEqual(1);
      const jobs = [...fal.jobs.values()].filter((j) => String(j.input.prompt).includes('estuary'));
      expect(jobs.map((j) => j.cancelled)).toEqual([false]);
      expect(await holdOf(server.db, id)).toMatchObject({ status: 'captured' });
    } finally {
      await e.stop();
    }
  });
});

describe('a background image task whose job is given up on', () => {
  it('a job given up on in passing (cancelled) is forgotten: the next try submits afresh', async () => {
    const c = await customer('fal');
    const id = await startAsync(c.key, 'flux-dev-fal', `a meadow [forever] ${Date.now()}`);
    const e = engine();
    try {
      await until(async () => (await rowOf(id)).upstreamJob !== null, 10_000, 'the upstream job to be recorded');
      // The request never finishes within the wait: cancelled, and the step fails in passing.
      const retried = await until(async () => {
        const row = await rowOf(id);
        return row.retries === 1 && row;
      }, 15_000, 'the first retry to be scheduled');
      expect(retried).toMatchObject({ status: 'processing', upstreamJob: null, memberId: null });
      const jobs = [...fal.jobs.values()].filter((j) => String(j.input.prompt).includes('meadow'));
      await until(() => jobs[0]!.cancelled, 5000, 'the request to be cancelled');
    } finally {
      await e.stop();
    }
  });

  it('a resumed job whose outputs the upstream no longer has is given up: the next try submits afresh and completes', async () => {
    const c = await customer('fal');
    const id = await startAsync(c.key, 'flux-dev-fal', `a windmill [slow] ${Date.now()}`);
    const first = engine();
    await until(async () => (await rowOf(id)).upstreamJob !== null, 10_000, 'the upstream job to be recorded');
    await first.stop();
    const jobsOf = () => [...fal.jobs.values()].filter((j) => String(j.input.prompt).includes('windmill'));
    // Collected too late: its links have expired (fal's CDN answers 403).
    fal.expire(jobsOf()[0]!.id);
    const second = engine();
    try {
      const done = await finished(id, 30_000);
      expect(done, JSON.stringify({ errorCode: done.errorCode, errorMessage: done.errorMessage, lastError: done.lastError, retries: done.retries })).toMatchObject({ status: 'completed', delivered: 1 });
      expect(jobsOf()).toHaveLength(2);
    } finally {
      await second.stop();
    }
  }, 40_000);

  it('Kling: a resumed task whose links the CDN no longer serves is given up: the next try creates a fresh task under the next external id and completes', async () => {
    const c = await customer('kling');
    const id = await startAsync(c.key, 'kling-v3', `a pagoda [slow] ${Date.now()}`);
    const tasksOf = () => [...kling.tasks.values()].filter((t) => t.kind === 'image' && t.prompt.includes('pagoda'));
    const first = engine();
    await until(async () => (await rowOf(id)).upstreamJob !== null, 10_000, 'the Kling task to be recorded');
    await first.stop();
    // Collected too late: its links have expired (Kling's CDN answers 403). Kling keeps its
    // external_task_id (the task's id): the fresh task cannot be created under it again.
    kling.expire(tasksOf()[0]!.taskId);
    const second = engine();
    try {
      const done = await finished(id, 30_000);
      expect(done, JSON.stringify({ errorCode: done.errorCode, errorMessage: done.errorMessage, lastError: done.lastError, retries: done.retries })).toMatchObject({ status: 'completed', delivered: 1 });
      const tasks = tasksOf();
      expect(tasks.map((t) => t.externalTaskId)).toEqual([id, `${id}-2`]);
      expect(done.upstreamJob).toBe(tasks[1]!.taskId);
      expect(await holdOf(server.db, id)).toMatchObject({ status: 'captured' });
    } finally {
      await second.stop();
    }
  }, 40_000);

  it('a recorded job of a task the sweeper fails past its lifetime is cancelled upstream', async () => {
    const c = await customer('fal');
    const id = await startAsync(c.key, 'flux-dev-fal', `a glacier [forever] ${Date.now()}`);
    const first = engine();
    await until(async () => (await rowOf(id)).upstreamJob !== null, 10_000, 'the upstream job to be recorded');
    await first.stop();
    const job = [...fal.jobs.values()].find((j) => String(j.input.prompt).includes('glacier'))!;
    expect(job.cancelled).toBe(false);
    // Past its lifetime, and its lease over: the task sweeper ends it.
    await server.db.updateTable('imageTasks').set({ createdAt: new Date(Date.now() - 10 * 3600_000), leaseExpiresAt: new Date(Date.now() - 1000) }).where('id', '=', id).execute();
    await server.ctx.taskSweeper.run();
    expect(await rowOf(id)).toMatchObject({ status: 'failed', errorCode: 'timeout' });
    expect(await holdOf(server.db, id)).toMatchObject({ status: 'released', captured: 0 });
    await until(() => job.cancelled, 5000, 'the fal request to be cancelled');
  });
});
