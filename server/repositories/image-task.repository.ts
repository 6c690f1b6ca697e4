/**
 * All Kysely code for image tasks. Like video tasks, leasing is the shared LeasedTasks helper and
 * every write of a worker (or of the request that runs a synchronous task) is fenced by the attempt
 * it holds; a terminal transition is one statement that also settles the hold (and writes the rows of
 * the files it delivered), built by Settlement.
 */
import { sql, type Kysely, type RawBuilder, type Selectable } from 'kysely';
import type { DB, ImageTasks } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';
import { fieldList, runPrepared } from '../db/prepared.ts';
import { StatementBatcher, type BatcherOptions, type BatchStats } from '../db/statement-batcher.ts';
import { afterExists, pageConditions, pageOrder, type AccountPage } from './account-pages.ts';
import { FileRepository, type FileRow } from './file.repository.ts';
import { LeasedTasks, type Fence, type HoldSettlement } from './leased-tasks.ts';
import { TaskAttemptRepository, type AttemptRecord } from './task-attempt.repository.ts';

export type ImageTaskRow = Selectable<ImageTasks>;

/** A stored result of a task, for writing it as `b64_json` from the store. */
export interface StoredResult {
  storageKey: string;
  bytes: number;
}

/** A task as its lookup shows it: with when its first stored image is deleted (null: none stored). */
export type LookedUpImageTaskRow = ImageTaskRow & { mediaExpiresAt: Date | null };

/**
 * What a poll reads of a task (GET /v1/images/{task_id}), and so all its lookup shape may read
 * (ImageService.toImageTask takes these fields), as the video poll (video-task.repository.ts).
 */
const POLLED_FIELDS = [
  'id', 'status', 'model', 'createdAt', 'completedAt', 'errorCode', 'errorMessage', 'params', 'resultFileIds', 'revisedPrompt',
  'n', 'unitPrice', 'quotedCredits', 'actualCredits', 'delivered',
] as const satisfies readonly (keyof ImageTaskRow)[];

export type PolledImageTaskRow = Pick<ImageTaskRow, (typeof POLLED_FIELDS)[number]> & { mediaExpiresAt: Date | null };

const POLLED_COLUMNS = fieldList(POLLED_FIELDS);

/** A listed task; `storedResults` (in `result_file_ids` order) for a completed `b64_json` task only. */
export type ListedImageTaskRow = LookedUpImageTaskRow & { storedResults: StoredResult[] | null };

const mediaExpiresAt = sql<Date | null>`(select min(f.expires_at) from files f where f.id = any(image_tasks.result_file_ids))`.as('mediaExpiresAt');

/** A completion that captures its whole hold (every image delivered), which the batch statement can carry. */
export interface WholeCompletion {
  fence: Fence;
  fileIds: string[];
  /** The task's quoted credits, all captured (> 0). */
  actualCredits: number;
  revisedPrompt: string | null;
  unrecorded: readonly FileRow[];
  attempts: readonly AttemptRecord[];
}

/** Group commit of whole completions (db/statement-batcher.ts): the default, and `false` for one statement each. */
export const DEFAULT_COMPLETION_BATCHING: BatcherOptions = { maxInFlight: 1, maxBatch: 32 };

export class ImageTaskRepository {
  readonly leases: LeasedTasks<'imageTasks'>;

  private readonly files: FileRepository;

  private readonly completions: StatementBatcher<WholeCompletion & { settle: HoldSettlement }, boolean> | undefined;

  constructor(
    private readonly db: Kysely<DB>,
    batching: BatcherOptions | false = DEFAULT_COMPLETION_BATCHING,
  ) {
    // A step counts a try its worker cut short during the upstream call itself (`releaseMember` with `cutCall`),
    // so a reschedule that is no failure (every member busy) keeps `retries`, never starts it again.
    this.leases = new LeasedTasks(db, { table: 'imageTasks', sqlTable: 'image_tasks', active: ['processing'], recordsErrors: true, stepsCountRetries: true });
    this.files = new FileRepository(db);
    this.completions =
      batching === false
        ? undefined
        : new StatementBatcher(
            {
              // After a batch that failed, a task its statement completed after all (the commit went
              // through, its answer was lost with the connection) is recognized, not taken as lost.
              one: async (c) => (await this.complete(c.fence, c, c.settle, c.attempts)) || (await this.completedAt(c.fence)),
              many: (cs) => this.completeMany(cs),
            },
            batching,
          );
  }

