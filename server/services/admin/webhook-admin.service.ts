/** Admin: every webhook delivery (listing with filters), a video task's delivery with its attempts, and redelivery. */
import type { components } from '../../../generated/api.d.ts';
import type { Transactor } from '../../db/transaction.ts';
import { ApiError, notFound } from '../../errors.ts';
import type { OperatorListsRepository } from '../../repositories/operator-lists.repository.ts';
import type { VideoTaskRepository } from '../../repositories/video-task.repository.ts';
import { capped, type WebhookAttemptRow, type WebhookDeliveryRow, type WebhookRepository } from '../../repositories/webhook.repository.ts';
import { decodeCreatedAtCursor, encodeCreatedAtCursor, pageSize } from './cursor.ts';

type AdminWebhookDelivery = components['schemas']['AdminWebhookDelivery'];
type AdminWebhookDeliveryList = components['schemas']['AdminWebhookDeliveryList'];

/** GET /admin/v1/webhook-deliveries query (validated by the contract). */
export interface WebhookListQuery {
  limit?: number;
  cursor?: string;
  status?: string[];
  account_id?: string;
  created_after?: string;
  created_before?: string;
}

export class WebhookAdminService {
  constructor(private readonly deps: { webhooks: WebhookRepository; videoTasks: VideoTaskRepository; lists: OperatorListsRepository; tx: Transactor }) {}

  /** One page of deliveries of every account, newest first, each with its attempts (two statements). */
  async list(query: WebhookListQuery): Promise<AdminWebhookDeliveryList> {
    const size = pageSize(query.limit);
    const after = query.cursor !== undefined ? decodeCreatedAtCursor('webhook_deliveries', query.cursor) : undefined;
    const rows = await this.deps.lists.webhookDeliveries(
      {
        ...(query.status !== undefined && { statuses: query.status }),
        ...(query.account_id !== undefined && { accountId: query.account_id }),
        ...(query.created_after !== undefined && { createdAfter: query.created_after }),
        ...(query.created_before !== undefined && { createdBefore: query.created_before }),
      },
      size + 1,
      after,
    );
    const page = rows.slice(0, size);
    const attempts = await this.deps.lists.webhookAttempts(page.map((d) => d.id));
    const last = page.at(-1);
    return {
      data: page.map((d) => toAdmin(d, attempts.filter((a) => a.deliveryId === d.id))),
      next_cursor: rows.length > size && last ? encodeCreatedAtCursor('webhook_deliveries', { createdAtMicros: last.createdAtMicros, id: last.id }) : null,
    };
  }

  /** A task's delivery with its attempts; null when it has none (yet). */
  async deliveryOf(taskId: string): Promise<AdminWebhookDelivery | null> {
    const delivery = await this.deps.webhooks.findForTask(taskId);
    return delivery ? toAdmin(delivery, await this.deps.webhooks.attemptsOf(delivery.id)) : null;
  }

  /** The task's delivery (null: the task has no callback_url, or has not finished yet). */
  async forTask(taskId: string): Promise<{ task_id: string; delivery: AdminWebhookDelivery | null }> {
    await this.taskOrThrow(taskId);
    const delivery = await this.deps.webhooks.findForTask(taskId);
    return { task_id: taskId, delivery: delivery ? toAdmin(delivery, await this.deps.webhooks.attemptsOf(delivery.id)) : null };
  }

  /** Sends the task's webhook again now, with the same webhook-id and body. */
  async redeliver(taskId: string): Promise<{ task_id: string; delivery: AdminWebhookDelivery | null }> {
    await this.taskOrThrow(taskId);
    const existing = await this.deps.webhooks.findForTask(taskId);
    if (!existing) throw new ApiError(409, 'no_webhook', `Task '${taskId}' has no webhook delivery (no callback_url, or the task has not finished).`);
    const row = await this.deps.tx.run((trx) => this.deps.webhooks.redeliver(taskId, trx));
    if (!row) throw new ApiError(409, 'webhook_in_progress', `The webhook of task '${taskId}' is being sent right now; look again in a moment.`);
    return { task_id: taskId, delivery: toAdmin(row, await this.deps.webhooks.attemptsOf(row.id)) };
  }

  private async taskOrThrow(taskId: string): Promise<void> {
    if (!(await this.deps.videoTasks.find(taskId))) throw notFound('task_not_found', `No video task '${taskId}'.`);
  }
}

function toAdmin(d: WebhookDeliveryRow, attempts: WebhookAttemptRow[]): AdminWebhookDelivery {
  return {
    webhook_id: d.id,
    task_id: d.taskId,
    account_id: d.accountId,
    event_type: d.eventType as AdminWebhookDelivery['event_type'],
    url: d.url,
    status: d.status as AdminWebhookDelivery['status'],
    last_error: capped(d.lastError),
    next_attempt_at: d.status === 'pending' ? d.nextRunAt.toISOString() : null,
    delivered_at: d.deliveredAt ? d.deliveredAt.toISOString() : null,
    created_at: d.createdAt.toISOString(),
    attempts: attempts.map((a) => ({
      attempted_at: a.attemptedAt.toISOString(),
      status_code: a.statusCode,
      error_class: a.errorClass as AdminWebhookDelivery['attempts'][number]['error_class'],
      error: capped(a.error),
      latency_ms: a.latencyMs,
      next_retry_at: a.nextRetryAt ? a.nextRetryAt.toISOString() : null,
    })),
  };
}
