/**
 * The credit hot path (design §5). A hold reserves credits on the key quota and the account balance
 * with guarded conditional updates and inserts the task row, all in ONE statement: atomic without
 * BEGIN/COMMIT round trips, and about twice as fast on a hot key. Settlement (capture and/or
 * release) happens exactly once per hold: the hold row's status guard and the unique
 * (hold_id, kind) ledger index both enforce it. An account's total_spent is its row's column plus
 * its spend shards (`totalSpentOf` in account.repository.ts), which settlements add to.
 *
 * Lock order (every statement that touches these rows takes them in this order, so concurrent
 * requests of one account and key can wait for each other but never deadlock):
 *   task row → credit_holds row → api_keys row → accounts row → account_spend row.
 * The hold statement locks the key, then the account, then inserts the hold and the task (new rows
 * wait on nothing), then adopts the task's input files (file rows of that same account, so they
 * are only ever locked by a statement already holding the account row); settlement (services/tasks/settlement.ts) updates the task first, then settles
 * the hold here: hold, then key and account (only when credits come back), then one spend shard
 * (what it captured). Admin grants and debits touch the account row alone.
 */
import { sql, type Insertable, type Kysely, type RawBuilder, type Selectable } from 'kysely';
import type { DB, ImageTasks, VideoTasks } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';
import { columnsOf, identifierList, runPrepared } from '../db/prepared.ts';

export interface HoldRequest {
  holdId: string;
  accountId: string;
  apiKeyId: string;
  taskId: string;
  /** Micro-credits, > 0. */
  amount: number;
  /**
   * Caps on generations in flight (`null`: none) of the key and of its account, checked in the
   * same statement, exactly across instances (mg_in_flight_gate in the client-limits migration).
   */
  inFlightCaps?: { key: number | null; account: number | null };
}

/** The task row inserted together with the hold. */
export type TaskInsert = { table: 'videoTasks'; row: Insertable<VideoTasks> } | { table: 'imageTasks'; row: Insertable<ImageTasks> };

/**
 * The input files the task uses, adopted when (and only when) the task is inserted: inputs staged
 * by the request get the task's id and are kept `pinSeconds` (the task's lifetime and a margin)
 * plus their retention — the account's `input_retention_days`, else `retentionDays`
 * (INPUT_RETENTION_DAYS); other files of the account (uploads) keep at least `pinSeconds` more,
 * so they outlive the task.
 */
export interface InputAdoption {
  fileIds: readonly string[];
  pinSeconds: number;
  retentionDays: number;
}

/**
 * How the hold's commit waits for the disk. `flushed` (PostgreSQL's default) answers once the
 * commit is in the WAL on disk. `unflushed` runs the statement with `synchronous_commit = off`: the
 * hold is visible to every other statement the moment it commits (the balance and quota guards
 * work exactly as before; nobody can spend the same credits twice), but the WAL writer flushes it
 * a moment later (within 3 × wal_writer_delay, 0.6 s by default) instead of before the answer: no
 * disk flush on the way to the upstream, and on a busy key the account row's lock is released
 * without waiting for one (`npm run bench -- hold`: 1.41x the holds per second with 32 callers,
 * p99 2.2 → 1.8 ms alone). Should PostgreSQL itself crash in
 * that window, the hold, its ledger row and the task are forgotten together (never in part), as if
 * the request had not been made. Any later flushed commit (the settlement) flushes it too.
 * Only for a task that lives and dies with its request: a synchronous image. Should PostgreSQL
 * crash before its settlement, that request ends uncharged whether its hold was flushed or not (a
 * flushed hold is released when the task's lease runs out; an unflushed one is gone), and its JSON
 * answer is only written after the settlement. Never for a task the client is given to poll
 * (videos, `respond-async` images).
 */
export type HoldCommit = 'flushed' | 'unflushed';

export type HoldOutcome = 'ok' | 'key_quota_exceeded' | 'insufficient_balance' | 'key_too_many_in_flight' | 'account_too_many_in_flight';

/** What the hold statement did, and with `ok` the task row as inserted (no second read). */
export interface HoldResult<T extends TaskInsert> {
  outcome: HoldOutcome;
  task?: Selectable<DB[T['table']]>;
}

/** SQLSTATE raised by mg_abort() (see the tasks migration). */
const ABORT_SQLSTATE = 'MG001';

const snake = (name: string) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** Column and value lists of a typed row, for the raw INSERT … SELECT of the hold statement (the column list is built once per set of fields). */
function columnList(row: Record<string, unknown>): { columns: RawBuilder<unknown>; values: RawBuilder<unknown> } {
  const names = Object.keys(row).filter((n) => row[n] !== undefined);
  const key = names.join();
  let columns = columnLists.get(key);
  if (!columns) {
    columns = identifierList(names.map(snake));
    columnLists.set(key, columns);
  }
  return { columns, values: sql.join(names.map((n) => row[n])) };
}