  /**
   * Whether the task was completed at this fence's attempt: only that attempt's worker completes it
   * then, so its own statement did (a batch whose commit went through while its answer was lost).
   */
  private async completedAt(fence: Fence): Promise<boolean> {
    const row = await this.db.selectFrom('imageTasks').select('id').where('id', '=', fence.id).where('attempt', '=', fence.attempt).where('status', '=', 'completed').executeTakeFirst();
    return row !== undefined;
  }

  /** What the completion batcher did (statements, completions they carried, fallbacks), for the bench and tests. */
  completionBatchStats(): BatchStats {
    return { ...(this.completions?.stats ?? { batches: 0, batched: 0, singles: 0, fallbacks: 0 }) };
  }

  /**
   * `complete` for a task that delivered every image it was quoted for (its hold captured whole):
   * completions that arrive together share one statement (`completeMany`, group commit); `settle`
   * is the single statement's settlement, for a completion that runs alone.
   */
  completeWhole(completion: WholeCompletion, settle: HoldSettlement): Promise<boolean> {
    if (!this.completions) return this.complete(completion.fence, completion, settle, completion.attempts);
    return this.completions.run({ ...completion, settle });
  }

  /**
   * Several whole completions in one statement, with a flushed commit: what `complete` with
   * LedgerRepository.settlement does for each, for all of them (the fenced task updates, the holds
   * captured whole, the ledger's capture entries, one spend shard per account, the files' and the
   * attempts' rows of the tasks whose fence held). A task whose fence no longer holds is left as it
   * is (false), as alone. A finished task whose hold does not settle raises (a bug), and the batcher
   * then runs each completion alone. Lock order as in ledger.repository.ts: tasks, holds, spend
   * shards (in account order).
   */
  private async completeMany(items: readonly WholeCompletion[]): Promise<boolean[]> {
    const tasks = JSON.stringify(
      items.map((c) => ({ id: c.fence.id, attempt: c.fence.attempt, file_ids: c.fileIds, actual_credits: c.actualCredits, revised_prompt: c.revisedPrompt })),
    );
    const files = items.flatMap((c) => c.unrecorded);
    const attempts = items.flatMap((c) => c.attempts);
    const perTask = sql<boolean>`r.task_id in (select id from t)`;
    const also = [...(files.length > 0 ? [this.files.insertWithTask('f', files, perTask)] : []), ...TaskAttemptRepository.cte('ta', attempts, perTask)];
    const rows = await runPrepared(sql<{ id: string; guard: unknown }>`
      with r as (
        select * from jsonb_to_recordset(${tasks}::jsonb) as r(id text, attempt int, file_ids text[], actual_credits bigint, revised_prompt text)
      ), t as (
        update image_tasks set status = 'completed', result_file_ids = r.file_ids, delivered = cardinality(r.file_ids),
          actual_credits = r.actual_credits, revised_prompt = r.revised_prompt, completed_at = now(), lease_owner = null, lease_expires_at = null
        from r where image_tasks.id = r.id and image_tasks.attempt = r.attempt and image_tasks.status = 'processing'
        returning image_tasks.id, r.actual_credits
      ), h as (
        update credit_holds set status = 'captured', captured = credit_holds.amount, settled_at = now()
        from t where credit_holds.task_id = t.id and credit_holds.status = 'held' and credit_holds.amount = t.actual_credits
        returning credit_holds.id, credit_holds.account_id, credit_holds.api_key_id, credit_holds.task_id, credit_holds.captured
      ), s as (
        insert into account_spend (account_id, shard, spent)
        select account_id, floor(random() * 16)::smallint, sum(captured) from h group by account_id order by account_id
        on conflict (account_id, shard) do update set spent = account_spend.spent + excluded.spent
        returning account_id
      ), lc as (
        insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id)
        select account_id, api_key_id, id, 'capture', captured, task_id from h
        returning id
      )${also.length > 0 ? sql`, ${sql.join(also)}` : sql``}
      select t.id, case when (select count(*) from h) <> (select count(*) from t) or (select count(*) from s) <> (select count(distinct account_id) from h)
        then mg_abort('a hold of the batch is missing or was already settled') end as guard
      from t`, this.db);
    const done = new Set(rows.map((r) => r.id));
    return items.map((c) => done.has(c.fence.id));
  }

