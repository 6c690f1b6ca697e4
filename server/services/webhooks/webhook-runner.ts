/**
 * Webhook deliveries as leased work for the task engine (design §6): any instance claims due
 * deliveries (FOR UPDATE SKIP LOCKED), and one step is one attempt:
 *
 *   send     the frozen body, signed, with `webhook-id` the delivery id (the same on every
 *            attempt): `sendSignedWebhook` (webhook-send.ts)
 *   record   the attempt (status code or error class, latency, next retry) and the outcome, fenced:
 *            2xx delivered · 410 gone (stop) · refused target (blocked or invalid URL) failed at once ·
 *            anything else retried on the published schedule, then failed; a retried attempt counts
 *            toward the schedule in that same fenced write, so no lost reschedule can repeat a delay
 *
 * A delivery that cannot be made ready to send (its account's signing secret is read and decrypted
 * first) sends nothing and records no attempt: a secret that does not decrypt with this process's
 * MEDIAGATE_SECRET_KEY gives the delivery up at once, its reason in `last_error`; a failed statement
 * is retried on the schedule like a failed attempt, its reason in `last_error` as well.
 *
 * Delivery is at least once: a worker that dies after the receiver answered and before the attempt
 * was recorded leaves the row to be claimed again, and the receiver sees the same `webhook-id` twice.
 */
import { isDatabaseUnavailable } from '../../db/database.ts';
import type { Transactor } from '../../db/transaction.ts';
import type { SafeFetchOptions } from '../../lib/safe-fetch.ts';
import type { Logger } from '../../logger.ts';
import type { Metrics } from '../../metrics.ts';
import { fenceOf } from '../../repositories/leased-tasks.ts';
import type { WebhookDeliveryRow, WebhookRepository } from '../../repositories/webhook.repository.ts';
import { retryDelay, type RetryPolicy } from '../tasks/retry-policy.ts';
import { DONE, LeaseLost, later, type StepResult, type TaskRunner } from '../tasks/task-runner.ts';
import type { WebhookSecrets } from './webhook-secrets.ts';
import { sendSignedWebhook } from './webhook-send.ts';

/** Most a retry's delay is lengthened at random (retry-policy.ts `jitter`): 10 % of the schedule's delay. */
export const SCHEDULE_JITTER = 0.1;

/** Refused targets: retrying cannot help, the delivery fails at once. */
const FINAL_ERRORS = new Set(['blocked_address', 'invalid_url']);

export interface WebhookRunnerDeps {
  repo: WebhookRepository;
  tx: Transactor;
  secrets: WebhookSecrets;
  metrics: Metrics;
  scheduleMs: readonly number[];
  timeoutMs: number;
  allowPrivate: boolean;
  /** Test seams: the resolver and extra trusted CAs of safeFetch. */
  fetchOptions?: Pick<SafeFetchOptions, 'resolve' | 'ca' | 'treatAsPublic'>;
}

export class WebhookRunner implements TaskRunner<WebhookDeliveryRow> {
  readonly name = 'webhook';
  readonly retry: RetryPolicy;

  constructor(private readonly deps: WebhookRunnerDeps) {
    this.retry = { maxRetries: deps.scheduleMs.length, baseDelayMs: 0, maxDelayMs: 0, scheduleMs: deps.scheduleMs, scheduleJitter: SCHEDULE_JITTER };
  }

  get leases() {
    return this.deps.repo.leases;
  }

