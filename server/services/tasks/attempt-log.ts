/**
 * The calls one step of a task makes upstream, timed and classified as they happen, for the task's
 * story (table task_attempts, shown by GET /admin/v1/tasks/{task_id}). The runner decides when the
 * records are written: a video step's with one insert when the step ends, a synchronous image's by
 * the statement that settles the task (no statement of their own on the request's path).
 */
import { sentence } from '../../errors.ts';
import { ProviderError } from '../../providers/provider-error.ts';
import type { Logger } from '../../logger.ts';
import type { AttemptRecord, AttemptStep, TaskAttemptRepository } from '../../repositories/task-attempt.repository.ts';

/** Who was called. */
export interface AttemptTarget {
  memberId: string;
  provider: string;
}

/** A failure as the attempt record keeps it: the error kind and the upstream's sanitized reason, never internal details. */
export function attemptOutcome(err: unknown, aborted: boolean): { outcome: string; error: string | null } {
  if (aborted || (err instanceof Error && err.name === 'AbortError')) return { outcome: 'aborted', error: null };
  if (err instanceof ProviderError) return { outcome: err.kind, error: `${sentence(err.message)}${err.upstreamStatus ? ` (HTTP ${err.upstreamStatus})` : ''}` };
  return { outcome: 'internal', error: 'An internal error; the server log has its details.' };
}

export class AttemptLog {
  readonly records: AttemptRecord[] = [];

  constructor(private readonly taskId: string) {}

  /**
   * Runs `call` on `target` and records it: its outcome, or, when it throws, the error's kind and
   * sanitized reason (then rethrows). `jobId` is the upstream job it concerns (a function of the
   * result for a submit, which learns it). `keep` false leaves a success unrecorded (a status check
   * that says the job still runs). `signal`: a call cut short by it is `aborted`.
   */
  async run<T>(
    step: AttemptStep,
    target: AttemptTarget,
    jobId: string | null | ((result: T) => string | null),
    call: () => Promise<T>,
    opts: { keep?: (result: T) => boolean; signal?: AbortSignal } = {},
  ): Promise<T> {
    const startedAt = new Date();
    const t0 = performance.now();
    const record = (outcome: string, error: string | null, upstreamJobId: string | null) =>
      this.records.push({ taskId: this.taskId, step, memberId: target.memberId, provider: target.provider, upstreamJobId, outcome, error, startedAt, durationMs: performance.now() - t0 });
    let result: T;
    try {
      result = await call();
    } catch (err) {
      const { outcome, error } = attemptOutcome(err, opts.signal?.aborted ?? false);
      record(outcome, error, typeof jobId === 'function' ? null : jobId);
      throw err;
    }
    if (opts.keep?.(result) ?? true) record('ok', null, typeof jobId === 'function' ? jobId(result) : jobId);
    return result;
  }

  /** Takes the records made so far (they are written once). */
  take(): AttemptRecord[] {
    return this.records.splice(0);
  }

  /** Writes the records made so far with their own insert; a failure to write them is logged, never the step's. */
  async write(repo: Pick<TaskAttemptRepository, 'insert'>, log: Logger): Promise<void> {
    const records = this.take();
    try {
      await repo.insert(records);
    } catch (err) {
      log.warn({ err: err instanceof Error ? err.message : String(err), attempts: records.length }, 'could not record the attempts of a task step');
    }
  }
}