  find(id: string): Promise<ImageTaskRow | undefined> {
    return this.db.selectFrom('imageTasks').selectAll().where('id', '=', id).executeTakeFirst();
  }

  /**
   * One keyset page (`page.limit` rows) of the account's tasks, optionally of some statuses and
   * one model. A completed `b64_json` task carries where its images are stored (one statement:
   * the page's answer reads them from the store as it is written).
   */
  listForAccount(page: AccountPage, filter: { status?: readonly string[]; model?: string }): Promise<ListedImageTaskRow[]> {
    let query = this.db
      .selectFrom('imageTasks')
      .selectAll('imageTasks')
      .select(mediaExpiresAt)
      .select(
        sql<StoredResult[] | null>`case when image_tasks.status = 'completed' and image_tasks.params->>'responseFormat' = 'b64_json' then (
          select coalesce(json_agg(json_build_object('storageKey', f.storage_key, 'bytes', f.bytes) order by u.i), '[]'::json)
          from unnest(image_tasks.result_file_ids) with ordinality u(id, i) join files f on f.id = u.id) end`.as('storedResults'),
      )
      .where(pageConditions('image_tasks', page));
    if (filter.status) query = query.where('status', 'in', filter.status);
    if (filter.model !== undefined) query = query.where('model', '=', filter.model);
    return query.orderBy(pageOrder('image_tasks', page)).limit(page.limit).execute();
  }

  /** Whether `id` is a task of the account (an `after` that matched nothing). */
  isAccountTask(id: string, accountId: string): Promise<boolean> {
    return afterExists(this.db, 'image_tasks', id, accountId);
  }

  /** The poll's one statement: a named prepared statement, its columns listed (db/prepared.ts). */
  async findForAccount(id: string, accountId: string): Promise<PolledImageTaskRow | undefined> {
    const [row] = await runPrepared(
      sql<PolledImageTaskRow>`select ${POLLED_COLUMNS}, (select min(f.expires_at) from files f where f.id = any(image_tasks.result_file_ids)) as media_expires_at
        from image_tasks where id = ${id} and account_id = ${accountId}`,
      this.db,
    );
    return row;
  }

  /**
   * Names the member running the task's upstream calls and the slots they hold there while the task
   * is processing. Runs inside the pool's slot lock when the member has a limit.
   */
  async assignMember(fence: Fence, memberId: string, slots: number, trx: Executor): Promise<boolean> {
    return (await this.leases.update(fence, { memberId, memberSlots: slots }, trx)) !== undefined;
  }

  /**
   * The upstream calls failed: the member's slots are free again, and no upstream job is waited for
   * there. Only for a job given up on (cancelled, gone, never recorded): a recorded job the upstream
   * still has stays on the row for the next step to collect (ImageRunner.execute).
   *
   * With `cutCall` (the reason): a background task's earlier step stopped during its upstream call
   * (its worker died, or was stopped with the call in flight) without recording an upstream job,
   * and that cut try counts as a retry (`retries` + 1, the reason as its last error), in the same
   * statement, before the next call goes out (ImageRunner.step). The upstream may have made, and
   * billed, the images of the cut call: counted, such calls stay within the retry policy.
   * False: the fence no longer holds.
   */
  async releaseMember(fence: Fence, cutCall?: string): Promise<boolean> {
    const counted = cutCall === undefined ? {} : { retries: sql<number>`retries + 1`, lastError: cutCall, lastErrorAt: sql<Date>`now()` };
    return (await this.leases.update(fence, { memberId: null, memberSlots: 1, upstreamJob: null, ...counted }, this.db)) !== undefined;
  }

