/**
 * A background image task (`Prefer: respond-async`) on an upstream that has no job to record (an
 * OpenAI-style call answers the images themselves) and whose worker stops during the upstream call.
 * The call may have made, and billed, the images upstream, and the next step makes it again: so such
 * a cut call counts as a retry (in the statement that gives back the member's slots), and past
 * IMAGE_RETRY.maxRetries the task fails with its hold released instead of calling once more (a
 * worker killed three times made four calls, each one a possible upstream bill). A wait for a free
 * member keeps that count. And a stopping engine (a graceful deploy) lets the call in flight end
 * and settles the task, instead of cutting it: one call, the task completed. While stopping no call
 * starts (no failover either; a step stopped before its call gives its member back, so nothing is
 * counted), and a lost lease still cuts the call.
 *
 * The worker's death is the row it leaves: its step never goes on (its call hangs, nothing aborts
 * it), the row names the member, its lease runs out; then another step claims the row.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import { LocalImageProvider } from '../../server/providers/local/local-image.provider.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { ImageProvider } from '../../server/providers/types.ts';
import { IMAGE_RETRY } from '../../server/services/image/image-runner.ts';
import { TaskEngine } from '../../server/workers/task-engine.ts';
import { createCustomer, createMember, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';

/** One upstream call: it ends only when the test answers or fails it (a dead worker's call ends never). */
interface Call {
  taskId: string;
  memberId: string;
  signal: AbortSignal;
  answer(): void;
  fail(err: unknown): void;
}
const calls: Call[] = [];
const local = new LocalImageProvider();
const provider: ImageProvider = {
  generate: (account, job, signal, events) =>
    new Promise<void>((resolve, reject) => {
      // Cut short as a fetch is: its signal's reason.
      signal.addEventListener('abort', () => reject(signal.reason), { once: true });
      calls.push({ taskId: job.taskId!, memberId: account.memberId, signal, answer: () => void local.generate(account, job, signal, events).then(resolve, reject), fail: reject });
    }),
};
const callsOf = (id: string) => calls.filter((c) => c.taskId === id);

let server: TestServer;
beforeAll(async () => {
  // No engines of the server's own: each test drives its steps, or its own engine.
  server = await startTestServer({ workers: false, overrides: { providers: { local: { image: provider } } } });
  await seedCatalog(server.db);
});
afterAll(async () => {
  // The calls of the dead steps end now; whatever those steps write is fenced by their old attempts.
  for (const call of calls) call.fail(new Error('the process is gone'));
  await server?.close();
});

const log = createLogger('silent');
const LEASE = { leaseMs: 1000, pollMs: 50, concurrency: 4 };
const rowOf = (id: string) => server.db.selectFrom('imageTasks').selectAll().where('id', '=', id).executeTakeFirstOrThrow();

async function startAsync(key: string): Promise<string> {
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', Prefer: 'respond-async' },
    body: JSON.stringify({ model: 'local-image-1', prompt: 'a lighthouse', n: 2 }),
  });
  expect(res.status).toBe(202);
  await res.arrayBuffer();
  return res.headers.get('x-task-id')!;
}

/** What a worker's claim does (TaskEngine): the row at its next attempt, leased. */
async function claim(id: string) {
  const runner = server.ctx.runners.image;
  const task = ((await runner.leases.claimDue('w_test', 50, 60_000)) as Parameters<typeof runner.step>[0][]).find((t) => t.id === id);
  expect(task, `task ${id} is due`).toBeDefined();
  return task!;
}

/** Leaves tasks a test is done with out of every later claim. */
const park = (...ids: string[]) => server.db.updateTable('imageTasks').set({ leaseOwner: 'w_parked', leaseExpiresAt: new Date(Date.now() + 3_600_000) }).where('id', 'in', ids).execute();

/** The worker died: its lease runs out, the row as it left it (naming the member of its call). */
const leaseRunsOut = (id: string) => server.db.updateTable('imageTasks').set({ leaseExpiresAt: new Date(Date.now() - 1000) }).where('id', '=', id).execute();

