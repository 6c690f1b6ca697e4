/**
 * The one implementation of leased work for every table that has the leased-task columns
 * (`attempt`, `lease_owner`, `lease_expires_at`, `next_run_at`, `retries`; see the leased-tasks
 * migration): video tasks, image tasks and, later, webhook deliveries.
 *
 * A claim takes due, unleased (or lease-expired) rows with `FOR UPDATE SKIP LOCKED`, bumps their
 * `attempt` and sets the lease, in one statement. Every later write of the worker is fenced by the
 * attempt it claimed: once the lease expired and another worker claimed the row, the old worker's
 * heartbeat, reschedule and updates all match nothing.
 */
import { sql, type Kysely, type RawBuilder, type Selectable, type UpdateObject } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { dbColumns } from '../../generated/db-columns.ts';
import type { Executor } from '../db/database.ts';
import { columnsOf, runPrepared } from '../db/prepared.ts';

/** A claimed attempt of a row: writes apply only while the row still has this attempt. */
export interface Fence {
  id: string;
  attempt: number;
}

export type LeasedTableName = 'videoTasks' | 'imageTasks' | 'webhookDeliveries';

export interface LeasedTableSpec<Name extends LeasedTableName> {
  /** Kysely (camelCase) table name and its SQL name. */
  table: Name;
  sqlTable: keyof typeof dbColumns;
  /** Statuses in which a row is still worked on; terminal rows are never claimed or updated. */
  active: readonly string[];
  /** The table has `last_error` / `last_error_at`, which a retry's reschedule writes (tasks; webhook deliveries keep their own). */
  recordsErrors?: boolean;
  /**
   * A step counts its own failures in `retries`, in the statement that records them (webhook
   * deliveries: WebhookRepository.recordAttempt), so a reschedule that is not a failure keeps the
   * count instead of starting it again.
   */
  stepsCountRetries?: boolean;
}

export const fenceOf = (row: { id: string; attempt: number }): Fence => ({ id: row.id, attempt: row.attempt });

/** The ledger's settlement of one hold as CTEs (LedgerRepository.settlement), for the hold `which` selects. */
export type HoldSettlement = (which: RawBuilder<unknown>) => { ctes: RawBuilder<unknown>; settled: RawBuilder<boolean> };

/** How a task row ends (LeasedTasks.finish). */
export interface Finish {
  /** The assignments of the terminal state (the lease is cleared as well). */
  set: RawBuilder<unknown>;
  /** Settles the task's hold in the same statement; a task with a price whose hold does not settle aborts it all. */
  settle?: HoldSettlement;
  /** More writes of the same statement (`name as (…)`), which see the finished row as `t`. */
  also?: RawBuilder<unknown>[];
}

/** Most rows one reschedule statement updates. */
const RESCHEDULE_BATCH = 500;
/** How long a reschedule waits for others to share its statement (the engine does not wait for it). */
const RESCHEDULE_WINDOW_MS = 20;

export class LeasedTasks<Name extends LeasedTableName> {
  constructor(
    private readonly db: Kysely<DB>,
    private readonly spec: LeasedTableSpec<Name>,
  ) {}

  // Kysely cannot type a table name that is itself generic; the public signatures are typed instead.
  private updateRows(db: Executor = this.db) {
    return (db as Kysely<any>).updateTable(this.spec.table as string);
  }

  private activeStatuses(): RawBuilder<unknown> {
    return sql.join(this.spec.active.map((s) => sql.lit(s)));
  }

  /** Claims up to `limit` due rows in one statement, oldest due first, for `leaseMs`. */
  async claimDue(workerId: string, limit: number, leaseMs: number): Promise<Selectable<DB[Name]>[]> {
    const table = sql.table(this.spec.sqlTable);
    const result = await sql<Selectable<DB[Name]>>`
      update ${table} t
      set attempt = t.attempt + 1,
          lease_owner = ${workerId},
          lease_expires_at = now() + ${leaseMs} * interval '1 millisecond'
      where t.id in (
        select id from ${table}
        where status in (${this.activeStatuses()}) and next_run_at <= now()
          and (lease_expires_at is null or lease_expires_at < now())
        order by next_run_at
        limit ${limit}
        for update skip locked
      )
      returning t.*`.execute(this.db);
    // The CamelCasePlugin maps raw result columns too.
    return result.rows;
  }

  /** Extends the lease; false when the row was taken over (or finished) meanwhile. */
  async heartbeat(fence: Fence, workerId: string, leaseMs: number): Promise<boolean> {
    const r = await this.updateRows()
      .set({ leaseExpiresAt: sql`now() + ${leaseMs} * interval '1 millisecond'` })
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('leaseOwner', '=', workerId)
      .where('status', 'in', this.spec.active)
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }

