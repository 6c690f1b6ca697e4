/**
 * The record of a task's calls upstream (table task_attempts): one row per call, for the operator's
 * view of a task. Rows are written in bulk from parallel arrays (`unnest`), so the statement's text
 * is the same however many rows it carries (one prepared statement, see db/prepared.ts).
 */
import { sql, type Kysely, type RawBuilder, type Selectable } from 'kysely';
import type { DB, TaskAttempts } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';

export type TaskAttemptRow = Selectable<TaskAttempts>;

export type AttemptStep = 'submit' | 'poll' | 'download' | 'cancel' | 'generate';

/** One call upstream, as the runner saw it. */
export interface AttemptRecord {
  taskId: string;
  step: AttemptStep;
  memberId: string | null;
  provider: string | null;
  upstreamJobId: string | null;
  /** `ok`, `aborted`, `internal`, or the ProviderError kind. */
  outcome: string;
  /** Sanitized: the upstream's reason as ProviderError carries it, never an internal error's text. */
  error: string | null;
  startedAt: Date;
  durationMs: number;
}

/** The rows of `records` as a SELECT over parallel arrays (the column order of the insert below). */
function rowsOf(records: readonly AttemptRecord[]): RawBuilder<unknown> {
  const col = <T>(f: (r: AttemptRecord) => T) => records.map(f);
  return sql`select * from unnest(
      ${col((r) => r.taskId)}::text[], ${col((r) => r.step)}::text[], ${col((r) => r.memberId)}::text[], ${col((r) => r.provider)}::text[],
      ${col((r) => r.upstreamJobId)}::text[], ${col((r) => r.outcome)}::text[], ${col((r) => r.error)}::text[],
      ${col((r) => r.startedAt.toISOString())}::timestamptz[], ${col((r) => Math.max(0, Math.round(r.durationMs)))}::int[])
    as u(task_id, step, member_id, provider, upstream_job_id, outcome, error, started_at, duration_ms)`;
}

const COLUMNS = sql.raw('task_id, step, member_id, provider, upstream_job_id, outcome, error, started_at, duration_ms');

export class TaskAttemptRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /** Writes the records in one statement. */
  async insert(records: readonly AttemptRecord[], db: Executor = this.db): Promise<void> {
    if (records.length === 0) return;
    await sql`insert into task_attempts (${COLUMNS}) ${rowsOf(records)}`.execute(db);
  }

  /**
   * The same insert as a CTE (`name as (…)`) for a statement that does something else too: the
   * statement that finishes a synchronous image task writes its attempts (no statement of their own
   * on the request's path), `when` it holds (the task's fenced update took effect; `when` may name
   * the record's columns as `r.task_id`…). None for no records.
   */
  static cte(name: string, records: readonly AttemptRecord[], when: RawBuilder<boolean>): RawBuilder<unknown>[] {
    if (records.length === 0) return [];
    return [sql`${sql.raw(name)} as (insert into task_attempts (${COLUMNS}) select * from (${rowsOf(records)}) r where ${when})`];
  }

  /** A task's attempts, oldest first. */
  forTask(taskId: string): Promise<TaskAttemptRow[]> {
    return this.db.selectFrom('taskAttempts').selectAll().where('taskId', '=', taskId).orderBy('id').execute();
  }
}
