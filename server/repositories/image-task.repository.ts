/**
 * All Kysely code for image tasks. Like video tasks, leasing is the shared LeasedTasks helper and
 * every write of a worker (or of the request that runs a synchronous task) is fenced by the attempt
 * it holds; a terminal transition is one statement that also settles the hold (and writes the rows of
 * the files it delivered), built by Settlement.
 */
import { sql, type Kysely, type RawBuilder, type Selectable } from 'kysely';
import type { DB, ImageTasks } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';
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

/** A listed task; `storedResults` (in `result_file_ids` order) for a completed `b64_json` task only. */
export type ListedImageTaskRow = LookedUpImageTaskRow & { storedResults: StoredResult[] | null };

const mediaExpiresAt = sql<Date | null>`(select min(f.expires_at) from files f where f.id = any(image_tasks.result_file_ids))`.as('mediaExpiresAt');

export class ImageTaskRepository {
  readonly leases: LeasedTasks<'imageTasks'>;

  private readonly files: FileRepository;

  constructor(private readonly db: Kysely<DB>) {
    this.leases = new LeasedTasks(db, { table: 'imageTasks', sqlTable: 'image_tasks', active: ['processing'], recordsErrors: true });
    this.files = new FileRepository(db);
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

  findForAccount(id: string, accountId: string): Promise<LookedUpImageTaskRow | undefined> {
    return this.db.selectFrom('imageTasks').selectAll('imageTasks').select(mediaExpiresAt).where('id', '=', id).where('accountId', '=', accountId).executeTakeFirst();
  }

  /**
   * Names the member running the task's upstream calls and the slots they hold there while the task
   * is processing. Runs inside the pool's slot lock when the member has a limit.
   */
  async assignMember(fence: Fence, memberId: string, slots: number, trx: Executor): Promise<boolean> {
    return (await this.leases.update(fence, { memberId, memberSlots: slots }, trx)) !== undefined;
  }

  /** The upstream calls failed: the member's slots are free again. */
  async releaseMember(fence: Fence): Promise<boolean> {
    return (await this.leases.update(fence, { memberId: null, memberSlots: 1 }, this.db)) !== undefined;
  }

  /**
   * Completed with the delivered images (`unrecorded`: rows of those files not written yet, inserted
   * by the same statement) and `actualCredits` captured from the hold; see LeasedTasks.finish.
   */
  complete(
    fence: Fence,
    result: { fileIds: string[]; actualCredits: number; revisedPrompt: string | null; unrecorded: readonly FileRow[] },
    settle: HoldSettlement,
    attempts: readonly AttemptRecord[] = [],
  ): Promise<boolean> {
    return this.leases.finishOnly(fence, {
      set: sql`status = 'completed', result_file_ids = ${result.fileIds}, delivered = ${result.fileIds.length}, actual_credits = ${result.actualCredits},
               revised_prompt = ${result.revisedPrompt}, completed_at = now()`,
      settle,
      also: [...this.fileRows(result.unrecorded), ...attemptRows(attempts)],
    });
  }

  /**
   * Forgets result files of a completed task whose bytes could not be stored after the answer
   * delivered them (ImageRunner, storeWhileSettling): their rows go and `data` lists the others.
   * What was delivered and charged (`delivered`, `actual_credits`) stays.
   */
  async dropResultFiles(taskId: string, fileIds: readonly string[]): Promise<void> {
    const ids = [...fileIds];
    await sql`
      with f as (delete from files where id = any(${ids}::text[]) and task_id = ${taskId} returning id)
      update image_tasks set result_file_ids = array(
        select u.id from unnest(result_file_ids) with ordinality u(id, i) where u.id <> all(${ids}::text[]) order by u.i)
      where id = ${taskId}`.execute(this.db);
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
  needsAttention(fence: Fence, message: string, stored: { fileIds: string[]; unrecorded: readonly FileRow[] }, attempts: readonly AttemptRecord[] = []): Promise<ImageTaskRow | undefined> {
    return this.leases.finish(fence, {
      set: sql`status = 'needs_attention', error_code = 'outcome_unknown', error_message = ${message},
               result_file_ids = ${stored.fileIds}, delivered = ${stored.fileIds.length}`,
      also: [...this.fileRows(stored.unrecorded), ...attemptRows(attempts)],
    });
  }

  private fileRows(rows: readonly FileRow[]): RawBuilder<unknown>[] {
    return rows.length > 0 ? [this.files.insertWithTask('f', rows)] : [];
  }

  /** An operator's settlement of a needs_attention task (not fenced: no worker runs it). */
  async settleByOperator(id: string, outcome: 'completed' | 'refunded', reason: string, actualCredits: number, trx: Executor): Promise<ImageTaskRow | undefined> {
    return trx
      .updateTable('imageTasks')
      .set(
        outcome === 'completed'
          ? { status: 'completed', actualCredits, settledReason: reason, completedAt: sql`now()`, errorCode: null, errorMessage: null }
          : { status: 'failed', actualCredits, settledReason: reason, completedAt: sql`now()`, errorCode: 'refunded', errorMessage: `Refunded by operator: ${reason}` },
      )
      .where('id', '=', id)
      .where('status', '=', 'needs_attention')
      .returningAll()
      .executeTakeFirst();
  }
}

/** The attempts of a task written by the statement that finishes it (only when its fenced update took effect). */
function attemptRows(attempts: readonly AttemptRecord[]): RawBuilder<unknown>[] {
  return TaskAttemptRepository.cte('ta', attempts, sql<boolean>`exists (select 1 from t)`);
}
