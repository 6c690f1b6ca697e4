/** Admin: read any task (image or video) and settle needs_attention image tasks. */
import type { components } from '../../generated/api.d.ts';
import type { AppContext } from '../context.ts';
import { notFound } from '../errors.ts';
import type { ImageTaskRow } from '../repositories/image-task.repository.ts';
import type { VideoTaskRow } from '../repositories/video-task.repository.ts';
import { toCredits } from '../services/money.ts';
import { sendJson, type HandlerMap } from './types.ts';

type AdminTask = components['schemas']['AdminTask'];

export function adminTasksHandlers(ctx: AppContext): Pick<HandlerMap, 'getTask' | 'settleImageTask'> {
  const { imageTasks, videoTasks, ledger } = ctx.repositories;

  async function toAdminTask(kind: 'image' | 'video', row: ImageTaskRow | VideoTaskRow): Promise<AdminTask> {
    const hold = await ledger.findHoldByTask(row.id);
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
      held_credits: toCredits(held),
      captured_credits: toCredits(captured),
      released_credits: toCredits(released),
      created_at: row.createdAt.toISOString(),
      updated_at: row.updatedAt.toISOString(),
      completed_at: row.completedAt ? row.completedAt.toISOString() : null,
    };
  }

  async function find(id: string): Promise<AdminTask> {
    const image = id.startsWith('img_') ? await imageTasks.find(id) : undefined;
    if (image) return toAdminTask('image', image);
    const video = id.startsWith('vid_') ? await videoTasks.find(id) : undefined;
    if (video) return toAdminTask('video', video);
    throw notFound('task_not_found', `No task '${id}'.`);
  }

  return {
    async getTask(req, res) {
      sendJson(res, 'getTask', 200, await find(req.params.task_id));
    },
    async settleImageTask(req, res) {
      const row = await ctx.services.images.settle(req.params.task_id, req.body.outcome, req.body.reason);
      sendJson(res, 'settleImageTask', 200, await toAdminTask('image', row));
    },
  };
}
