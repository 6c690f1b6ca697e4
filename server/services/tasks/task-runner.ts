/**
 * What a kind of leased task (video, image, …) gives the task engine: its leased table, its retry
 * policy, and how to run one short step of a claimed row. The engine (workers/task-engine.ts) only
 * claims, heartbeats and retries; everything a step does lives in the runner, in services.
 */
import type { Logger } from '../../logger.ts';
import type { Fence, LeasedTableName, LeasedTasks } from '../../repositories/leased-tasks.ts';
import type { RetryPolicy } from './retry-policy.ts';

/**
 * A step either finished the task (it was settled, or its fence was lost) or asks to run again
 * later: its next step (`later`), or — `failed` — a retry after a failed try the step recorded
 * itself (`retryIn`, with a delay from the kind's retry policy), which counts toward `retries`.
 */
export type StepResult = { done: true } | { done: false; nextInMs: number; failed?: boolean; error?: string };

export const DONE: StepResult = { done: true };
/** The next step in `nextInMs`; `error`: why this one could not go on (recorded as the task's last error). */
export const later = (nextInMs: number, error?: string): StepResult => ({ done: false, nextInMs, ...(error !== undefined && { error }) });
export const retryIn = (nextInMs: number, error?: string): StepResult => ({ done: false, nextInMs, failed: true, ...(error !== undefined && { error }) });

export interface LeasedRow extends Fence {
  retries: number;
}

export interface TaskRunner<Row extends LeasedRow> {
  readonly name: string;
  readonly leases: LeasedTasks<LeasedTableName>;
  readonly retry: RetryPolicy;
  /**
   * Runs one step of a claimed row. Throws on a transient failure: the engine retries per `retry`.
   * `signal` aborts when the lease is lost or the engine stops; `leaseLost` only when the lease is
   * lost — for a call a stop must let finish (the engine waits for it): one the upstream may have
   * accepted and whose answer is what the task commits (a video submit's job id, a background
   * image's images). A step that counts a try itself in the row's `retries` (a background image
   * whose earlier step stopped during its upstream call) adds it to `task.retries` as well: the
   * engine decides the retry after a failure of the step by that count.
   */
  step(task: Row, signal: AbortSignal, log: Logger, leaseLost: AbortSignal): Promise<StepResult>;
  /** The retries are used up: settle the task as failed. */
  giveUp(task: Row, err: unknown, log: Logger): Promise<void>;
}

/** Thrown by a step that finds it no longer holds its row (another worker took it over). */
export class LeaseLost extends Error {}
