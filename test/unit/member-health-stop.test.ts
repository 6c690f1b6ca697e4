/**
 * MemberHealth's batch of counted successes at a process's stop (main.ts): `stop` writes what is
 * counted while the database is open, and a success that comes after it (a call that outlived the
 * stop) schedules no write for after the database closed — which logged "could not record member
 * successes: driver has already been destroyed", with its stack, in a clean stop's log.
 */
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../server/logger.ts';
import { createMetrics } from '../../server/metrics.ts';
import { MemberHealth } from '../../server/pool/member-health.ts';
import type { UpstreamAccount } from '../../server/providers/types.ts';
import type { MemberHealthRepository } from '../../server/repositories/member-health.repository.ts';

const account = { memberId: 'mem_stop', provider: 'openai' } as UpstreamAccount;

/** A repository that records the batches written, and refuses writes once "closed". */
function recordingRepo() {
  const batches: Map<string, { calls: number }>[] = [];
  let closed = false;
  const repo = {
    recordSuccesses: async (batch: Map<string, { calls: number }>) => {
      if (closed) throw new Error('driver has already been destroyed');
      batches.push(batch);
    },
  };
  return { repo: repo as unknown as MemberHealthRepository, batches, close: () => (closed = true) };
}

describe('MemberHealth at stop', () => {
  it('writes the counted successes at stop, and schedules nothing for a success after it', async () => {
    const { repo, batches, close } = recordingRepo();
    const warnings: string[] = [];
    const log = createLogger('silent');
    log.warn = ((...args: unknown[]) => void warnings.push(String(args.at(-1)))) as typeof log.warn;
    const health = new MemberHealth(repo, createMetrics({ defaultMetrics: false }), log);

    await health.observe(account, () => Promise.resolve('ok'));
    await health.observe(account, () => Promise.resolve('ok'));
    expect(batches).toEqual([]); // batched: written a second later, or at stop
    await health.stop();
    expect(batches.map((b) => b.get('mem_stop')?.calls)).toEqual([2]);

    close(); // the process closes its database after the stop
    await health.observe(account, () => Promise.resolve('late'));
    await new Promise((resolve) => setTimeout(resolve, 1300)); // past the batch's second
    expect(batches).toHaveLength(1);
    expect(warnings).toEqual([]);
  });
});