  /**
   * The member the task holds accepted an upstream job (`ref`, as the adapter reported it): a later
   * step collects that job instead of submitting another (ImageRunner.step). False: the fence no
   * longer holds.
   */
  async recordUpstreamJob(fence: Fence, ref: unknown): Promise<boolean> {
    return (await this.leases.update(fence, { upstreamJob: JSON.stringify(ref) }, this.db)) !== undefined;
  }

  /**
   * Completed with the delivered images (`unrecorded`: rows of those files not written yet, inserted
   * by the same statement) and `actualCredits` captured from the hold; see LeasedTasks.finish.
   * `delivered` counts an image the answer carried whose stored copy failed (not in `fileIds`).
   */
  complete(
    fence: Fence,
    result: { fileIds: string[]; actualCredits: number; revisedPrompt: string | null; unrecorded: readonly FileRow[]; delivered?: number },
    settle: HoldSettlement,
    attempts: readonly AttemptRecord[] = [],
  ): Promise<boolean> {
    return this.leases.finishOnly(fence, {
      set: sql`status = 'completed', result_file_ids = ${result.fileIds}, delivered = ${result.delivered ?? result.fileIds.length}, actual_credits = ${result.actualCredits},
               revised_prompt = ${result.revisedPrompt}, completed_at = now()`,
      settle,
      also: [...this.fileRows(result.unrecorded), ...attemptRows(attempts)],
    });
  }

  /**
   * Writes the row of an image a stream is about to send, while the task is still processing at the
   * fence's attempt; false (nothing written) when it is not. The task row is locked (FOR SHARE) until
   * the row commits: a takeover claims the task (attempt + 1, `FOR UPDATE SKIP LOCKED`) only before
   * or after, so the statement that then ends it (`interruptedStream`) sees every row written at the
   * old attempt and the old attempt writes none after. The settlement leaves these rows out of its
   * own inserts (they are not `unrecorded`).
   */
  async recordStreamed(fence: Fence, file: FileRow): Promise<boolean> {
    const [row] = await runPrepared(
      sql<{ held: boolean }>`
        with t as (
          select id from image_tasks where id = ${fence.id} and attempt = ${fence.attempt} and status = 'processing' for share
        ), ${this.files.insertWithTask('f', [file])}
        select exists (select 1 from t) as held`,
      this.db,
    );
    return row!.held;
  }

  /** Failed: nothing delivered, the hold released in the same statement. */
  fail(fence: Fence, code: string, message: string, settle: HoldSettlement, attempts: readonly AttemptRecord[] = []): Promise<ImageTaskRow | undefined> {
    return this.leases.finish(fence, {
      set: sql`status = 'failed', error_code = ${code}, error_message = ${message}, actual_credits = 0, delivered = 0, completed_at = now()`,
      settle,
      also: attemptRows(attempts),
    });
  }

  /** The outcome is unknown: keep the hold, stop every worker, wait for an operator. */
  needsAttention(
    fence: Fence,
    message: string,
    stored: { fileIds: string[]; unrecorded: readonly FileRow[]; delivered?: number },
    attempts: readonly AttemptRecord[] = [],
  ): Promise<ImageTaskRow | undefined> {
    return this.leases.finish(fence, {
      set: sql`status = 'needs_attention', error_code = 'outcome_unknown', error_message = ${message},
               result_file_ids = ${stored.fileIds}, delivered = ${stored.delivered ?? stored.fileIds.length}`,
      also: [...this.fileRows(stored.unrecorded), ...attemptRows(attempts)],
    });
  }

