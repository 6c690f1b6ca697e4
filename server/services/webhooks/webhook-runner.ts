/**
 * Webhook deliveries as leased work for the task engine (design §6): any instance claims due
 * deliveries (FOR UPDATE SKIP LOCKED), and one step is one attempt:
 *
 *   sign     Standard Webhooks with the `standardwebhooks` package: `webhook-id` (the delivery id,
 *            the same on every attempt), `webhook-timestamp` (this attempt), `webhook-signature`
 *            (`v1,…` per signing secret: two during a rotation's overlap)
 *   send     POST the frozen body through safeFetch: https only, every resolved address checked and
 *            connected to directly, no proxies, no redirects followed, a short timeout, at most 4 KiB
 *            of the answer read and dropped
 *   record   the attempt (status code or error class, latency, next retry) and the outcome, fenced:
 *            2xx delivered · 410 gone (stop) · refused target (blocked or invalid URL) failed at once ·
 *            anything else retried on the published schedule, then failed
 *
 * Delivery is at least once: a worker that dies after the receiver answered and before the attempt
 * was recorded leaves the row to be claimed again, and the receiver sees the same `webhook-id` twice.
 */
import { performance } from 'node:perf_hooks';
import { Webhook } from 'standardwebhooks';
import type { Transactor } from '../../db/transaction.ts';
import { SafeFetchError, safeFetch, type SafeFetchOptions } from '../../lib/safe-fetch.ts';
import type { Logger } from '../../logger.ts';
import type { Metrics } from '../../metrics.ts';
import { fenceOf } from '../../repositories/leased-tasks.ts';
import type { WebhookDeliveryRow, WebhookRepository } from '../../repositories/webhook.repository.ts';
import { retryDelay, type RetryPolicy } from '../tasks/retry-policy.ts';
import { DONE, LeaseLost, retryIn, type StepResult, type TaskRunner } from '../tasks/task-runner.ts';
import type { WebhookSecrets } from './webhook-secrets.ts';

/** Bytes of a receiver's answer read (then dropped). */
const MAX_RESPONSE_BYTES = 4096;
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
    this.retry = { maxRetries: deps.scheduleMs.length, baseDelayMs: 0, maxDelayMs: 0, scheduleMs: deps.scheduleMs };
  }

  get leases() {
    return this.deps.repo.leases;
  }

  async step(delivery: WebhookDeliveryRow, signal: AbortSignal, log: Logger): Promise<StepResult> {
    const { repo, secrets, metrics } = this.deps;
    const at = new Date();
    const body = delivery.payload;
    const signature = (await secrets.signing(delivery.accountId)).map((secret) => new Webhook(secret).sign(delivery.id, at, body)).join(' ');
    const headers = {
      'content-type': 'application/json',
      'user-agent': 'Mediagate-Webhooks/1',
      'webhook-id': delivery.id,
      'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
      'webhook-signature': signature,
    };

    const started = performance.now();
    let statusCode: number | null = null;
    let errorClass: string | null = null;
    let error: string | null = null;
    try {
      const res = await safeFetch(delivery.url, {
        method: 'POST',
        headers,
        body,
        timeoutMs: this.deps.timeoutMs,
        maxResponseBytes: MAX_RESPONSE_BYTES,
        allowPrivate: this.deps.allowPrivate,
        signal,
        ...this.deps.fetchOptions,
      });
      statusCode = res.status;
      if (statusCode < 200 || statusCode >= 300) error = `the receiver answered HTTP ${statusCode}`;
    } catch (err) {
      if (signal.aborted) throw err; // lease lost or shutting down: the attempt resumes after the lease
      if (!(err instanceof SafeFetchError)) throw err;
      errorClass = err.errorClass;
      error = err.message;
    }
    const latencyMs = Math.round(performance.now() - started);

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
    return final ? DONE : retryIn(delay!);
  }

  /** The engine could not run the delivery (not a receiver failure): give it up, said in last_error. */
  async giveUp(delivery: WebhookDeliveryRow, err: unknown, log: Logger): Promise<void> {
    log.error({ err, deliveryId: delivery.id }, 'webhook delivery could not be run; giving up');
    await this.deps.repo.markFailed(fenceOf(delivery), `the delivery could not be run: ${err instanceof Error ? err.message : String(err)}`);
  }
}
