/**
 * The outbox write of a finished video task (product spec §6.2): called by Settlement inside the
 * transaction that moves the task to `completed` or `failed`, so the task's state and its webhook
 * commit together — no crash can lose one. The body is frozen here: the task's lookup object
 * (`GET /v1/videos/{id}`) at that moment, sent byte for byte on every attempt. Its `video_url` is
 * signed for at least the whole retry schedule, so a late delivery still carries a working link.
 */
import type { Executor } from '../../db/database.ts';
import { newId } from '../../lib/ids.ts';
import type { VideoTaskRow } from '../../repositories/video-task.repository.ts';
import type { WebhookRepository } from '../../repositories/webhook.repository.ts';
import type { FileService } from '../file.service.ts';
import { toVideoTask } from '../video/video-mappers.ts';

export class WebhookOutbox {
  constructor(
    private readonly repo: WebhookRepository,
    private readonly files: FileService,
    /** Signed-URL lifetime in webhook bodies: the retry schedule plus a day. */
    private readonly urlTtlSeconds: number,
  ) {}

  /** Queues the task's webhook when it has a callback_url; a no-op otherwise. */
  async videoFinished(task: VideoTaskRow, trx: Executor): Promise<void> {
    if (!task.callbackUrl || (task.status !== 'completed' && task.status !== 'failed')) return;
    const videoUrl = task.status === 'completed' && task.outputFileId ? this.files.signedUrl(task.outputFileId, this.urlTtlSeconds) : undefined;
    await this.repo.enqueue(
      {
        id: newId('msg'),
        accountId: task.accountId,
        taskId: task.id,
        eventType: task.status === 'completed' ? 'video.completed' : 'video.failed',
        url: task.callbackUrl,
        payload: JSON.stringify(toVideoTask(task, videoUrl)),
      },
      trx,
    );
  }
}
