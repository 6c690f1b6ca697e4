/**
 * The credit hot path (design §5). A hold reserves credits on the key quota and the account balance
 * with guarded conditional updates (which also refuse a key deactivated or an account suspended
 * since the request was authenticated) and inserts the task row, all in ONE statement: atomic without
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
 * (what it captured). Admin grants and debits touch the account row alone (one with an idempotency key first claims its
 * credit_adjustment_keys row, which nothing else locks).
 */
import { sql, type Insertable, type Kysely, type RawBuilder, type Selectable } from 'kysely';
import type { DB, ImageTasks, VideoTasks } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';
import { columnsOf, fieldList, runPrepared, snake } from '../db/prepared.ts';
import { StatementBatcher, type BatcherOptions, type BatchStats } from '../db/statement-batcher.ts';

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

/**
 * The task row inserted together with the hold. `leaseMs`: the row is leased (to its `leaseOwner`)
 * until the database's `now()` plus this: a lease set from this process's clock would be judged
 * against the database's, and a clock behind it by more than the lease would leave the row free
 * to be claimed at once.
 */
export type TaskInsert =
  | { table: 'videoTasks'; row: Insertable<VideoTasks> }
  | { table: 'imageTasks'; row: Omit<Insertable<ImageTasks>, 'leaseExpiresAt'>; leaseMs?: number };

/** `lease_expires_at` of a row leased for `leaseMs` from the database's clock. */
const leaseUntil = (leaseMs: number) => sql`now() + ${leaseMs} * interval '1 millisecond'`;

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

/**
 * `input_files_gone`: a file the task names was deleted (or expired) after it was resolved.
 * `api_key_inactive`, `account_suspended`: the key was deactivated, or its account suspended, after
 * the request was authenticated (a body can stream for minutes). On any outcome but `ok` nothing was written.
 */
export type HoldOutcome =
  | 'ok'
  | 'api_key_inactive'
  | 'account_suspended'
  | 'key_quota_exceeded'
  | 'insufficient_balance'
  | 'key_too_many_in_flight'
  | 'account_too_many_in_flight'
  | 'input_files_gone';

/** The refusals the hold statement raises with mg_abort (after it wrote a row the abort takes back). */
const ABORTED_OUTCOMES: ReadonlySet<string> = new Set<HoldOutcome>(['account_suspended', 'insufficient_balance', 'input_files_gone']);

/** What the hold statement did, and with `ok` the task row as inserted (no second read). */
export interface HoldResult<T extends TaskInsert> {
  outcome: HoldOutcome;
  task?: Selectable<DB[T['table']]>;
}

/** SQLSTATE raised by mg_abort() (see the tasks migration). */
const ABORT_SQLSTATE = 'MG001';

/** The fields of a typed row that have a value (undefined: the column's default). */
const fieldsOf = (row: Record<string, unknown>): string[] => Object.keys(row).filter((n) => row[n] !== undefined);

/** The SQL column list of a set of fields, built once per set. */
function columnsFor(names: readonly string[]): RawBuilder<unknown> {
  const key = names.join();
  let columns = columnLists.get(key);
  if (!columns) {
    columns = fieldList(names);
    columnLists.set(key, columns);
  }
  return columns;
}

/** Column and value lists of a typed row (leased for `leaseMs`), for the raw INSERT … SELECT of the hold statement. */
function columnList(row: Record<string, unknown>, leaseMs: number | undefined): { columns: RawBuilder<unknown>; values: RawBuilder<unknown> } {
  const names = fieldsOf(row);
  if (leaseMs === undefined) return { columns: columnsFor(names), values: sql.join(names.map((n) => row[n])) };
  return { columns: columnsFor([...names, 'leaseExpiresAt']), values: sql.join([...names.map((n) => row[n]), leaseUntil(leaseMs)]) };
}

/** Column lists by field set: bounded by the task rows the code builds (a few). */
const columnLists = new Map<string, RawBuilder<unknown>>();

/** A hold the batch statement can carry (see `holdAndInsertTask`). */
interface BatchedHold {
  hold: HoldRequest;
  task: Extract<TaskInsert, { table: 'imageTasks' }>;
}

/** Group commit of holds (db/statement-batcher.ts): the default, and `false` for one statement per hold. */
export const DEFAULT_HOLD_BATCHING: BatcherOptions = { maxInFlight: 1, maxBatch: 32 };

