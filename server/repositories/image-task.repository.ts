/**
 * All Kysely code for image tasks. Like video tasks, every write of a worker (or of the request
 * that runs a synchronous task) is fenced by the attempt number it holds.
 */
import { sql, type Kysely, type Selectable, type Transaction } from 'kysely';
import type { DB, ImageTasks } from '../../generated/db.d.ts';
import type { Fence } from './video-task.repository.ts';

export type ImageTaskRow = Selectable<ImageTasks>;
type Executor = Kysely<DB> | Transaction<DB>;

export class ImageTaskRepository {
  constructor(private readonly db: Kysely<DB>) {}

  find(id: string, db: Executor = this.db): Promise<ImageTaskRow | undefined> {
    return db.selectFrom('imageTasks').selectAll().where('id', '=', id).executeTakeFirst();
  }

  findForAccount(id: string, accountId: string): Promise<ImageTaskRow | undefined> {
    return this.db.selectFrom('imageTasks').selectAll().where('id', '=', id).where('accountId', '=', accountId).executeTakeFirst();
  }

  /**
   * Claims processing tasks that no one is running: async tasks not yet started, and tasks whose
   * lease expired (their worker or request died).
   */
  async claimDue(workerId: string, limit: number, leaseMs: number): Promise<ImageTaskRow[]> {
    const result = await sql<ImageTaskRow>`
      update image_tasks t
      set attempt = t.attempt + 1,
          lease_owner = ${workerId},
          lease_expires_at = now() + ${leaseMs} * interval '1 millisecond'
      where t.id in (
        select id from image_tasks
        where status = 'processing'
          and ((run_async and lease_expires_at is null) or lease_expires_at < now())
        order by lease_expires_at nulls first
        limit ${limit}
        for update skip locked
      )
      returning t.*`.execute(this.db);
    return result.rows;
  }

  async heartbeat(fence: Fence, workerId: string, leaseMs: number): Promise<boolean> {
    const r = await this.db
      .updateTable('imageTasks')
      .set({ leaseExpiresAt: sql`now() + ${leaseMs} * interval '1 millisecond'` })
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('leaseOwner', '=', workerId)
      .where('status', '=', 'processing')
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }

  async markCompleted(
    fence: Fence,
    result: { fileIds: string[]; delivered: number; actualCredits: number; revisedPrompt: string | null },
    db: Executor,
  ): Promise<boolean> {
    const r = await db
      .updateTable('imageTasks')
      .set({
        status: 'completed',
        resultFileIds: result.fileIds,
        delivered: result.delivered,
        actualCredits: result.actualCredits,
        revisedPrompt: result.revisedPrompt,
        completedAt: sql`now()`,
        leaseOwner: null,
        leaseExpiresAt: null,
      })
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('status', '=', 'processing')
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }

  async markFailed(fence: Fence, code: string, message: string, db: Executor): Promise<boolean> {
    const r = await db
      .updateTable('imageTasks')
      .set({ status: 'failed', errorCode: code, errorMessage: message, actualCredits: 0, delivered: 0, completedAt: sql`now()`, leaseOwner: null, leaseExpiresAt: null })
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('status', '=', 'processing')
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }

  /** The outcome is unknown: keep the hold, stop every worker, wait for an operator. */
  async markNeedsAttention(fence: Fence, message: string, stored: { fileIds: string[]; delivered: number }): Promise<boolean> {
    const r = await this.db
      .updateTable('imageTasks')
      .set({
        status: 'needs_attention',
        errorCode: 'outcome_unknown',
        errorMessage: message,
        resultFileIds: stored.fileIds,
        delivered: stored.delivered,
        leaseOwner: null,
        leaseExpiresAt: null,
      })
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('status', '=', 'processing')
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }

  /** An operator's settlement of a needs_attention task (not fenced: no worker runs it). */
  async settle(id: string, outcome: 'completed' | 'refunded', reason: string, actualCredits: number, db: Executor): Promise<boolean> {
    const r = await db
      .updateTable('imageTasks')
      .set(
        outcome === 'completed'
          ? { status: 'completed', actualCredits, settledReason: reason, completedAt: sql`now()`, errorCode: null, errorMessage: null }
          : { status: 'failed', actualCredits, settledReason: reason, completedAt: sql`now()`, errorCode: 'refunded', errorMessage: `Refunded by operator: ${reason}` },
      )
      .where('id', '=', id)
      .where('status', '=', 'needs_attention')
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }

  /** Gives a task back for another attempt (transient failure), releasing the lease. */
  async release(fence: Fence): Promise<boolean> {
    const r = await this.db
      .updateTable('imageTasks')
      .set({ leaseOwner: null, leaseExpiresAt: sql`now() + interval '2 seconds'` })
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('status', '=', 'processing')
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }
}
