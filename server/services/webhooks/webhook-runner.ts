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
 *
 * At most WEBHOOK_HOST_CONCURRENCY deliveries to one host (host:port) are sent at once on an
 * instance (`HostSlots`): one account's receiver that never answers would otherwise hold every slot
 * of the engine for its timeout, and every other account's webhooks would wait. One account's
 * deliveries, whatever hosts and ports their URLs name (a wildcard DNS name serves any number of
 * hosts), take at most WEBHOOK_ACCOUNT_CONCURRENCY slots (`HostSlots` keyed by account). A delivery
 * claimed while its host or its account is at the cap sends nothing, records no attempt and keeps
 * its retries: it is handed back for a later turn.
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
import { sendSignedWebhook, type SendOutcome } from './webhook-send.ts';

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
  /** Deliveries sent at once to one host (WEBHOOK_HOST_CONCURRENCY); unset: no cap per host. */
  hostConcurrency?: number;
  /** Deliveries of one account sent at once, to any hosts (WEBHOOK_ACCOUNT_CONCURRENCY); unset: no cap per account. */
  accountConcurrency?: number;
  allowPrivate: boolean;
  /** Test seams: the resolver and extra trusted CAs of safeFetch. */
  fetchOptions?: Pick<SafeFetchOptions, 'resolve' | 'ca' | 'treatAsPublic'>;
}

export class WebhookRunner implements TaskRunner<WebhookDeliveryRow> {
  readonly name = 'webhook';
  readonly retry: RetryPolicy;

  private readonly hosts: HostSlots | undefined;

  private readonly accounts: HostSlots | undefined;

  constructor(private readonly deps: WebhookRunnerDeps) {
    this.retry = { maxRetries: deps.scheduleMs.length, baseDelayMs: 0, maxDelayMs: 0, scheduleMs: deps.scheduleMs, scheduleJitter: SCHEDULE_JITTER };
    this.hosts = deps.hostConcurrency === undefined ? undefined : new HostSlots(deps.hostConcurrency);
    this.accounts = deps.accountConcurrency === undefined ? undefined : new HostSlots(deps.accountConcurrency);
  }

  get leases() {
    return this.deps.repo.leases;
  }

  async step(delivery: WebhookDeliveryRow, signal: AbortSignal, log: Logger): Promise<StepResult> {
    const { repo, metrics } = this.deps;
    const host = hostOf(delivery.url);
    const slot = host === undefined ? undefined : this.hosts?.take(host);
    if (slot && 'retryInMs' in slot) {
      // Not an attempt: `later` keeps the retries (stepsCountRetries), and nothing is recorded.
      log.debug({ deliveryId: delivery.id, host, retryInMs: slot.retryInMs }, 'webhook host at its cap of deliveries in flight; delivery put back');
      return later(slot.retryInMs);
    }
    const accountSlot = this.accounts?.take(delivery.accountId);
    if (accountSlot && 'retryInMs' in accountSlot) {
      slot?.release();
      log.debug({ deliveryId: delivery.id, accountId: delivery.accountId, retryInMs: accountSlot.retryInMs }, 'webhook account at its cap of deliveries in flight; delivery put back');
      return later(accountSlot.retryInMs);
    }
    const release = () => {
      slot?.release();
      accountSlot?.release();
    };
    let sent: SendOutcome;
    try {
      let secrets: string[];
      try {
        secrets = await this.deps.secrets.signing(delivery.accountId);
      } catch (err) {
        release(); // nothing is sent: the slots are not held while the try is recorded
        return this.unsent(delivery, err, log);
      }
      sent = await sendSignedWebhook(delivery.url, delivery.id, delivery.payload, secrets, {
        timeoutMs: this.deps.timeoutMs,
        allowPrivate: this.deps.allowPrivate,
        signal, // lease lost or shutting down: rethrown, the attempt resumes after the lease
        fetchOptions: this.deps.fetchOptions,
      });
    } finally {
      release();
    }
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

/** A deferred delivery comes back at least this long after it was put back… */
const DEFER_MIN_MS = 1000;
/** …plus up to this much at random (more with a queue: half its length), so they do not come back together. */
const DEFER_JITTER_MS = 2000;
/** The furthest ahead a turn is given: a receiver that recovers gets its backlog within about a minute and a half. */
const MAX_QUEUE_MS = 60_000;

/** The host and port a delivery goes to (lower case, the scheme's port when none is named); undefined: not a URL (the send refuses it). */
export function hostOf(url: string): string | undefined {
  try {
    const u = new URL(url);
    return `${u.hostname}:${u.port || (u.protocol === 'https:' ? '443' : '80')}`;
  } catch {
    return undefined;
  }
}

interface HostEntry {
  inFlight: number;
  /** When the next delivery put back for this host gets its turn (a queue: the later, the more wait). */
  nextTurnAt: number;
  /** How long a send to this host holds its slot (a moving average of those done); undefined: none done yet. */
  slotMs: number | undefined;
}

/**
 * Deliveries in flight per key on this instance (a target host; an account), and when one that
 * found its key at the cap should come back. Those put back get turns one after the other, a slot's expected time
 * (how long this host's sends take, shared by the cap's slots) apart, so they come back about as
 * fast as the host takes them: a backlog of thousands for a host that never answers costs a claim
 * and a reschedule a few times a second, not thousands every few seconds, and other hosts' rows,
 * due sooner, are claimed first. A host's entry lives while a delivery to it is in flight or its
 * queue has not run out.
 */
export class HostSlots {
  private readonly hosts = new Map<string, HostEntry>();

  constructor(
    private readonly cap: number,
    private readonly now: () => number = Date.now,
    private readonly random: () => number = Math.random,
  ) {}

  /** A slot of `host` (release it when the send is over), or how long to wait before trying again. */
  take(host: string): { release: () => void } | { retryInMs: number } {
    const now = this.now();
    let entry = this.hosts.get(host);
    if (!entry) {
      this.prune(now);
      entry = { inFlight: 0, nextTurnAt: now, slotMs: undefined };
      this.hosts.set(host, entry);
    }
    if (entry.inFlight >= this.cap) {
      const ahead = Math.min(MAX_QUEUE_MS, Math.max(0, entry.nextTurnAt - now));
      entry.nextTurnAt = now + ahead + (entry.slotMs ?? DEFER_MIN_MS) / this.cap;
      return { retryInMs: Math.round(DEFER_MIN_MS + ahead + this.random() * (DEFER_JITTER_MS + ahead / 2)) };
    }
    entry.inFlight++;
    const held = entry;
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        const at = this.now();
        held.inFlight--;
        held.slotMs = held.slotMs === undefined ? at - now : (held.slotMs + at - now) / 2;
        if (held.inFlight === 0 && held.nextTurnAt <= at) this.hosts.delete(host);
      },
    };
  }

  /** Hosts with an entry (in flight, or with deliveries put back whose turns are still ahead). */
  get size(): number {
    return this.hosts.size;
  }

  /** Drops hosts with nothing in flight whose queue ran out (their last deliveries went elsewhere, or never came back). */
  private prune(now: number): void {
    for (const [host, entry] of this.hosts) if (entry.inFlight === 0 && entry.nextTurnAt <= now) this.hosts.delete(host);
  }
}