/**
 * How long the holds of a key or an account whose hold was just refused run alone (unless one of
 * them passes first). A client that keeps sending images it has no credits for would otherwise join
 * every batch and make it fall back (all or nothing): every request of the instance one statement
 * each, plus the batch that failed. Each refusal starts the time again.
 */
const REFUSED_ALONE_MS = 1_000;
/** Most keys and accounts remembered as refused; the oldest are forgotten first. */
const REFUSED_MAX = 1_024;
/** The refusals that are the key's (the others, of a batchable hold, are its account's). */
const KEY_REFUSALS: ReadonlySet<HoldOutcome> = new Set<HoldOutcome>(['api_key_inactive', 'key_quota_exceeded', 'key_too_many_in_flight']);

export class LedgerRepository {
  constructor(
    private readonly db: Kysely<DB>,
    private readonly batching: BatcherOptions | false = DEFAULT_HOLD_BATCHING,
  ) {}

  /** One batcher per column set of the task rows (the batch statement lists the columns once). */
  private readonly holdBatchers = new Map<string, StatementBatcher<BatchedHold, HoldResult<BatchedHold['task']>>>();

  /** `k:<key id>` and `a:<account id>` refused lately, until when their holds run alone (REFUSED_ALONE_MS); in expiry order. */
  private readonly refused = new Map<string, number>();

  /**
   * Places the hold and inserts the task in one statement (a prepared statement: db/prepared.ts).
   * Returns which gate failed, if any (on failure nothing at all was written), and the inserted task row. A unique violation on the task
   * (an idempotent retry racing this one) propagates as the pg error (23505) with nothing written.
   *
   * The holds of synchronous images (unflushed, priced, no cap on generations in flight, no input
   * files to adopt) that arrive together share one statement (`holdMany`, group commit); any other
   * hold, every hold of a batch that did not go through whole, and for a moment those of a key or
   * account whose hold was just refused (REFUSED_ALONE_MS), runs its own.
   */
  async holdAndInsertTask<T extends TaskInsert>(
    hold: HoldRequest,
    task: T,
    inputs: InputAdoption = { fileIds: [], pinSeconds: 0, retentionDays: 0 },
    commit: HoldCommit = 'flushed',
  ): Promise<HoldResult<T>> {
    const caps = hold.inFlightCaps;
    const batchable =
      this.batching !== false &&
      task.table === 'imageTasks' &&
      commit === 'unflushed' &&
      hold.amount > 0 &&
      inputs.fileIds.length === 0 &&
      (caps === undefined || (caps.key === null && caps.account === null));
    if (!batchable) return this.holdOne(hold, task, inputs, commit);
    // One batch statement per column set and lease (its text lists the columns once, and the lease is one parameter).
    const key = `${fieldsOf(task.row as Record<string, unknown>).join()};${task.leaseMs ?? ''}`;
    let batcher = this.holdBatchers.get(key);
    if (!batcher) {
      batcher = new StatementBatcher<BatchedHold, HoldResult<BatchedHold['task']>>(
        { one: (b) => this.holdAlone(b), many: (bs) => this.holdMany(bs) },
        this.batching as BatcherOptions,
      );
      this.holdBatchers.set(key, batcher);
    }
    const item = { hold, task: task as BatchedHold['task'] };
    return (this.refusedLately(hold) ? batcher.alone(item) : batcher.run(item)) as Promise<HoldResult<T>>;
  }

  /** A batchable hold in its own statement, remembering a refusal of its key or account (REFUSED_ALONE_MS). */
  private async holdAlone(b: BatchedHold): Promise<HoldResult<BatchedHold['task']>> {
    let result: HoldResult<BatchedHold['task']>;
    try {
      result = await this.holdOne(b.hold, b.task, undefined, 'unflushed');
    } catch (err) {
      // A batch whose commit went through while its answer was lost (the connection dropped): this
      // rerun of one of its holds meets its own rows (the hold's and the task's ids are drawn per
      // request). Its hold is placed: the request goes on with its task, as the batch would have.
      const placed = isUniqueViolation(err) ? await this.placedBy(b) : undefined;
      if (!placed) throw err;
      return { outcome: 'ok', task: placed };
    }
    if (result.outcome === 'ok') {
      if (this.refused.size > 0) {
        this.refused.delete(`k:${b.hold.apiKeyId}`);
        this.refused.delete(`a:${b.hold.accountId}`);
      }
      return result;
    }
    const now = Date.now();
    const name = KEY_REFUSALS.has(result.outcome) ? `k:${b.hold.apiKeyId}` : `a:${b.hold.accountId}`;
    this.refused.delete(name);
    this.refused.set(name, now + REFUSED_ALONE_MS);
    // Insertion order is expiry order: forget the expired, and the oldest past the bound.
    for (const [n, until] of this.refused) {
      if (until > now && this.refused.size <= REFUSED_MAX) break;
      this.refused.delete(n);
    }
    return result;
  }