  /**
   * A streamed synchronous task whose process stopped (its lease ran out), ended in one statement
   * fenced by the new attempt, by the files recorded for it: a stream writes each image's row before
   * the event that carries it (`recordStreamed`, FOR SHARE on the task row, so that this statement,
   * claimed after the old attempt, sees every row it wrote and none can follow).
   * - None recorded: no image event went out (partial images are never charged), so nothing was
   *   delivered: failed (`interrupted`, `released`) and its hold released (`release`), as `fail`.
   * - Some recorded: they may have reached the client before the settlement, so its hold is kept for
   *   an operator (needs_attention, `kept`), with those files as its results and their number as
   *   delivered, which an operator's refund captures.
   */
  interruptedStream(fence: Fence, message: { kept: string; released: string }, release: HoldSettlement): Promise<ImageTaskRow | undefined> {
    const recorded = sql`(select coalesce(array_agg(f.id order by f.id), '{}') from files f where f.task_id = ${fence.id} and f.purpose = 'image_output')`;
    const none = sql`cardinality(${recorded}) = 0`;
    // The hold is released only when the task failed; kept (and not settled) when it waits for an operator.
    const settle: HoldSettlement = (which) => {
      const s = release(sql`${which} and exists (select 1 from t where t.status = 'failed')`);
      return { ctes: s.ctes, settled: sql<boolean>`(t.status <> 'failed' or ${s.settled})` };
    };
    return this.leases.finish(fence, {
      set: sql`status = case when ${none} then 'failed' else 'needs_attention' end,
               error_code = case when ${none} then 'interrupted' else 'outcome_unknown' end,
               error_message = case when ${none} then ${message.released}::text else ${message.kept}::text end,
               result_file_ids = ${recorded}, delivered = cardinality(${recorded}),
               actual_credits = case when ${none} then 0 else actual_credits end,
               completed_at = case when ${none} then now() else completed_at end`,
      settle,
    });
  }

  private fileRows(rows: readonly FileRow[]): RawBuilder<unknown>[] {
    return rows.length > 0 ? [this.files.insertWithTask('f', rows)] : [];
  }

  /**
   * An operator's settlement of a needs_attention task (not fenced: no worker runs it). `completed`
   * confirms all n images were delivered: the whole hold is captured, and `delivered` says so (the
   * usage report's images_delivered counts images charged).
   */
  /**
   * The capture is computed from the row this statement locks (`completed`: the whole quote;
   * `refunded`: what it says was delivered), never from an earlier read of it: the returned row's
   * `actualCredits` is what the hold is settled at.
   */
  async settleByOperator(id: string, outcome: 'completed' | 'refunded', reason: string, trx: Executor): Promise<ImageTaskRow | undefined> {
    return trx
      .updateTable('imageTasks')
      .set(
        outcome === 'completed'
          ? { status: 'completed', delivered: sql`n`, actualCredits: sql`quoted_credits`, settledReason: reason, completedAt: sql`now()`, errorCode: null, errorMessage: null }
          : {
              status: 'failed',
              actualCredits: sql`delivered * unit_price`,
              settledReason: reason,
              completedAt: sql`now()`,
              errorCode: 'refunded',
              // The client's message is fixed: `reason` is written for the ledger (settled_reason, the
              // entries), which only the admin API shows.
              errorMessage: sql`case when delivered = 0 then ${OPERATOR_REFUND_MESSAGE} else ${OPERATOR_PARTIAL_REFUND_MESSAGE} end`,
            },
      )
      .where('id', '=', id)
      .where('status', '=', 'needs_attention')
      .returningAll()
      .executeTakeFirst();
  }
}

/** `error.message` of a task an operator refunded whole (it delivered nothing). */
export const OPERATOR_REFUND_MESSAGE = "The operator refunded this task's credits.";
/** `error.message` of a task an operator refunded after it delivered some of its images (a stream's), which stay charged. */
export const OPERATOR_PARTIAL_REFUND_MESSAGE = 'The operator refunded the credits of the images this task did not deliver; the images it delivered stay charged.';

/** The attempts of a task written by the statement that finishes it (only when its fenced update took effect). */
function attemptRows(attempts: readonly AttemptRecord[]): RawBuilder<unknown>[] {
  return TaskAttemptRepository.cte('ta', attempts, sql<boolean>`exists (select 1 from t)`);
}
