/**
 * Keeping a lease while work runs: a heartbeat every third of the lease, and an abort signal that
 * fires when the lease is lost (another worker took the row over) or when `parent` aborts. Used by
 * the task engine for every claimed step and by a request that runs its synchronous image task.
 */
import type { Logger } from '../../logger.ts';
import type { Fence, LeasedTableName, LeasedTasks } from '../../repositories/leased-tasks.ts';
import { LeaseLost } from './task-runner.ts';

export interface HeldLease {
  /** Aborts when the lease is lost or the parent signal aborts. */
  signal: AbortSignal;
  release(): void;
}

export function keepLease(leases: LeasedTasks<LeasedTableName>, fence: Fence, owner: string, leaseMs: number, log: Logger, parent?: AbortSignal): HeldLease {
  const work = new AbortController();
  const onParentAbort = () => work.abort(parent!.reason);
  if (parent?.aborted) work.abort(parent.reason);
  else parent?.addEventListener('abort', onParentAbort, { once: true });
  const timer = setInterval(() => {
    leases
      .heartbeat(fence, owner, leaseMs)
      .then((ok) => {
        if (!ok) work.abort(new LeaseLost('lease lost'));
      })
      .catch((err: unknown) => log.warn({ err: err instanceof Error ? err.message : String(err) }, 'lease heartbeat failed'));
  }, Math.max(100, Math.floor(leaseMs / 3)));
  return {
    signal: work.signal,
    release: () => {
      clearInterval(timer);
      parent?.removeEventListener('abort', onParentAbort);
    },
  };
}
