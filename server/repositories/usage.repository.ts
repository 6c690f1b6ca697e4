/**
 * Usage reports (GET /admin/v1/usage) and the operator gauges (/metrics), each ONE statement.
 *
 * A report reads three range scans: the image and video tasks created in [from, to) (their
 * (created_at, id) indexes, or the account's), and the capture and release entries the ledger
 * recorded in it (ledger_entries_created_idx, or the account's), each entry joined to its task by id
 * for the model and the member when the report is grouped by model or provider (an entry carries
 * its account and key itself). Both are folded into one list of facts and grouped by the period
 * (hour or day, UTC; the first starts at `from`) and the dimensions asked for. The provider is the
 * kind of the member that ran the task, `none` without one (or once it was deleted).
 *
 * A report can be large (a month by hour of every account: 100,000s of rows), so its rows are read
 * through a cursor, USAGE_BATCH_ROWS at a time, as its reader asks for them: the statement runs once
 * (its grouping and order need every fact before the first row), and no side holds the whole report.
 */
import { sql, type Kysely, type RawBuilder } from 'kysely';
import type { DB } from '../../generated/db.d.ts';

export type UsageDimension = 'account' | 'key' | 'model' | 'provider';
export type Granularity = 'hour' | 'day';

export interface UsageQuery {
  /** RFC 3339 text, parsed by PostgreSQL. */
  from: string;
  to: string;
  granularity: Granularity;
  groupBy: readonly UsageDimension[];
  accountId?: string;
}

export interface UsageRow {
  periodStart: Date;
  accountId: string | null;
  apiKeyId: string | null;
  model: string | null;
  provider: string | null;
  creditsSpent: number;
  creditsRefunded: number;
  videoTasksQueued: number;
  videoTasksInProgress: number;
  videoTasksCompleted: number;
  videoTasksFailed: number;
  imageTasksProcessing: number;
  imageTasksNeedsAttention: number;
  imageTasksCompleted: number;
  imageTasksFailed: number;
  imagesRequested: number;
  imagesDelivered: number;
}

/** The operator's gauges: what is held and unfinished right now. */
export interface OperatorStats {
  creditsHeld: number;
  holdsHeld: number;
  /** Unfinished tasks by kind and status (terminal states grow forever: the usage report counts them). */
  unfinished: { kind: 'image' | 'video'; status: string; count: number }[];
  needsAttention: number;
  /** Age in seconds of the oldest needs_attention task; 0 without one. */
  oldestNeedsAttentionSeconds: number;
}

const DIMENSIONS: Record<UsageDimension, { column: string; expr: RawBuilder<unknown> }> = {
  account: { column: 'account_id', expr: sql`f.account_id` },
  key: { column: 'api_key_id', expr: sql`f.api_key_id` },
  model: { column: 'model', expr: sql`f.model` },
  provider: { column: 'provider', expr: sql`f.provider` },
};
const ORDER: readonly UsageDimension[] = ['account', 'key', 'model', 'provider'];

/** Rows of a report read from its cursor at a time: about 400 kB of its JSON. */
const USAGE_BATCH_ROWS = 1000;