/** Column lists by field set: bounded by the task rows the code builds (a few). */
const columnLists = new Map<string, RawBuilder<unknown>>();

export class LedgerRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /**
   * Places the hold and inserts the task in one statement (a prepared statement: db/prepared.ts).
   * Returns which gate failed, if any (on failure nothing at all was written), and the inserted task row. A unique violation on the task
   * (an idempotent retry racing this one) propagates as the pg error (23505) with nothing written.
   */
  async holdAndInsertTask<T extends TaskInsert>(
    hold: HoldRequest,
    task: T,
    inputs: InputAdoption = { fileIds: [], pinSeconds: 0, retentionDays: 0 },
    commit: HoldCommit = 'flushed',
  ): Promise<HoldResult<T>> {
    type Row = Selectable<DB[T['table']]> & { outcome: HoldOutcome };
    const result = (rows: Row[]): HoldResult<T> => {
      const { outcome, ...row } = rows[0]!;
      return outcome === 'ok' ? { outcome, task: row as unknown as Selectable<DB[T['table']]> } : { outcome };
    };
    const sqlTable = snake(task.table) as 'video_tasks' | 'image_tasks';
    const table = sql.table(sqlTable);
    const { columns, values } = columnList(task.row as Record<string, unknown>);
    const adopt =
      inputs.fileIds.length === 0
        ? sql``
        : sql`, f as (
            update files set
              task_id = case when purpose = 'input' and task_id is null then ${hold.taskId} else task_id end,
              expires_at = case
                when purpose = 'input' and task_id is null then now() + ${inputs.pinSeconds} * interval '1 second'
                  + coalesce((select a.input_retention_days from accounts a where a.id = ${hold.accountId}), ${inputs.retentionDays}::int) * interval '1 day'
                when expires_at is null then null
                else greatest(expires_at, now() + ${inputs.pinSeconds} * interval '1 second') end
            where id = any(${[...inputs.fileIds]}::text[]) and account_id = ${hold.accountId} and exists (select 1 from t)
            returning id
          )`;
    // set_config(…, true) lasts until the end of the statement's own transaction, whose commit reads it.
    const unflushed = commit === 'unflushed' ? sql` cross join (select set_config('synchronous_commit', 'off', true)) c` : sql``;
    // With a cap on generations in flight, the gate comes first (its locks before the rows' locks)
    // and everything else is written only when it lets the task in. Without one the statement is as it was.
    const caps = hold.inFlightCaps;
    const gated = caps !== undefined && (caps.key !== null || caps.account !== null);
    const gate = gated ? sql`g as (select mg_in_flight_gate(${hold.accountId}, ${hold.apiKeyId}, ${caps.key}::int, ${caps.account}::int) as outcome), ` : sql``;
    const gateOpen = gated ? sql` and exists (select 1 from g where g.outcome = 'ok')` : sql``;
    const gateOutcome = gated ? sql`when (select g.outcome from g) <> 'ok' then (select g.outcome from g)` : sql``;
    if (hold.amount === 0) {
      // A free generation needs no reservation.
      if (!gated) {
        return result(await runPrepared(sql<Row>`with t as (insert into ${table} (${columns}) values (${values}) returning ${columnsOf(sqlTable)}) ${adopt} select 'ok' as outcome, t.* from t${unflushed}`, this.db));
      }
      return result(
        await runPrepared(
          sql<Row>`with ${gate}t as (insert into ${table} (${columns}) select ${values} where true${gateOpen} returning ${columnsOf(sqlTable)}) ${adopt}
            select o.outcome, t.* from (select case ${gateOutcome} else 'ok' end as outcome) o left join t on true${unflushed}`,
          this.db,
        ),
      );
    }
    try {
      const held = await runPrepared(sql<Row>`
        with ${gate}k as (
          update api_keys set credits_used = credits_used + ${hold.amount}
          where id = ${hold.apiKeyId} and (credit_limit is null or credits_used + ${hold.amount} <= credit_limit)${gateOpen}
          returning id
        ), a as (
          update accounts set balance = balance - ${hold.amount}
          where id = ${hold.accountId} and balance >= ${hold.amount} and exists (select 1 from k)
          returning id
        ), h as (
          insert into credit_holds (id, account_id, api_key_id, task_id, amount)
          select ${hold.holdId}, ${hold.accountId}, ${hold.apiKeyId}, ${hold.taskId}, ${hold.amount}
          where exists (select 1 from a)
          returning id
        ), l as (
          insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id)
          select ${hold.accountId}, ${hold.apiKeyId}, h.id, 'hold', ${hold.amount}, ${hold.taskId} from h
          returning id
        ), t as (
          insert into ${table} (${columns})
          select ${values} where exists (select 1 from h)
          returning ${columnsOf(sqlTable)}
        ) ${adopt}
        select o.outcome, t.* from (
          select case ${gateOutcome}
            when not exists (select 1 from k) then 'key_quota_exceeded'
            when not exists (select 1 from a) then mg_abort('insufficient_balance')
            when not exists (select 1 from t) then mg_abort('task_not_inserted')
            else 'ok'
          end as outcome
        ) o left join t on true${unflushed}`, this.db);
      return result(held);
    } catch (err) {
      if ((err as { code?: string }).code === ABORT_SQLSTATE && (err as Error).message === 'insufficient_balance') return { outcome: 'insufficient_balance' };
      throw err;
    }
  }

  /**
   * Settles a hold exactly once: captures `capture` micro-credits (0 releases everything) and gives
   * the rest back to the key quota and the balance (in the lock order above). Returns false when
   * the hold was already settled (or does not exist), in which case nothing changed.
   */
  settle(holdId: string, capture: number, db: Executor): Promise<boolean> {
    return this.settleWhere(sql`id = ${holdId}`, capture, db);
  }

  /** `settle` for the hold of a task (one statement: no lookup of the hold id first). */
  settleForTask(taskId: string, capture: number, db: Executor): Promise<boolean> {
    return this.settleWhere(sql`task_id = ${taskId}`, capture, db);
  }

  private async settleWhere(which: RawBuilder<unknown>, capture: number, db: Executor): Promise<boolean> {
    const settle = this.settlement(which, capture);
    const result = await sql<{ settled: boolean }>`with ${settle.ctes} select ${settle.settled} as settled`.execute(db);
    return result.rows[0]?.settled === true;
  }

  /**
   * The settlement as common table expressions (h, k, a, s, lc, lr) of the hold `which` selects:
   * for a statement of its own, or one that also finishes the task (see VideoTaskRepository.finish).
   * The key's and the account's rows are updated only when credits come back (the hold was not
   * captured whole): a whole capture changes neither, and leaves both unlocked, so one key's
   * settlements do not wait for each other's commits. What is captured goes to one of the account's
   * spend shards (`account_spend`, migration spend-shards), after the account's row (`s` reads `a`).
   * `settled` is true when the hold was updated, and the key and the account too where credits came
   * back; reading it reads the CTEs in lock order (h, k, a), and PostgreSQL runs them as they are read.
   */
  settlement(which: RawBuilder<unknown>, capture: number): { ctes: RawBuilder<unknown>; settled: RawBuilder<boolean> } {
    const ctes = sql`h as (
        update credit_holds
        set status = case when ${capture}::bigint > 0 then 'captured' else 'released' end,
            captured = ${capture}, settled_at = now()
        where ${which} and status = 'held' and ${capture}::bigint between 0 and amount
        returning id, account_id, api_key_id, task_id, amount, captured
      ), k as (
        update api_keys set credits_used = credits_used - (h.amount - h.captured)
        from h where api_keys.id = h.api_key_id and h.amount > h.captured
        returning api_keys.id
      ), a as (
        update accounts set balance = balance + (h.amount - h.captured)
        from h where accounts.id = h.account_id and h.amount > h.captured
        returning accounts.id
      ), s as (
        insert into account_spend (account_id, shard, spent)
        select h.account_id, floor(random() * 16)::smallint, h.captured from h
        where h.captured > 0 and (h.amount = h.captured or exists (select 1 from a))
        on conflict (account_id, shard) do update set spent = account_spend.spent + excluded.spent
        returning account_id
      ), lc as (
        insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id)
        select account_id, api_key_id, id, 'capture', captured, task_id from h where captured > 0
        returning id
      ), lr as (
        insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id)
        select account_id, api_key_id, id, 'release', amount - captured, task_id from h where amount > captured
        returning id
      )`;
    return {
      ctes,
      settled: sql<boolean>`(exists (select 1 from h) and (exists (select 1 from h where amount = captured) or (exists (select 1 from k) and exists (select 1 from a))) and (exists (select 1 from h where captured = 0) or exists (select 1 from s)))`,
    };
  }

  findHoldByTask(taskId: string) {
    return this.db.selectFrom('creditHolds').select(['id', 'amount', 'status', 'captured']).where('taskId', '=', taskId).executeTakeFirst();
  }
}