  async step(delivery: WebhookDeliveryRow, signal: AbortSignal, log: Logger): Promise<StepResult> {
    const { repo, metrics } = this.deps;
    let secrets: string[];
    try {
      secrets = await this.deps.secrets.signing(delivery.accountId);
    } catch (err) {
      return this.unsent(delivery, err, log);
    }
    const sent = await sendSignedWebhook(delivery.url, delivery.id, delivery.payload, secrets, {
      timeoutMs: this.deps.timeoutMs,
      allowPrivate: this.deps.allowPrivate,
      signal, // lease lost or shutting down: rethrown, the attempt resumes after the lease
      fetchOptions: this.deps.fetchOptions,
    });
    // The delivery's record is the operator's (admin views): the detail, addresses included.
    const { statusCode, errorClass, detail: error, latencyMs } = sent;

    const delivered = statusCode !== null && statusCode >= 200 && statusCode < 300;
    const gone = statusCode === 410;
    const refused = errorClass !== null && FINAL_ERRORS.has(errorClass);
    const delay = delivered || gone || refused ? undefined : retryDelay(this.retry, delivery.retries);
    const final = delivered ? 'delivered' : gone ? 'gone' : delay === undefined ? 'failed' : undefined;
    const nextRetryAt = delay === undefined ? null : new Date(Date.now() + delay);
    const attempt = { statusCode, errorClass, error, latencyMs, nextRetryAt };
    if (!(await this.deps.tx.run((trx) => repo.recordAttempt(fenceOf(delivery), attempt, final ? { status: final } : undefined, trx)))) {
      throw new LeaseLost('the delivery was taken over by another worker');
    }

    metrics.webhookAttempts.inc({ outcome: delivered ? 'delivered' : gone ? 'gone' : (errorClass ?? 'http_error') });
    metrics.webhookDuration.observe(latencyMs / 1000);
    const fields = { deliveryId: delivery.id, taskId: delivery.taskId, statusCode, errorClass, latencyMs, tries: delivery.retries + 1 };
    if (delivered) log.info(fields, 'webhook delivered');
    else if (gone) log.info(fields, 'webhook receiver answered 410 Gone; not sending again');
    else if (final) log.warn({ ...fields, error }, refused ? 'webhook target refused; not sending' : 'webhook delivery failed after its last retry');
    else log.info({ ...fields, error, nextRetryAt }, 'webhook attempt failed; retrying');
    // The attempt counted itself in `retries` where it was recorded: the hand-back only releases the row until then.
    return final ? DONE : later(delay!);
  }

  /** The engine could not run the delivery (not a receiver failure): give it up, said in last_error. */
  async giveUp(delivery: WebhookDeliveryRow, err: unknown, log: Logger): Promise<void> {
    await this.abandon(delivery, err, log);
  }

  private async abandon(delivery: WebhookDeliveryRow, err: unknown, log: Logger): Promise<boolean> {
    log.error({ err, deliveryId: delivery.id }, 'webhook delivery could not be run; giving up');
    return this.deps.repo.markFailed(fenceOf(delivery), cannotRun(err));
  }

  /**
   * The delivery's signing secrets could not be had, so nothing was sent. The database away is
   * every leased row's case: rethrown, the delivery resumes after its lease and keeps its retries.
   * Any other failed statement may pass: retried on the schedule as a failed attempt would be, its
   * reason recorded with the retry. Anything else came from decrypting the stored secret with this
   * process's key, which gives the same answer on every retry (a changed MEDIAGATE_SECRET_KEY,
   * damaged bytes): the delivery is given up now rather than retried for the schedule's whole day
   * while it looks merely pending; an operator redelivers it once the key is right.
   */
  private async unsent(delivery: WebhookDeliveryRow, err: unknown, log: Logger): Promise<StepResult> {
    if (isDatabaseUnavailable(err)) throw err;
    if (!isStatementError(err)) {
      if (!(await this.abandon(delivery, err, log))) throw new LeaseLost('the delivery was taken over by another worker');
      return DONE;
    }
    const delay = retryDelay(this.retry, delivery.retries);
    const nextRetryAt = delay === undefined ? null : new Date(Date.now() + delay);
    if (!(await this.deps.repo.recordUnsent(fenceOf(delivery), cannotRun(err), nextRetryAt))) throw new LeaseLost('the delivery was taken over by another worker');
    const fields = { err, deliveryId: delivery.id, taskId: delivery.taskId, tries: delivery.retries + 1 };
    if (delay === undefined) {
      log.error(fields, 'webhook delivery could not be made ready to send after its last retry; giving up');
      return DONE;
    }
    log.warn({ ...fields, nextRetryAt }, 'webhook delivery could not be made ready to send; retrying');
    return later(delay);
  }
}

/** The reason a delivery the gateway could not run shows in `last_error` (the operator's view). */
const cannotRun = (err: unknown): string => `the delivery could not be run: ${err instanceof Error ? err.message : String(err)}`;

/** An error PostgreSQL answered a statement with (it carries a SQLSTATE and a severity). */
function isStatementError(err: unknown): boolean {
  const e = err as { code?: unknown; severity?: unknown } | null;
  return typeof e === 'object' && e !== null && typeof e.code === 'string' && typeof e.severity === 'string';
}