  /** The task row of a batchable hold that is already placed (its task inserted, its hold held under it), if so. */
  private async placedBy(b: BatchedHold): Promise<Selectable<ImageTasks> | undefined> {
    const taskId = String(b.task.row.id);
    return this.db
      .selectFrom('imageTasks')
      .selectAll()
      .where('id', '=', taskId)
      .where('accountId', '=', b.hold.accountId)
      .where(({ exists, selectFrom }) => exists(selectFrom('creditHolds').select('id').where('id', '=', b.hold.holdId).where('taskId', '=', taskId).where('status', '=', 'held')))
      .executeTakeFirst();
  }

  /** Whether the hold's key or account was refused within REFUSED_ALONE_MS (and has not passed a hold since). */
  private refusedLately(hold: HoldRequest): boolean {
    if (this.refused.size === 0) return false;
    const now = Date.now();
    return (this.refused.get(`k:${hold.apiKeyId}`) ?? 0) > now || (this.refused.get(`a:${hold.accountId}`) ?? 0) > now;
  }

  /** What the hold batchers did (statements, holds they carried, fallbacks), for the bench and tests. */
  holdBatchStats(): BatchStats {
    const sum: BatchStats = { batches: 0, batched: 0, singles: 0, fallbacks: 0 };
    for (const b of this.holdBatchers.values()) for (const k of Object.keys(sum) as (keyof BatchStats)[]) sum[k] += b.stats[k];
    return sum;
  }

  /**
   * The holds of several synchronous images in one statement, unflushed, all or nothing: the
   * statement writes what the single statements would have written one after the other, or (when
   * any key is inactive or its quota cannot cover its share of the batch, any account is suspended
   * or its balance cannot cover its share, or any row fails) raises and writes nothing, and the
   * batcher runs each hold alone (which tells which refusal it met). Keys and then accounts
   * are locked in id order before they are updated (the lock order of this file, and no deadlock
   * between two batches), with the lock an UPDATE takes (`for no key update`: the foreign-key checks
   * of concurrent settlements, `for key share`, do not wait for it).
   */
  private async holdMany(items: readonly BatchedHold[]): Promise<HoldResult<BatchedHold['task']>[]> {
    const names = fieldsOf(items[0]!.task.row as Record<string, unknown>);
    // The batch's rows share one lease (the batcher's key), from the database's clock.
    const leaseMs = items[0]!.task.leaseMs;
    const columns = columnsFor(names);
    const insertColumns = leaseMs === undefined ? columns : columnsFor([...names, 'leaseExpiresAt']);
    const selected = leaseMs === undefined ? columns : sql`${columns}, ${leaseUntil(leaseMs)}`;
    const holds = JSON.stringify(
      items.map(({ hold: h }) => ({ hold_id: h.holdId, account_id: h.accountId, api_key_id: h.apiKeyId, task_id: h.taskId, amount: h.amount })),
    );
    // jsonb_populate_recordset reads each field as its column's type; `params` is JSON text in the row.
    const tasks = JSON.stringify(
      items.map(({ task: { row } }) => {
        const out: Record<string, unknown> = {};
        for (const n of names) {
          const v = (row as Record<string, unknown>)[n];
          out[snake(n)] = n === 'params' && typeof v === 'string' ? JSON.parse(v) : v;
        }
        return out;
      }),
    );
    type Row = Selectable<ImageTasks> & { guard: string };
    const rows = await runPrepared(sql<Row>`
      with r as (
        select * from jsonb_to_recordset(${holds}::jsonb) as r(hold_id text, account_id text, api_key_id text, task_id text, amount bigint)
      ), kk as (
        select api_key_id, sum(amount) as s from r group by api_key_id
      ), kl as (
        select id from api_keys where id in (select api_key_id from kk) order by id for no key update
      ), k as (
        update api_keys set credits_used = credits_used + kk.s from kk
        where api_keys.id = kk.api_key_id and is_active and (credit_limit is null or credits_used + kk.s <= credit_limit)
          and (select count(*) from kl) = (select count(*) from kk)
        returning api_keys.id
      ), aa as (
        select account_id, sum(amount) as s from r group by account_id
      ), al as (
        select id from accounts where id in (select account_id from aa) and (select count(*) from k) = (select count(*) from kk) order by id for no key update
      ), a as (
        update accounts set balance = balance - aa.s from aa
        where accounts.id = aa.account_id and status = 'active' and balance >= aa.s and (select count(*) from al) = (select count(*) from aa)
        returning accounts.id
      ), h as (
        insert into credit_holds (id, account_id, api_key_id, task_id, amount)
        select hold_id, account_id, api_key_id, task_id, amount from r
        where (select count(*) from a) = (select count(*) from aa)
        returning id, account_id, api_key_id, task_id, amount
      ), l as (
        insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id)
        select account_id, api_key_id, id, 'hold', amount, task_id from h
        returning id
      ), t as (
        insert into image_tasks (${insertColumns})
        select ${selected} from jsonb_populate_recordset(null::image_tasks, ${tasks}::jsonb)
        where (select count(*) from h) = (select count(*) from r)
        returning ${columnsOf('image_tasks')}
      )
      select o.guard, t.* from (
        select case when (select count(*) from t) <> (select count(*) from r) then mg_abort('batch_refused') else 'ok' end as guard
      ) o left join t on true cross join (select set_config('synchronous_commit', 'off', true)) c`, this.db);
    const byId = new Map(rows.map(({ guard: _guard, ...task }) => [task.id, task as Selectable<ImageTasks>]));
    return items.map(({ task }) => {
      const row = byId.get(task.row.id as string);
      if (!row) throw new Error(`the batch statement did not return task ${String(task.row.id)}`);
      return { outcome: 'ok' as const, task: row };
    });
  }