  /**
   * Releases the lease and makes the row due again in `delayMs`: the next step of a running task,
   * or (with `failed`) a retry after a transient failure, which counts toward the retry policy;
   * `error` (sanitized) is recorded as the row's last error where the table keeps one.
   * False when the fence no longer holds. Reschedules requested within RESCHEDULE_WINDOW_MS of
   * each other go out as one statement (thousands of polling jobs reschedule a step each; one
   * UPDATE for many rows saves a round trip and a statement per step).
   */
  reschedule(fence: Fence, delayMs: number, opts: { failed?: boolean; error?: string } = {}): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.pendingReschedules.push({ fence, delayMs: Math.max(0, Math.round(delayMs)), failed: opts.failed ?? false, error: opts.error ?? null, resolve, reject });
      if (this.pendingReschedules.length === 1) this.flushTimer = setTimeout(() => void this.flushReschedules(), RESCHEDULE_WINDOW_MS);
      else if (this.pendingReschedules.length === RESCHEDULE_BATCH) {
        clearTimeout(this.flushTimer);
        void this.flushReschedules();
      }
    });
  }

  private flushTimer: NodeJS.Timeout | undefined;
  private pendingReschedules: { fence: Fence; delayMs: number; failed: boolean; error: string | null; resolve: (ok: boolean) => void; reject: (err: unknown) => void }[] = [];

  private async flushReschedules(): Promise<void> {
    const batch = this.pendingReschedules.splice(0, RESCHEDULE_BATCH);
    const table = sql.table(this.spec.sqlTable);
    const rows = sql.join(batch.map((b) => sql`(${b.fence.id}, ${b.fence.attempt}::int, ${b.delayMs}::int, ${b.failed}::boolean, ${b.error}::text)`));
    // A retried attempt leaves its reason on the row for the operator (the last one wins).
    const errors = this.spec.recordsErrors
      ? sql`, last_error = coalesce(v.error, t.last_error), last_error_at = case when v.error is null then t.last_error_at else now() end`
      : sql``;
    try {
      // Each row is leased by its one worker, so a batch never contends with another for a row.
      const result = await sql<{ id: string }>`
        update ${table} t
        set next_run_at = now() + v.delay_ms * interval '1 millisecond',
            lease_owner = null,
            lease_expires_at = null,
            retries = case when v.failed then t.retries + 1 else ${this.spec.stepsCountRetries ? sql`t.retries` : sql`0`} end${errors}
        from (values ${rows}) as v(id, attempt, delay_ms, failed, error)
        where t.id = v.id and t.attempt = v.attempt and t.status in (${this.activeStatuses()})
        returning t.id`.execute(this.db);
      const updated = new Set(result.rows.map((r) => r.id));
      for (const b of batch) b.resolve(updated.has(b.fence.id));
    } catch (err) {
      for (const b of batch) b.reject(err);
    }
  }

  /**
   * Moves the row, while the fence holds, to a terminal state in ONE statement together with the
   * settlement of its hold and the writes that go with it (a webhook delivery, the rows of the files
   * it produced). One statement and no transaction around it: the account's row is locked only
   * while the statement runs, not across client round trips, so the tasks of one busy account do not
   * queue behind each other's commits. A task with a price whose hold did not settle aborts the
   * whole statement (a bug: nothing changes). Returns the finished row, or undefined when the fence
   * no longer holds. A prepared statement (db/prepared.ts): the hot path of every task's end.
   */
  async finish(fence: Fence, end: Finish): Promise<Selectable<DB[Name]> | undefined> {
    const row = (await this.finishStatement(fence, end, 'row'))[0];
    if (!row) return undefined;
    const { holdGuard: _guard, ...task } = row;
    return task as unknown as Selectable<DB[Name]>;
  }

  /**
   * `finish` answering only whether the fence held (true) or not: for a caller that has the task
   * already (a synchronous image), spared reading the finished row's 30-odd columns back.
   */
  async finishOnly(fence: Fence, end: Finish): Promise<boolean> {
    return (await this.finishStatement(fence, end, 'id')).length > 0;
  }

  private finishStatement(fence: Fence, end: Finish, result: 'row' | 'id') {
    const table = sql.table(this.spec.sqlTable);
    const settlement = end.settle?.(sql`task_id = (select id from t)`);
    const ctes = [...(settlement ? [settlement.ctes] : []), ...(end.also ?? [])];
    const guard = settlement
      ? sql`case when coalesce(t.quoted_credits, 0) > 0 and not ${settlement.settled} then mg_abort('the hold of task ' || t.id || ' is missing or was already settled') end`
      : sql`null`;
    return runPrepared(sql<Selectable<DB[Name]> & { holdGuard: unknown }>`
      with t as (
        update ${table} set ${end.set}, lease_owner = null, lease_expires_at = null
        where id = ${fence.id} and attempt = ${fence.attempt} and status in (${this.activeStatuses()})
        returning ${columnsOf(this.spec.sqlTable)}
      )${ctes.length > 0 ? sql`, ${sql.join(ctes)}` : sql``}
      select ${result === 'row' ? sql`t.*` : sql`t.id`}, ${guard} as hold_guard from t`, this.db);
  }

  /**
   * Applies `values` while the row is still active and at `fence.attempt`. Returns the updated row,
   * or undefined when the fence no longer holds.
   */
  async update(fence: Fence, values: UpdateObject<DB, Name>, db: Executor): Promise<Selectable<DB[Name]> | undefined> {
    const row = await this.updateRows(db)
      .set(values as Record<string, unknown>)
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('status', 'in', this.spec.active)
      .returningAll()
      .executeTakeFirst();
    return row as Selectable<DB[Name]> | undefined;
  }
}
