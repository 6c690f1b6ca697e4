/**
 * What the task sweeper (services/tasks/task-sweeper.ts) looks for: unfinished tasks past their
 * deadline that no worker holds, and holds still `held` whose task has ended. A claim here is a
 * claim like an engine's (attempt + 1, a lease), so the task's end is fenced as every other end is.
 */
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { ImageTaskRow } from './image-task.repository.ts';
import type { VideoTaskRow } from './video-task.repository.ts';

export class TaskSweepRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /** Claims up to `limit` unfinished video tasks past their deadline and not leased (the oldest ones; returned in no particular order). */
  async claimOverdueVideos(owner: string, leaseMs: number, limit: number): Promise<VideoTaskRow[]> {
    const { rows } = await sql<VideoTaskRow>`
      update video_tasks t
      set attempt = t.attempt + 1, lease_owner = ${owner}, lease_expires_at = now() + ${leaseMs} * interval '1 millisecond'
      where t.id in (
        select id from video_tasks
        where status in ('queued', 'in_progress') and deadline_at <= now() and (lease_expires_at is null or lease_expires_at < now())
        order by created_at, id
        limit ${limit}
        for update skip locked
      )
      returning t.*`.execute(this.db);
    return rows;
  }

  /** Claims up to `limit` processing image tasks older than `lifetimeSeconds` and not leased (the oldest ones; returned in no particular order). */
  async claimOverdueImages(owner: string, leaseMs: number, lifetimeSeconds: number, limit: number): Promise<ImageTaskRow[]> {
    const { rows } = await sql<ImageTaskRow>`
      update image_tasks t
      set attempt = t.attempt + 1, lease_owner = ${owner}, lease_expires_at = now() + ${leaseMs} * interval '1 millisecond'
      where t.id in (
        select id from image_tasks
        where status = 'processing' and created_at <= now() - ${lifetimeSeconds} * interval '1 second'
          and (lease_expires_at is null or lease_expires_at < now())
        order by created_at, id
        limit ${limit}
        for update skip locked
      )
      returning t.*`.execute(this.db);
    return rows;
  }

  /**
   * Holds still `held` whose task has ended (completed or failed): what each should capture (the
   * task's actual credits when it completed, nothing when it failed). Oldest first, on the index of
   * held holds.
   */
  async strandedHolds(limit: number): Promise<{ taskId: string; status: string; capture: number }[]> {
    const { rows } = await sql<{ taskId: string; status: string; capture: number }>`
      select h.task_id, coalesce(v.status, i.status) as status,
             case when coalesce(v.status, i.status) = 'completed' then least(coalesce(v.actual_credits, i.actual_credits), h.amount) else 0 end as capture
      from credit_holds h
      left join video_tasks v on v.id = h.task_id
      left join image_tasks i on i.id = h.task_id
      where h.status = 'held' and coalesce(v.status, i.status) in ('completed', 'failed')
      order by h.created_at
      limit ${limit}`.execute(this.db);
    return rows;
  }
}
