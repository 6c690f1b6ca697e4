/**
 * A lease no heartbeat can confirm (this instance cannot reach PostgreSQL, or its heartbeats hang):
 * its step's signal aborts before the lease runs out, since another instance may claim the row the
 * moment it does, and a poll, a download or a webhook send must never run on two instances at once.
 * Its `lost` signal does not (a submit that may have reached the upstream goes on to save its job
 * id, fenced). A heartbeat that finds the row taken over aborts both at once; heartbeats that keep
 * confirming keep the work going past the lease's length.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import { fenceOf, type LeasedTasks } from '../../server/repositories/leased-tasks.ts';
import { keepLease } from '../../server/services/tasks/lease.ts';
import { LeaseLost } from '../../server/services/tasks/task-runner.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { createLocalVideo } from '../support/tasks.ts';

let s: TestServer;
beforeAll(async () => {
  s = await startTestServer({ workers: false });
  await seedCatalog(s.db);
});
afterAll(async () => s?.close());

const LEASE_MS = 600;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function claimed(prompt: string) {
  const c = await createCustomer(s.db, { balance: 100 });
  const id = await createLocalVideo(s, c.key, prompt);
  const leases = s.ctx.runners.video.leases as unknown as LeasedTasks<'videoTasks'>;
  const [row] = await leases.claimDue('instance-a', 1, LEASE_MS);
  expect(row?.id).toBe(id);
  return { leases, row: row! };
}

/** Puts the row out of reach of the next test's claim. */
const park = (id: string) => s.db.updateTable('videoTasks').set({ leaseOwner: 'parked', leaseExpiresAt: new Date(Date.now() + 3_600_000) }).where('id', '=', id).execute();

/** Instance A's view of the database with every heartbeat going to `heartbeat` instead. */
function viewWith(leases: LeasedTasks<'videoTasks'>, heartbeat: LeasedTasks<'videoTasks'>['heartbeat']): LeasedTasks<'videoTasks'> {
  const view = Object.create(leases) as LeasedTasks<'videoTasks'>;
  view.heartbeat = heartbeat;
  return view;
}

describe('a lease no heartbeat confirms', () => {
  for (const [what, heartbeat] of [
    ['fail', async () => Promise.reject(new Error('connect ECONNREFUSED'))],
    ['hang', () => new Promise<boolean>(() => undefined)],
  ] as const) {
    it(`stops the step before it runs out when heartbeats ${what}, before another instance can claim the row`, async () => {
      const { leases, row } = await claimed(`heartbeats ${what}`);
      const lease = keepLease(viewWith(leases, heartbeat), fenceOf(row), 'instance-a', LEASE_MS, createLogger('silent'));
      try {
        await sleep(LEASE_MS + 50);
        expect(lease.signal.aborted).toBe(true);
        expect(lease.signal.reason).toBeInstanceOf(LeaseLost);
        expect(lease.lost.aborted).toBe(false);
        // The row is free for another instance only now: A had stopped first.
        const [taken] = await leases.claimDue('instance-b', 1, LEASE_MS);
        expect(taken?.id).toBe(row.id);
      } finally {
        lease.release();
        await park(row.id);
      }
    });
  }

  it('is kept while heartbeats confirm it, well past its length; lost at once when one finds the row taken over', async () => {
    const { leases, row } = await claimed('heartbeats confirm');
    const lease = keepLease(leases, fenceOf(row), 'instance-a', LEASE_MS, createLogger('silent'));
    try {
      await sleep(LEASE_MS * 3);
      expect(lease.lost.aborted).toBe(false);
      // Another worker took the row over (its lease forced out): the next heartbeat says so.
      await s.db.updateTable('videoTasks').set({ leaseOwner: 'instance-b', attempt: row.attempt + 1 }).where('id', '=', row.id).execute();
      await sleep(LEASE_MS / 2);
      expect(lease.lost.aborted).toBe(true);
      expect((lease.lost.reason as Error).message).toBe('lease lost');
    } finally {
      lease.release();
      await park(row.id);
    }
  });
});
