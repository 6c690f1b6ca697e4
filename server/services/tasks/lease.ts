/**
 * Keeping a lease while work runs: a heartbeat every third of the lease, and two abort signals:
 * `lost`, which fires only when the lease is lost, and `signal`, which fires then or when `parent`
 * aborts (the engine stopping, a request going away). Used by the task engine for every claimed
 * step and by a request that runs its synchronous image task.
 *
 * The lease is lost when a heartbeat finds the row taken over (or finished). When no heartbeat has
 * confirmed it for most of its length (the database unreachable from this instance, a heartbeat
 * that hangs), another instance may claim the row the moment its lease runs out: `signal` aborts a
 * margin before that (a sixth of the lease, counted from when the last confirmed heartbeat was
 * sent: the lease it set ends later than that), so that a poll, a download or a webhook send does
 * not run on two instances at once. `lost` does not: a submit that may have reached the upstream
 * goes on to save its job id (fenced on the attempt: refused if the row was claimed meanwhile),
 * since cutting it would leave a job the next attempt submits again (an overloaded instance whose
 * heartbeats queue behind its own work would otherwise duplicate its submits).
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
  const lose = (reason: LeaseLost) => {
    lost.abort(reason);
    work.abort(reason);
    release();
  };
  /** How long before the lease runs out the work stops when no heartbeat confirmed it. */
  const margin = Math.floor(leaseMs / 6);
  // Counted from now: the claim that set the lease came a moment before, which the margin covers.
  let deadline = setTimeout(lapsed, leaseMs - margin);
  /** The deadline passed (the step was stopped): no deadline again. The lease given back: nothing more at all. */
  let lapsedAlready = false;
  let released = false;
  function lapsed() {
    lapsedAlready = true;
    log.warn({ taskId: fence.id, attempt: fence.attempt, leaseMs }, 'lease not confirmed by any heartbeat for most of its length (the database unreachable?); stopping the work before another instance can take it over');
    work.abort(new LeaseLost('lease not confirmed in time'));
  }
  /** A heartbeat in flight: the next one waits for it (a stalled pool is not piled onto). */
  let beating = false;
  const timer = setInterval(() => {
    if (beating) return;
    beating = true;
    const sentAt = Date.now();
    leases
      .heartbeat(fence, owner, leaseMs)
      .then((ok) => {
        // A heartbeat still in flight when the step ended (its row finished: false) says nothing.
        if (released || lost.signal.aborted) return;
        if (!ok) return lose(new LeaseLost('lease lost'));
        if (lapsedAlready) return;
        clearTimeout(deadline);
        deadline = setTimeout(lapsed, Math.max(0, sentAt + leaseMs - margin - Date.now()));
      })
      .catch((err: unknown) => log.warn({ err: err instanceof Error ? err.message : String(err) }, 'lease heartbeat failed'))
      .finally(() => {
        beating = false;
      });
  }, Math.max(100, Math.floor(leaseMs / 3)));
  function release() {
    released = true;
    clearInterval(timer);
    clearTimeout(deadline);
    parent?.removeEventListener('abort', onParentAbort);
  }
  return { signal: work.signal, lost: lost.signal, release };
}
