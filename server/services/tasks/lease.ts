/**
 * Keeping a lease while work runs: a heartbeat every third of the lease, and two abort signals:
 * `lost`, which fires only when the lease is lost (another worker took the row over), and `signal`,
 * which fires then or when `parent` aborts (the engine stopping, a request going away). Used by the
 * task engine for every claimed step and by a request that runs its synchronous image task.
 */
import type { Logger } from '../../logger.ts';
import type { Fence, LeasedTableName, LeasedTasks } from '../../repositories/leased-tasks.ts';
import { LeaseLost } from './task-runner.ts';

export interface HeldLease {
  /** Aborts when the lease is lost or the parent signal aborts. */
  signal: AbortSignal;
  /**
   * Aborts only when the lease is lost: for a call that must not be cut short by a stop once it may
   * have reached the upstream (a submit whose job id is the commit point); the heartbeat goes on
   * while it runs, so the row stays this worker's until it ends.
   */
  lost: AbortSignal;
  release(): void;
}

export function keepLease(leases: LeasedTasks<LeasedTableName>, fence: Fence, owner: string, leaseMs: number, log: Logger, parent?: AbortSignal): HeldLease {
  const lost = new AbortController();
  const work = new AbortController();
  const onParentAbort = () => work.abort(parent!.reason);
  if (parent?.aborted) work.abort(parent.reason);
  else parent?.addEventListener('abort', onParentAbort, { once: true });
  const timer = setInterval(() => {
    leases
      .heartbeat(fence, owner, leaseMs)
      .then((ok) => {
        if (ok) return;
        const reason = new LeaseLost('lease lost');
        lost.abort(reason);
        work.abort(reason);
      })
      .catch((err: unknown) => log.warn({ err: err instanceof Error ? err.message : String(err) }, 'lease heartbeat failed'));
  }, Math.max(100, Math.floor(leaseMs / 3)));
  return {
    signal: work.signal,
    lost: lost.signal,
    release: () => {
      clearInterval(timer);
      parent?.removeEventListener('abort', onParentAbort);
    },
  };
}
