/**
 * All Kysely code for video tasks. Leasing (claim, heartbeat, reschedule, fenced updates) is the
 * shared LeasedTasks helper; terminal transitions run inside the settlement transaction, so they
 * take a required executor.
 */
import { sql, type Kysely, type RawBuilder, type Selectable } from 'kysely';
import type { DB, VideoTasks } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';
import { LeasedTasks, type Fence } from './leased-tasks.ts';

export type VideoTaskRow = Selectable<VideoTasks>;

/** Statuses of a video task still being worked on. */
export const ACTIVE_VIDEO_STATUSES = ['queued', 'in_progress'] as const;

const finished = { completedAt: sql<Date>`now()`, leaseOwner: null, leaseExpiresAt: null };

export class VideoTaskRepository {
  readonly leases: LeasedTasks<'videoTasks'>;

  constructor(private readonly db: Kysely<DB>) {
    this.leases = new LeasedTasks(db, {
      table: 'videoTasks',
      sqlTable: 'video_tasks',
      active: ACTIVE_VIDEO_STATUSES,
      onClaim: sql`status = 'in_progress', started_at = coalesce(t.started_at, now())`,
    });
  }

  findForAccount(id: string, accountId: string): Promise<VideoTaskRow | undefined> {
    return this.db.selectFrom('videoTasks').selectAll().where('id', '=', id).where('accountId', '=', accountId).executeTakeFirst();
  }

  find(id: string): Promise<VideoTaskRow | undefined> {
    return this.db.selectFrom('videoTasks').selectAll().where('id', '=', id).executeTakeFirst();
  }

  findByClientRequestId(accountId: string, clientRequestId: string): Promise<VideoTaskRow | undefined> {
    return this.db.selectFrom('videoTasks').selectAll().where('accountId', '=', accountId).where('clientRequestId', '=', clientRequestId).executeTakeFirst();
  }

  /** Names the member about to receive the job (its slot, from now to a terminal state) and marks the submit as started. */
  async markSubmitting(fence: Fence, memberId: string, trx: Executor): Promise<boolean> {
    return (await this.leases.update(fence, { memberId, submitStartedAt: sql`now()` }, trx)) !== undefined;
  }

  /** The submit failed with an answer (the upstream did not take the job): the member's slot is free again. */
  async clearSubmitting(fence: Fence): Promise<boolean> {
    return (await this.leases.update(fence, { memberId: null, submitStartedAt: null }, this.db)) !== undefined;
  }

  /** Saves the upstream job id before any polling (the commit point), so a retried step resumes instead of resubmitting. */
  async setUpstreamJob(fence: Fence, memberId: string, upstreamJobId: string): Promise<boolean> {
    return (await this.leases.update(fence, { memberId, upstreamJobId }, this.db)) !== undefined;
  }

  markCompleted(fence: Fence, outputFileId: string, actualCredits: number | RawBuilder<number>, trx: Executor): Promise<VideoTaskRow | undefined> {
    return this.leases.update(fence, { status: 'completed', outputFileId, actualCredits, ...finished }, trx);
  }

  markFailed(fence: Fence, code: string, message: string, trx: Executor): Promise<VideoTaskRow | undefined> {
    return this.leases.update(fence, { status: 'failed', errorCode: code, errorMessage: message, actualCredits: 0, ...finished }, trx);
  }
}
