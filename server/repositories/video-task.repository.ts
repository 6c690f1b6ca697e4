/**
 * All Kysely code for video tasks. Worker writes are fenced: they only apply while the row still
 * has the worker's `attempt` (a later claim bumps it), so a worker whose lease expired cannot
 * overwrite the work of the one that took over.
 */
import { sql, type Kysely, type Selectable, type Transaction } from 'kysely';
import type { DB, VideoTasks } from '../../generated/db.d.ts';

export type VideoTaskRow = Selectable<VideoTasks>;
type Executor = Kysely<DB> | Transaction<DB>;

export interface Fence {
  id: string;
  attempt: number;
}

export class VideoTaskRepository {
  constructor(private readonly db: Kysely<DB>) {}

  findForAccount(id: string, accountId: string): Promise<VideoTaskRow | undefined> {
    return this.db.selectFrom('videoTasks').selectAll().where('id', '=', id).where('accountId', '=', accountId).executeTakeFirst();
  }

  find(id: string, db: Executor = this.db): Promise<VideoTaskRow | undefined> {
    return db.selectFrom('videoTasks').selectAll().where('id', '=', id).executeTakeFirst();
  }

  findByClientRequestId(accountId: string, clientRequestId: string): Promise<VideoTaskRow | undefined> {
    return this.db.selectFrom('videoTasks').selectAll().where('accountId', '=', accountId).where('clientRequestId', '=', clientRequestId).executeTakeFirst();
  }

  /**
   * Claims up to `limit` due tasks in one short transaction: unfinished, due, and not leased (or
   * with an expired lease). Bumps `attempt`, sets the lease, and moves queued tasks to in_progress.
   */
  async claimDue(workerId: string, limit: number, leaseMs: number): Promise<VideoTaskRow[]> {
    const result = await sql<VideoTaskRow>`
      update video_tasks t
      set attempt = t.attempt + 1,
          lease_owner = ${workerId},
          lease_expires_at = now() + ${leaseMs} * interval '1 millisecond',
          status = 'in_progress',
          started_at = coalesce(t.started_at, now())
      where t.id in (
        select id from video_tasks
        where status in ('queued', 'in_progress') and run_after <= now()
          and (lease_expires_at is null or lease_expires_at < now())
        order by run_after
        limit ${limit}
        for update skip locked
      )
      returning t.*`.execute(this.db);
    // The CamelCasePlugin maps raw result columns too.
    return result.rows;
  }

  /** Extends the lease; false when the task was taken over (or finished) meanwhile. */
  async heartbeat(fence: Fence, workerId: string, leaseMs: number): Promise<boolean> {
    const r = await this.db
      .updateTable('videoTasks')
      .set({ leaseExpiresAt: sql`now() + ${leaseMs} * interval '1 millisecond'` })
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('leaseOwner', '=', workerId)
      .where('status', 'in', ['queued', 'in_progress'])
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }

  /** Saves the upstream job id before any polling, so a retried attempt resumes instead of resubmitting. */
  async setUpstreamJob(fence: Fence, memberId: string, upstreamJobId: string): Promise<boolean> {
    const r = await this.db
      .updateTable('videoTasks')
      .set({ memberId, upstreamJobId })
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('status', '=', 'in_progress')
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }

  async markCompleted(fence: Fence, outputFileId: string, actualCredits: number, db: Executor): Promise<boolean> {
    const r = await db
      .updateTable('videoTasks')
      .set({ status: 'completed', outputFileId, actualCredits, completedAt: sql`now()`, leaseOwner: null, leaseExpiresAt: null })
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('status', 'in', ['queued', 'in_progress'])
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }

  /** Fails the task; with `fence` undefined it applies regardless of attempt (sweepers, lifetime). */
  async markFailed(id: string, attempt: number | undefined, code: string, message: string, db: Executor): Promise<boolean> {
    let q = db
      .updateTable('videoTasks')
      .set({ status: 'failed', errorCode: code, errorMessage: message, actualCredits: 0, completedAt: sql`now()`, leaseOwner: null, leaseExpiresAt: null })
      .where('id', '=', id)
      .where('status', 'in', ['queued', 'in_progress']);
    if (attempt !== undefined) q = q.where('attempt', '=', attempt);
    const r = await q.executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }

  /** Gives the task back for a later attempt (transient failure), releasing the lease. */
  async retryLater(fence: Fence, delayMs: number): Promise<boolean> {
    const r = await this.db
      .updateTable('videoTasks')
      .set({ runAfter: sql`now() + ${delayMs} * interval '1 millisecond'`, leaseOwner: null, leaseExpiresAt: null })
      .where('id', '=', fence.id)
      .where('attempt', '=', fence.attempt)
      .where('status', '=', 'in_progress')
      .executeTakeFirst();
    return r.numUpdatedRows === 1n;
  }
}