  private async holdOne<T extends TaskInsert>(hold: HoldRequest, task: T, inputs: InputAdoption = { fileIds: [], pinSeconds: 0, retentionDays: 0 }, commit: HoldCommit = 'flushed'): Promise<HoldResult<T>> {
    type Row = Selectable<DB[T['table']]> & { outcome: HoldOutcome };
    const result = (rows: Row[]): HoldResult<T> => {
      const { outcome, ...row } = rows[0]!;
      return outcome === 'ok' ? { outcome, task: row as unknown as Selectable<DB[T['table']]> } : { outcome };
    };
    const sqlTable = snake(task.table) as 'video_tasks' | 'image_tasks';
    const table = sql.table(sqlTable);
    const { columns, values } = columnList(task.row as Record<string, unknown>, task.table === 'imageTasks' ? task.leaseMs : undefined);
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
            -- An expired file is not adopted: the media sweeper may be deleting its bytes. The clock
            -- is read as the row is locked, not at the statement's start (now()): a hold that waited
            -- on the account's lock would judge the file by a time before the sweeper read it.
            where id = any(${[...inputs.fileIds]}::text[]) and account_id = ${hold.accountId} and (expires_at is null or expires_at > clock_timestamp())
              and exists (select 1 from t)
            returning id
          )`;
    // Every file the task names is adopted, or nothing is written: a file deleted (or expired) since
    // it was resolved would leave a task whose submit can never read its inputs.
    const inputsGone =
      inputs.fileIds.length === 0 ? sql`` : sql`when (select count(*) from f) <> ${new Set(inputs.fileIds).size} then mg_abort('input_files_gone') `;
    // set_config(…, true) lasts until the end of the statement's own transaction, whose commit reads it.
    const unflushed = commit === 'unflushed' ? sql` cross join (select set_config('synchronous_commit', 'off', true)) c` : sql``;
    // With a cap on generations in flight, the gate comes first (its locks before the rows' locks)
    // and everything else is written only when it lets the task in. Without one the statement is as it was.
    const caps = hold.inFlightCaps;
    const gated = caps !== undefined && (caps.key !== null || caps.account !== null);
    const gate = gated ? sql`g as (select mg_in_flight_gate(${hold.accountId}, ${hold.apiKeyId}, ${caps.key}::int, ${caps.account}::int) as outcome), ` : sql``;
    const gateOpen = gated ? sql` and exists (select 1 from g where g.outcome = 'ok')` : sql``;
    const gateOutcome = gated ? sql`when (select g.outcome from g) <> 'ok' then (select g.outcome from g)` : sql``;
    try {
      if (hold.amount === 0) {
        // A free generation needs no reservation, only a key and an account still in use (the
        // request was authenticated before its body arrived, maybe minutes ago): read, not locked.
        const keyActive = sql`exists (select 1 from api_keys where id = ${hold.apiKeyId} and is_active)`;
        const accountActive = sql`exists (select 1 from accounts where id = ${hold.accountId} and status = 'active')`;
        return result(
          await runPrepared(
            sql<Row>`with ${gate}t as (insert into ${table} (${columns}) select ${values} where ${keyActive} and ${accountActive}${gateOpen} returning ${columnsOf(sqlTable)}) ${adopt}
              select o.outcome, t.* from (
                select case when not ${keyActive} then 'api_key_inactive' when not ${accountActive} then 'account_suspended' ${gateOutcome} ${inputsGone}else 'ok' end as outcome
              ) o left join t on true${unflushed}`,
            this.db,
          ),
        );
      }
      // Why a refused hold was refused, read on refusals only, never on the hot path. The guards of
      // k and a judged the rows' newest versions (an UPDATE waits for a concurrent change and
      // re-checks it), which this statement's snapshot may predate: the key (the client's own row)
      // is read `for share`, which waits and re-reads likewise (`for key share` would not: a change
      // of is_active is no key update). The account, which every key of it shares, is read without
      // a lock first, and `for share` only when that read cannot explain the refusal (the snapshot
      // shows it active with the balance to cover the hold): a client looping on its refusals never
      // holds up the holds of the account's other keys.
      const keyInactive = sql`(select not is_active from api_keys where id = ${hold.apiKeyId} for share)`;
      const accountSuspended = sql`(select status <> 'active' from accounts where id = ${hold.accountId})`;
      const balanceShort = sql`(select balance < ${hold.amount} from accounts where id = ${hold.accountId})`;
      const accountSuspendedSince = sql`(select status <> 'active' from accounts where id = ${hold.accountId} for share)`;
      const held = await runPrepared(sql<Row>`
        with ${gate}k as (
          update api_keys set credits_used = credits_used + ${hold.amount}
          where id = ${hold.apiKeyId} and is_active and (credit_limit is null or credits_used + ${hold.amount} <= credit_limit)${gateOpen}
          returning id
        ), a as (
          update accounts set balance = balance - ${hold.amount}
          where id = ${hold.accountId} and status = 'active' and balance >= ${hold.amount} and exists (select 1 from k)
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
          select case
            when not exists (select 1 from k) then case
              when ${keyInactive} then 'api_key_inactive' when ${accountSuspended} then 'account_suspended' ${gateOutcome} else 'key_quota_exceeded' end
            when not exists (select 1 from a) then mg_abort(case
              when ${accountSuspended} then 'account_suspended' when ${balanceShort} then 'insufficient_balance'
              when ${accountSuspendedSince} then 'account_suspended' else 'insufficient_balance' end)
            when not exists (select 1 from t) then mg_abort('task_not_inserted')
            ${inputsGone}else 'ok'
          end as outcome
        ) o left join t on true${unflushed}`, this.db);
      return result(held);
    } catch (err) {
      if ((err as { code?: string }).code === ABORT_SQLSTATE && ABORTED_OUTCOMES.has((err as Error).message)) return { outcome: (err as Error).message as HoldOutcome };
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
  /** `reason`: an operator's, written on the capture and release entries (a settlement by hand). */
  settleForTask(taskId: string, capture: number, db: Executor, reason?: string): Promise<boolean> {
    return this.settleWhere(sql`task_id = ${taskId}`, capture, db, reason);
  }

  private async settleWhere(which: RawBuilder<unknown>, capture: number, db: Executor, reason?: string): Promise<boolean> {
    const settle = this.settlement(which, capture, reason);
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
  settlement(which: RawBuilder<unknown>, capture: number, reason?: string): { ctes: RawBuilder<unknown>; settled: RawBuilder<boolean> } {
    // Only an operator's settlement has a reason: the engines' statements keep their text (and their prepared plans).
    const reasonColumn = reason === undefined ? sql`` : sql`, reason`;
    const reasonValue = reason === undefined ? sql`` : sql`, ${reason}::text`;
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
        insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id${reasonColumn})
        select account_id, api_key_id, id, 'capture', captured, task_id${reasonValue} from h where captured > 0
        returning id
      ), lr as (
        insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id${reasonColumn})
        select account_id, api_key_id, id, 'release', amount - captured, task_id${reasonValue} from h where amount > captured
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

/** PostgreSQL's unique_violation (23505). */
function isUniqueViolation(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === '23505' && typeof (err as { severity?: unknown }).severity === 'string';
}
