/**
 * Image tasks for the task engine: `Prefer: respond-async` tasks, and synchronous tasks whose
 * request died with its process (their lease expired): both are rendered here, and the client
 * reads the result with GET /v1/images/{task_id}.
 */
import type { Logger } from '../logger.ts';
import type { ImageTaskRepository, ImageTaskRow } from '../repositories/image-task.repository.ts';
import { NULL_SINK, type ImageService } from '../services/image/image.service.ts';
import { ApiError } from '../errors.ts';
import type { Fence, TaskKind } from './task-engine.ts';

const MAX_ATTEMPTS = 3;

export class ImageTaskKind implements TaskKind<ImageTaskRow> {
  readonly name = 'image';

  constructor(
    private readonly tasks: ImageTaskRepository,
    private readonly images: ImageService,
  ) {}

  claimDue(workerId: string, limit: number, leaseMs: number) {
    return this.tasks.claimDue(workerId, limit, leaseMs);
  }

  heartbeat(fence: Fence, workerId: string, leaseMs: number) {
    return this.tasks.heartbeat(fence, workerId, leaseMs);
  }

  async run(task: ImageTaskRow, signal: AbortSignal, log: Logger): Promise<void> {
    if (!task.runAsync) {
      // A synchronous request whose process died: its client got a broken connection and never
      // learned the task id, so nothing is delivered and nothing is charged.
      await this.images.fail({ id: task.id, attempt: task.attempt }, 'interrupted', 'The request was interrupted before its images were delivered; the credits were released.');
      log.warn('interrupted synchronous image task failed and released');
      return;
    }
    try {
      await this.images.execute(task, NULL_SINK, signal, log);
    } catch (err) {
      // The service already settled the task (failed, or needs_attention) before raising.
      if (!(err instanceof ApiError)) throw err;
    }
  }

  async onError(task: ImageTaskRow, err: unknown, log: Logger): Promise<void> {
    const fence = { id: task.id, attempt: task.attempt };
    if (task.attempt >= MAX_ATTEMPTS) {
      log.error({ err }, 'image task failed after its last attempt');
      await this.images.fail(fence, 'upstream_error', 'Image generation failed repeatedly; the credits were released.');
      return;
    }
    log.warn({ err }, 'image task attempt failed; retrying');
    await this.tasks.release(fence);
  }
}