describe('a background image task whose worker dies during its upstream call', () => {
  it('makes the call at most 1 + IMAGE_RETRY.maxRetries times: each cut call is a retry, then the task fails and its hold is released', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const id = await startAsync(c.key);
    const runner = server.ctx.runners.image;
    // A dead worker's step: nothing aborts its call, nothing answers it, it writes nothing more.
    const never = new AbortController().signal;
    const tries = IMAGE_RETRY.maxRetries + 1;
    for (let k = 1; k <= tries; k++) {
      void runner.step(await claim(id), never, log, never).catch(() => undefined);
      await until(() => callsOf(id).length === k, 5000, `upstream call ${k}`);
      const row = await until(async () => {
        const r = await rowOf(id);
        return r.memberId !== null && r;
      }, 5000, 'the member of the call on the row');
      // Each cut call before this one was counted, in the statement that gave back its member.
      expect(row).toMatchObject({ status: 'processing', retries: k - 1 });
      if (k > 1) expect(row.lastError).toMatch(/stopped during its upstream call/);
      await leaseRunsOut(id);
    }

    // The next step does not call again: the upstream may have made the images each time.
    const last = runner.step(await claim(id), never, log, never);
    const another = until(() => callsOf(id).length > tries, 5000, 'another upstream call').catch(() => undefined);
    await Promise.race([last, another]);
    expect(callsOf(id)).toHaveLength(tries);
    const row = await rowOf(id);
    expect(row).toMatchObject({ status: 'failed', errorCode: 'upstream_error', delivered: 0, actualCredits: 0, retries: IMAGE_RETRY.maxRetries });
    expect(row.errorMessage).toContain(`made ${tries} times`);
    expect(row.errorMessage).toMatch(/credits were released/);
    expect(await holdOf(server.db, id)).toEqual({ amount: 2_000_000, status: 'released', captured: 0 });
    const account = await server.db.selectFrom('accounts').select('balance').where('id', '=', c.accountId).executeTakeFirstOrThrow();
    expect(account.balance).toBe(10_000_000);
    // The client's poll says so.
    const { data } = await server.client(c.key).GET('/v1/images/{task_id}', { params: { path: { task_id: id } } });
    expect(data).toMatchObject({ status: 'failed', error: { code: 'upstream_error' } });
  });

  it('keeps the count of a cut call while the task waits for a free member (a reschedule that is no failure)', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const member = await server.db.selectFrom('groupMembers').select('id').where('groupId', '=', c.groupId).executeTakeFirstOrThrow();
    await server.db.updateTable('groupMembers').set({ concurrencyLimit: 1 }).where('id', '=', member.id).execute();
    // Another task of the member holds its one slot (its worker alive: leased for a long while).
    const busy = await startAsync(c.key);
    await server.db.updateTable('imageTasks').set({ memberId: member.id, memberSlots: 1, attempt: 1, leaseOwner: 'w_other', leaseExpiresAt: new Date(Date.now() + 3_600_000) }).where('id', '=', busy).execute();
    // This one's worker died during its call on that member.
    const id = await startAsync(c.key);
    await server.db.updateTable('imageTasks').set({ memberId: member.id, memberSlots: 1, attempt: 1, leaseOwner: 'w_dead', leaseExpiresAt: new Date(Date.now() - 1000) }).where('id', '=', id).execute();

    const engine = new TaskEngine(server.ctx.runners.image, log, LEASE);
    engine.start();
    try {
      // Counted, its member given back; the member is full: the task waits its turn (handed back, not leased).
      const waiting = await until(async () => {
        const r = await rowOf(id);
        return r.memberId === null && r.leaseOwner === null && r;
      }, 10_000, 'the task to wait for a free member');
      expect(waiting).toMatchObject({ status: 'processing', retries: 1, lastError: expect.stringMatching(/stopped during its upstream call/) });
    } finally {
      await engine.stop();
    }
    expect(callsOf(id)).toHaveLength(0);
    expect((await rowOf(id)).retries).toBe(1);
    await park(busy, id);
  });
});

