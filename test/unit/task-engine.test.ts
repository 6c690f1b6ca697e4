/**
 * The task engine loop with a strict in-memory runner: claims in batches, reschedules a step that
 * asks for it, retries a failed step after the policy's delay (injected random), gives up after
 * the last retry, does nothing more when the lease is lost, and runs a rescheduled step when it is
 * due (on vitest's fake clock).
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import type { Fence, LeasedTasks } from '../../server/repositories/leased-tasks.ts';
import { retryDelay, type RetryPolicy } from '../../server/services/tasks/retry-policy.ts';
import { DONE, LeaseLost, later, type LeasedRow, type StepResult, type TaskRunner } from '../../server/services/tasks/task-runner.ts';
import { TaskEngine } from '../../server/workers/task-engine.ts';
import { until } from '../support/tasks.ts';

const log = createLogger('silent');
const policy: RetryPolicy = { maxRetries: 2, baseDelayMs: 1000, maxDelayMs: 8000 };

interface Row extends LeasedRow {
  dueAt: number;
  leased: boolean;
}

/** In-memory leases over `rows`, recording every call. */
function memoryLeases(rows: Row[]) {
  const calls: string[] = [];
  const leases = {
    async claimDue(_worker: string, limit: number) {
      const due = rows.filter((r) => !r.leased && r.dueAt <= Date.now()).slice(0, limit);
      for (const r of due) {
        r.attempt++;
        r.leased = true;
      }
      calls.push(`claim ${due.map((r) => r.id).join(',')}`);
      return due.map((r) => ({ ...r }));
    },
    async heartbeat() {
      return true;
    },
    async reschedule(fence: Fence, delayMs: number, opts: { failed?: boolean } = {}) {
      const row = rows.find((r) => r.id === fence.id && r.attempt === fence.attempt)!;
      row.leased = false;
      row.dueAt = Date.now() + delayMs;
      row.retries = opts.failed ? row.retries + 1 : 0;
      calls.push(`reschedule ${fence.id} ${delayMs}${opts.failed ? ' failed' : ''}`);
      return true;
    },
  };
  return { leases: leases as unknown as LeasedTasks<'videoTasks'>, calls };
}

let engine: TaskEngine<Row> | undefined;
afterEach(async () => engine?.stop());

function runner(rows: Row[], step: (task: Row) => Promise<StepResult>) {
  const { leases, calls } = memoryLeases(rows);
  const gaveUp: string[] = [];
  const r: TaskRunner<Row> = {
    name: 'test',
    leases,
    retry: policy,
    step: (task) => step(task),
    async giveUp(task) {
      gaveUp.push(task.id);
      const row = rows.find((x) => x.id === task.id)!;
      row.leased = false;
      row.dueAt = Infinity;
    },
  };
  return { runner: r, calls, gaveUp };
}

const row = (id: string): Row => ({ id, attempt: 0, retries: 0, dueAt: 0, leased: false });