export class UsageRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /**
   * The report's rows in order, USAGE_BATCH_ROWS at a time (never an empty batch). The statement is
   * a cursor of a read-only transaction, which holds one connection of the pool from the first
   * `next()` until the last batch is read or the loop over it stops (`return()`, as `for await` and
   * `pipeline` do): the transaction is then rolled back and the connection released. A failure of
   * the statement itself (a time PostgreSQL refuses) comes with the first batch.
   *
   * `signal` (its reader went away): a statement of the report still running is cancelled in
   * PostgreSQL (`pg_cancel_backend` of the report's backend, from another connection of the pool),
   * since the first batch waits for all of it, which can take a long while on a large install. The
   * generator then throws the signal's reason, its transaction rolled back and its connection given
   * back.
   */
  async *report(q: UsageQuery, signal?: AbortSignal): AsyncGenerator<UsageRow[], void, undefined> {
    const from = sql`${q.from}::timestamptz`;
    const to = sql`${q.to}::timestamptz`;
    const account = (column: string) => (q.accountId !== undefined ? sql` and ${sql.ref(column)} = ${q.accountId}` : sql``);
    const dims = ORDER.filter((d) => q.groupBy.includes(d));
    const selected = ORDER.map((d) => (dims.includes(d) ? sql`${DIMENSIONS[d].expr}::text as ${sql.ref(DIMENSIONS[d].column)}` : sql`null::text as ${sql.ref(DIMENSIONS[d].column)}`));
    const groupBy = [sql`f.period_start`, ...dims.map((d) => DIMENSIONS[d].expr)];
    // A ledger entry's model and member are its task's: joined only when the report is grouped by them.
    const byTask = dims.includes('model') || dims.includes('provider');
    const count = (kind: string, status: string) => sql`count(*) filter (where f.kind = ${sql.lit(kind)} and f.status = ${sql.lit(status)})`;
    const statement = sql`
      with tasks as (
        select v.account_id, v.api_key_id, v.model, v.member_id, v.created_at as at, 'video'::text as kind, v.status, 0::bigint as n, 0::bigint as delivered
        from video_tasks v where v.created_at >= ${from} and v.created_at < ${to}${account('v.account_id')}
        union all
        select i.account_id, i.api_key_id, i.model, i.member_id, i.created_at, 'image'::text, i.status, i.n::bigint, i.delivered::bigint
        from image_tasks i where i.created_at >= ${from} and i.created_at < ${to}${account('i.account_id')}
      ), credits as (
        select l.account_id, l.api_key_id, ${byTask ? sql`coalesce(v.model, i.model)` : sql`null::text`} as model,
               ${byTask ? sql`coalesce(v.member_id, i.member_id)` : sql`null::text`} as member_id, l.created_at as at,
               case when l.kind = 'capture' then l.amount else 0 end as spent, case when l.kind = 'release' then l.amount else 0 end as refunded
        from ledger_entries l
        ${byTask ? sql`left join video_tasks v on v.id = l.task_id left join image_tasks i on i.id = l.task_id` : sql``}
        where l.kind in ('capture', 'release') and l.created_at >= ${from} and l.created_at < ${to}${account('l.account_id')}
      ), facts as (
        select account_id, api_key_id, model, member_id, at, 0::bigint as spent, 0::bigint as refunded, kind, status, n, delivered from tasks
        union all
        select account_id, api_key_id, model, member_id, at, spent, refunded, null, null, 0, 0 from credits
      ), periods as (
        select x.*, greatest(date_trunc(${sql.lit(q.granularity)}, x.at, 'UTC'), ${from}) as period_start,
               ${dims.includes('provider') ? sql`coalesce(m.provider, 'none')` : sql`null::text`} as provider
        from facts x${dims.includes('provider') ? sql` left join group_members m on m.id = x.member_id` : sql``}
      )
      select f.period_start, ${sql.join(selected)},
        coalesce(sum(f.spent), 0)::bigint as credits_spent,
        coalesce(sum(f.refunded), 0)::bigint as credits_refunded,
        ${count('video', 'queued')} as video_tasks_queued,
        ${count('video', 'in_progress')} as video_tasks_in_progress,
        ${count('video', 'completed')} as video_tasks_completed,
        ${count('video', 'failed')} as video_tasks_failed,
        ${count('image', 'processing')} as image_tasks_processing,
        ${count('image', 'needs_attention')} as image_tasks_needs_attention,
        ${count('image', 'completed')} as image_tasks_completed,
        ${count('image', 'failed')} as image_tasks_failed,
        coalesce(sum(f.n) filter (where f.kind = 'image'), 0)::bigint as images_requested,
        coalesce(sum(f.delivered) filter (where f.kind = 'image'), 0)::bigint as images_delivered
      from periods f
      group by ${sql.join(groupBy)}
      order by ${sql.join(groupBy)}`;
    signal?.throwIfAborted();
    const trx = await this.db.startTransaction().setAccessMode('read only').execute();
    let ended = false;
    // The report's backend, and whether one of its statements is running (only then is there
    // anything to cancel: between batches it waits for its reader, whose stop ends it).
    let pid: number | undefined;
    let running = false;
    let cancelled: Promise<unknown> | undefined;
    const cancel = () => {
      if (running && pid !== undefined && !cancelled) cancelled = sql`select pg_cancel_backend(${pid})`.execute(this.db).catch(() => undefined);
    };
    const run = async <R>(statement: RawBuilder<R>) => {
      signal?.throwIfAborted();
      running = true;
      try {
        return await statement.execute(trx);
      } finally {
        running = false;
      }
    };
    signal?.addEventListener('abort', cancel, { once: true });
    try {
      if (signal) pid = (await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(trx)).rows[0]!.pid;
      await run(sql`declare usage_report no scroll cursor for ${statement}`);
      for (;;) {
        const { rows } = await run(sql<UsageRow>`fetch forward ${sql.lit(USAGE_BATCH_ROWS)} from usage_report`);
        if (rows.length > 0) yield rows;
        if (rows.length < USAGE_BATCH_ROWS) break;
      }
      await trx.commit().execute();
      ended = true;
    } catch (err) {
      // A statement cancelled for the abort (57014) is the abort, not a failure of the database.
      throw signal?.aborted ? signal.reason : err;
    } finally {
      signal?.removeEventListener('abort', cancel);
      // The cancel has reached the backend before the rollback gives the connection back to the pool:
      // it cannot fall on another caller's statement (a backend reading its next command ignores one).
      await cancelled;
      // Stopped early or failed: the cursor goes with the transaction (a rollback releases the
      // connection even when it fails, as it does on a connection that is gone).
      if (!ended) await trx.rollback().execute().catch(() => undefined);
    }
  }

  /** The gauges, in one statement over the partial indexes of held holds and unfinished tasks. */
  async operatorStats(): Promise<OperatorStats> {
    const { rows } = await sql<{ creditsHeld: number; holdsHeld: number; unfinished: { kind: 'image' | 'video'; status: string; count: number }[] | null; oldest: Date | null; needsAttention: number }>`
      select
        (select coalesce(sum(amount), 0)::bigint from credit_holds where status = 'held') as credits_held,
        (select count(*) from credit_holds where status = 'held') as holds_held,
        (select json_agg(json_build_object('kind', kind, 'status', status, 'count', n)) from (
           select 'video' as kind, status, count(*) as n from video_tasks where status in ('queued', 'in_progress') group by status
           union all
           select 'image', status, count(*) from image_tasks where status in ('processing', 'needs_attention') group by status
         ) u) as unfinished,
        (select count(*) from image_tasks where status = 'needs_attention') as needs_attention,
        (select min(created_at) from image_tasks where status = 'needs_attention') as oldest`.execute(this.db);
    const row = rows[0]!;
    return {
      creditsHeld: row.creditsHeld,
      holdsHeld: row.holdsHeld,
      unfinished: row.unfinished ?? [],
      needsAttention: row.needsAttention,
      oldestNeedsAttentionSeconds: row.oldest ? Math.max(0, (Date.now() - row.oldest.getTime()) / 1000) : 0,
    };
  }
}