describe('a background image task whose engine stops during its upstream call', () => {
  it('lets the call finish and completes the task: one upstream call, its images charged', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const id = await startAsync(c.key);
    const engine = new TaskEngine(server.ctx.runners.image, log, LEASE);
    engine.start();
    const call = await until(() => callsOf(id)[0], 5000, 'the upstream call');
    let stopped = false;
    const stopping = engine.stop().then(() => (stopped = true));
    // The stop waits for the answer instead of cutting the call short (its lease kept meanwhile).
    await new Promise((r) => setTimeout(r, 500));
    expect(call.signal.aborted).toBe(false);
    expect(stopped).toBe(false);
    call.answer();
    await stopping;
    const row = await rowOf(id);
    expect(row).toMatchObject({ status: 'completed', delivered: 2, retries: 0, leaseOwner: null });
    expect(callsOf(id)).toHaveLength(1);
    expect(await holdOf(server.db, id)).toEqual({ amount: 2_000_000, status: 'captured', captured: 2_000_000 });
  });

  it('fails over to no other member while stopping: a call answered with a failure leaves the task for the next worker', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    await createMember(server.db, c.groupId, { name: 'spare' });
    const id = await startAsync(c.key);
    const engine = new TaskEngine(server.ctx.runners.image, log, LEASE);
    engine.start();
    const call = await until(() => callsOf(id)[0], 5000, 'the upstream call');
    const stopping = engine.stop();
    // Answered (not maybe accepted): a running worker would try the spare member.
    call.fail(new ProviderError('retryable', 'upstream answered 503', { upstreamStatus: 503 }));
    await stopping;
    expect(callsOf(id)).toHaveLength(1);
    // Its member given back (the call was answered: nothing to count), the task still to do.
    expect(await rowOf(id)).toMatchObject({ status: 'processing', memberId: null, retries: 0 });
    await park(id);
  });

  it('makes no call from a step that starts once the stop has fired, and leaves no member on the row: nothing to count next time', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const id = await startAsync(c.key);
    const runner = server.ctx.runners.image;
    // What TaskEngine.run passes once stop() has fired: the step's signal aborted, the lease-lost one not.
    const stopped = new AbortController();
    stopped.abort(new Error('worker stopping'));
    await expect(runner.step(await claim(id), stopped.signal, log, new AbortController().signal)).rejects.toThrow(/stopped/);
    expect(callsOf(id)).toHaveLength(0);
    expect(await rowOf(id)).toMatchObject({ status: 'processing', memberId: null, retries: 0 });
    // Its next step calls once, uncounted.
    await leaseRunsOut(id);
    void runner.step(await claim(id), new AbortController().signal, log, new AbortController().signal);
    const call = await until(() => callsOf(id)[0], 5000, 'the upstream call');
    call.answer();
    const done = await until(async () => {
      const r = await rowOf(id);
      return r.status !== 'processing' && r;
    }, 5000, 'the task to complete');
    expect(done).toMatchObject({ status: 'completed', delivered: 2, retries: 0 });
  });

  it('still cuts the call when another worker took the lease over', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const id = await startAsync(c.key);
    const engine = new TaskEngine(server.ctx.runners.image, log, LEASE);
    engine.start();
    try {
      const call = await until(() => callsOf(id)[0], 5000, 'the upstream call');
      await server.db.updateTable('imageTasks').set({ leaseOwner: 'w_other', leaseExpiresAt: new Date(Date.now() + 3_600_000) }).where('id', '=', id).execute();
      await until(() => call.signal.aborted, 5000, 'the call to be cut');
    } finally {
      await engine.stop();
    }
    expect(callsOf(id)).toHaveLength(1);
    expect((await rowOf(id)).leaseOwner).toBe('w_other');
    await park(id);
  });
});
