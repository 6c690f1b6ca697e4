/**
 * The outbox write of a finished video task (product spec §6.2): Settlement writes it in the one
 * statement that moves the task to `completed` or `failed`, so the task's state and its webhook
 * commit together — no crash can lose one. The body is frozen here: the task's lookup object
 * (`GET /v1/videos/{id}`) at that moment, sent byte for byte on every attempt. Its `video_url` is
 * signed now for the longest the retry schedule can take plus a day (`webhookUrlTtlSeconds`), so
 * the last retry still carries a working link, unless the file expires first (`media_expires_at`)
 * or an operator redelivers it later: the contract sends a receiver that needs a fresh link to
 * `GET /v1/videos/{id}` (a body signed anew would break the same-body rule).
 */
import { newId } from '../../lib/ids.ts';
import type { VideoTaskRow } from '../../repositories/video-task.repository.ts';
import type { VideoDelivery } from '../../repositories/webhook.repository.ts';
import type { FileService } from '../file.service.ts';
import { toVideoTask } from '../video/video-mappers.ts';
import { SCHEDULE_JITTER } from './webhook-runner.ts';

/**
 * The lifetime of the signed `video_url` in a webhook body: the longest a delivery's attempts can
 * take — every delay of the schedule lengthened by its most jitter, every attempt (the first and
 * one per delay) at its time limit — plus a day.
 */
export function webhookUrlTtlSeconds(scheduleMs: readonly number[], attemptTimeoutMs: number): number {
  const delaysMs = scheduleMs.reduce((sum, ms) => sum + Math.round(ms * (1 + SCHEDULE_JITTER)), 0);
  return Math.ceil((delaysMs + (scheduleMs.length + 1) * attemptTimeoutMs) / 1000) + 86_400;
}

export class WebhookOutbox {
  constructor(
    private readonly files: FileService,
    /** Signed-URL lifetime in webhook bodies: `webhookUrlTtlSeconds` (the file's own expiry may come first). */
    private readonly urlTtlSeconds: number,
  ) {}

  /**
   * The webhook a finished task queues (its callback_url's delivery), or undefined when it has no
   * callback_url. `task` is the row as the finishing statement leaves it; Settlement writes the
   * delivery in that same statement.
   */
  deliveryFor(task: VideoTaskRow & { mediaExpiresAt?: Date | null }): VideoDelivery | undefined {
    if (!task.callbackUrl || (task.status !== 'completed' && task.status !== 'failed')) return undefined;
    const videoUrl = task.status === 'completed' && task.outputFileId ? this.files.signedUrl(task.outputFileId, this.urlTtlSeconds) : undefined;
    return {
      id: newId('msg'),
      eventType: task.status === 'completed' ? 'video.completed' : 'video.failed',
      payload: JSON.stringify(toVideoTask(task, videoUrl)),
    };
  }
}