describe('TaskEngine', () => {
  it('claims up to its concurrency and reschedules steps that ask to run later', async () => {
    const rows = [row('a'), row('b'), row('c')];
    const steps: string[] = [];
    const { runner: r, calls } = runner(rows, async (task) => {
      steps.push(task.id);
      return steps.filter((s) => s === task.id).length < 2 ? later(10) : DONE;
    });
    engine = new TaskEngine(r, log, { leaseMs: 1000, pollMs: 20, concurrency: 2 });
    engine.start();
    await until(() => steps.length === 6);
    expect(calls[0]).toBe('claim a,b');
    expect(calls.filter((c) => c.startsWith('reschedule'))).toEqual(expect.arrayContaining(['reschedule a 10', 'reschedule b 10', 'reschedule c 10']));
    expect(steps.sort()).toEqual(['a', 'a', 'b', 'b', 'c', 'c']);
  });

  it('retries a failing step after the policy delay, then gives up after the last retry', async () => {
    const rows = [row('x')];
    const { runner: r, calls, gaveUp } = runner(rows, async () => {
      throw new Error('upstream down');
    });
    // random 0: the delay is half the ceiling (500 ms, then 1000 ms); shortened below to keep the test quick.
    expect(retryDelay(policy, 0, () => 0)).toBe(500);
    expect(retryDelay(policy, 1, () => 0)).toBe(1000);
    expect(retryDelay(policy, 1, () => 1)).toBe(2000);
    expect(retryDelay(policy, 2, () => 0)).toBeUndefined();
    r.retry.baseDelayMs = 10;
    engine = new TaskEngine(r, log, { leaseMs: 1000, pollMs: 10, concurrency: 1, random: () => 0 });
    engine.start();
    await until(() => gaveUp.length === 1);
    expect(calls.filter((c) => c.startsWith('reschedule'))).toEqual(['reschedule x 5 failed', 'reschedule x 10 failed']);
    expect(gaveUp).toEqual(['x']);
    r.retry.baseDelayMs = 1000;
  });

  it('leaves a row alone when its step lost the lease', async () => {
    const rows = [row('y')];
    let steps = 0;
    const { runner: r, calls, gaveUp } = runner(rows, async () => {
      steps++;
      throw new LeaseLost('taken over');
    });
    engine = new TaskEngine(r, log, { leaseMs: 1000, pollMs: 10, concurrency: 1 });
    engine.start();
    await until(() => steps === 1);
    await new Promise((res) => setTimeout(res, 50));
    expect(calls.filter((c) => c.startsWith('reschedule'))).toEqual([]);
    expect(gaveUp).toEqual([]);
  });

  it('claims a step it rescheduled when it becomes due, not at the next period (on a fake clock)', async () => {
    vi.useFakeTimers({ toFake: ['Date', 'setTimeout', 'clearTimeout', 'setInterval', 'clearInterval'] });
    try {
      const rows = [row('p')];
      const stepAt: number[] = [];
      const { runner: r } = runner(rows, async () => {
        stepAt.push(Date.now());
        return stepAt.length < 3 ? later(100) : DONE;
      });
      // A one-minute period: only the engine's own due times can run the later steps within seconds.
      engine = new TaskEngine(r, log, { leaseMs: 1000, pollMs: 60_000, concurrency: 4 });
      engine.start();
      await vi.advanceTimersByTimeAsync(0);
      expect(stepAt).toHaveLength(1);
      await vi.advanceTimersByTimeAsync(99);
      expect(stepAt).toHaveLength(1); // not due yet
      await vi.advanceTimersByTimeAsync(100);
      expect(stepAt).toHaveLength(2);
      await vi.advanceTimersByTimeAsync(200);
      expect(stepAt).toHaveLength(3);
      // Each later step ran when it became due (plus the engine's small slack), never a period later.
      for (const gap of [stepAt[1]! - stepAt[0]!, stepAt[2]! - stepAt[1]!]) {
        expect(gap).toBeGreaterThanOrEqual(100);
        expect(gap).toBeLessThan(200);
      }
      await engine.stop();
      engine = undefined;
    } finally {
      vi.useRealTimers();
    }
  });

  it('backs off while claims fail because the database is away, and claims again once it is back (on a fake clock)', async () => {
    vi.useFakeTimers({ toFake: ['Date', 'setTimeout', 'clearTimeout', 'setInterval', 'clearInterval'] });
    try {
      const rows = [row('d')];
      const { runner: r } = runner(rows, async () => DONE);
      const claims: number[] = [];
      let databaseAway = true;
      const claimDue = r.leases.claimDue.bind(r.leases);
      r.leases.claimDue = (async (...args: Parameters<typeof claimDue>) => {
        claims.push(Date.now());
        if (databaseAway) throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED', syscall: 'connect' });
        return claimDue(...args);
      }) as typeof claimDue;
      // A 10 ms period: without the backoff it would claim 100 times a second against the outage.
      engine = new TaskEngine(r, log, { leaseMs: 1000, pollMs: 10, concurrency: 1 });
      engine.start();
      await vi.advanceTimersByTimeAsync(12_000);
      // At 0, then after 200, 400, 800, 1600, 3200 ms, then every 5 s: 7 claims in 12 s.
      expect(claims.length).toBe(7);
      expect(claims.slice(1).map((t, i) => t - claims[i]!)).toEqual([200, 400, 800, 1600, 3200, 5000]);
      databaseAway = false;
      await vi.advanceTimersByTimeAsync(5000);
      expect(rows[0]!.attempt).toBe(1); // claimed and run once the database is back
      await engine.stop();
      engine = undefined;
    } finally {
      vi.useRealTimers();
    }
  });

  it('leaves a step that met an unreachable database to its lease: no retry counted, never given up', async () => {
    const rows = [row('z')];
    let steps = 0;
    const { runner: r, calls, gaveUp } = runner(rows, async () => {
      steps++;
      throw Object.assign(new Error('terminating connection due to unexpected postmaster exit'), { code: '57P01', severity: 'FATAL' });
    });
    engine = new TaskEngine(r, log, { leaseMs: 1000, pollMs: 10, concurrency: 1 });
    engine.start();
    await until(() => steps === 1);
    await new Promise((res) => setTimeout(res, 50));
    expect(calls.filter((c) => c.startsWith('reschedule'))).toEqual([]);
    expect(gaveUp).toEqual([]);
    expect(rows[0]!.retries).toBe(0);
  });
});
