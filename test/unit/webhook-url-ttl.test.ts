/**
 * The signed `video_url` a webhook body carries works for the whole retry schedule plus a day
 * (webhooks contract): the schedule at its longest, every delay lengthened by the most jitter the
 * delivery's retry policy adds and every attempt taking its whole time limit.
 */
import { describe, expect, it } from 'vitest';
import { DEFAULT_WEBHOOK_RETRY_SCHEDULE_MS } from '../../server/config.ts';
import type { Metrics } from '../../server/metrics.ts';
import type { WebhookRepository } from '../../server/repositories/webhook.repository.ts';
import { retryDelay } from '../../server/services/tasks/retry-policy.ts';
import { webhookUrlTtlSeconds } from '../../server/services/webhooks/webhook-outbox.ts';
import { WebhookRunner } from '../../server/services/webhooks/webhook-runner.ts';
import type { WebhookSecrets } from '../../server/services/webhooks/webhook-secrets.ts';
import type { Transactor } from '../../server/db/transaction.ts';

const DAY_MS = 86_400_000;

/** The latest the last attempt can end after the task finished: the runner's own policy, at its most jitter, and each attempt at its time limit. */
function longestDeliveryMs(scheduleMs: number[], timeoutMs: number): number {
  const runner = new WebhookRunner({ repo: {} as WebhookRepository, tx: {} as Transactor, secrets: {} as WebhookSecrets, metrics: {} as Metrics, scheduleMs, timeoutMs, allowPrivate: false });
  const mostJitter = () => 1 - Number.EPSILON;
  let total = timeoutMs; // the first attempt
  for (let retries = 0; ; retries++) {
    const delay = retryDelay(runner.retry, retries, mostJitter);
    if (delay === undefined) return total;
    total += delay + timeoutMs;
  }
}

describe('webhookUrlTtlSeconds', () => {
  it.each([
    ['the default schedule', DEFAULT_WEBHOOK_RETRY_SCHEDULE_MS, 10_000],
    // Past ten days of delays the jitter alone is more than the day of margin.
    ['a long custom schedule (12 days)', Array.from({ length: 12 }, () => DAY_MS), 10_000],
    ['a custom schedule of many short retries with a long time limit', Array.from({ length: 200 }, () => 1_000), 120_000],
  ])('outlives %s at its longest by a day', (_what, scheduleMs, timeoutMs) => {
    const ttlMs = webhookUrlTtlSeconds(scheduleMs, timeoutMs) * 1000;
    expect(ttlMs).toBeGreaterThanOrEqual(longestDeliveryMs(scheduleMs, timeoutMs) + DAY_MS);
    // Not much more: a leaked link lives no longer than it must (a few seconds of rounding).
    expect(ttlMs).toBeLessThanOrEqual(longestDeliveryMs(scheduleMs, timeoutMs) + DAY_MS + 1_000);
  });
});
