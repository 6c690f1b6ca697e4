/** Admin: read any task (image or video) with its credits, and settle needs_attention image tasks. */
import type { components } from '../../../generated/api.d.ts';
import { ApiError, notFound } from '../../errors.ts';
import { toCredits } from '../../lib/money.ts';
import type { ImageTaskRepository, ImageTaskRow } from '../../repositories/image-task.repository.ts';
import type { LedgerRepository } from '../../repositories/ledger.repository.ts';
import type { VideoTaskRepository, VideoTaskRow } from '../../repositories/video-task.repository.ts';
import type { Settlement } from '../tasks/settlement.ts';

type AdminTask = components['schemas']['AdminTask'];

export class TaskAdminService {
  constructor(
    private readonly deps: { imageTasks: ImageTaskRepository; videoTasks: VideoTaskRepository; ledger: LedgerRepository; settlement: Settlement | undefined },
  ) {}

  async get(id: string): Promise<AdminTask> {
    const image = id.startsWith('img_') ? await this.deps.imageTasks.find(id) : undefined;
    if (image) return this.toAdminTask('image', image);
    const video = id.startsWith('vid_') ? await this.deps.videoTasks.find(id) : undefined;
    if (video) return this.toAdminTask('video', video);
    throw notFound('task_not_found', `No task '${id}'.`);
  }

  /** Operator settlement of a needs_attention image task (see Settlement.settleImageByOperator). */
  async settleImageTask(id: string, outcome: 'completed' | 'refunded', reason: string): Promise<AdminTask> {
    const row = await this.deps.imageTasks.find(id);
    if (!row) throw notFound('task_not_found', `No task '${id}'.`);
    if (!this.deps.settlement) throw new Error('settling a task needs the server runtime');
    const settled = await this.deps.settlement.settleImageByOperator(row, outcome, reason);
    if (!settled) throw new ApiError(409, 'task_not_settleable', `Task '${id}' is ${row.status}; only a needs_attention image task can be settled.`);
    return this.toAdminTask('image', settled);
  }

  private async toAdminTask(kind: 'image' | 'video', row: ImageTaskRow | VideoTaskRow): Promise<AdminTask> {
    const hold = await this.deps.ledger.findHoldByTask(row.id);
    const held = hold?.amount ?? 0;
    const captured = hold?.status === 'captured' ? hold.captured : 0;
    const released = hold && hold.status !== 'held' ? hold.amount - captured : 0;
    return {
      id: row.id,
      kind,
      status: row.status as AdminTask['status'],
      account_id: row.accountId,
      api_key_id: row.apiKeyId,
      model: row.model,
      attempt: row.attempt,
      upstream_job_id: 'upstreamJobId' in row ? row.upstreamJobId : null,
      error: row.errorMessage && row.status !== 'completed' ? { message: row.errorMessage } : null,
      last_error: row.lastError && row.lastErrorAt ? { message: row.lastError, at: row.lastErrorAt.toISOString() } : null,
      held_credits: toCredits(held),
      captured_credits: toCredits(captured),
      released_credits: toCredits(released),
      created_at: row.createdAt.toISOString(),
      updated_at: row.updatedAt.toISOString(),
      completed_at: row.completedAt ? row.completedAt.toISOString() : null,
    };
  }
}
