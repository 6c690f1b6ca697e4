/**
 * All Kysely code for image tasks. Like video tasks, leasing is the shared LeasedTasks helper and
 * every write of a worker (or of the request that runs a synchronous task) is fenced by the attempt
 * it holds; terminal transitions run inside the settlement transaction.
 */
import { sql, type Kysely, type RawBuilder, type Selectable } from 'kysely';
import type { DB, ImageTasks } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';
import { LeasedTasks, type Fence } from './leased-tasks.ts';

export type ImageTaskRow = Selectable<ImageTasks>;

const finished = { completedAt: sql<Date>`now()`, leaseOwner: null, leaseExpiresAt: null };

export class ImageTaskRepository {
  readonly leases: LeasedTasks<'imageTasks'>;

  constructor(private readonly db: Kysely<DB>) {
    this.leases = new LeasedTasks(db, { table: 'imageTasks', sqlTable: 'image_tasks', active: ['processing'] });
  }

  find(id: string): Promise<ImageTaskRow | undefined> {
    return this.db.selectFrom('imageTasks').selectAll().where('id', '=', id).executeTakeFirst();
  }

  findForAccount(id: string, accountId: string): Promise<ImageTaskRow | undefined> {
    return this.db.selectFrom('imageTasks').selectAll().where('id', '=', id).where('accountId', '=', accountId).executeTakeFirst();
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

  markCompleted(
    fence: Fence,
    result: { fileIds: string[]; delivered: number; actualCredits: number | RawBuilder<number>; revisedPrompt: string | null },
    trx: Executor,
  ): Promise<ImageTaskRow | undefined> {
    return this.leases.update(
      fence,
      { status: 'completed', resultFileIds: result.fileIds, delivered: result.delivered, actualCredits: result.actualCredits, revisedPrompt: result.revisedPrompt, ...finished },
      trx,
    );
  }

  markFailed(fence: Fence, code: string, message: string, trx: Executor): Promise<ImageTaskRow | undefined> {
    return this.leases.update(fence, { status: 'failed', errorCode: code, errorMessage: message, actualCredits: 0, delivered: 0, ...finished }, trx);
  }

  /** The outcome is unknown: keep the hold, stop every worker, wait for an operator. */
  markNeedsAttention(fence: Fence, message: string, stored: { fileIds: string[]; delivered: number }, trx: Executor): Promise<ImageTaskRow | undefined> {
    return this.leases.update(
      fence,
      { status: 'needs_attention', errorCode: 'outcome_unknown', errorMessage: message, resultFileIds: stored.fileIds, delivered: stored.delivered, leaseOwner: null, leaseExpiresAt: null },
      trx,
    );
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
