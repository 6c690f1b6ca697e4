/**
 * How the pool learns from each upstream answer (design §8). Every adapter call runs through
 * `observe`, which keeps the per-member metrics and records the outcome in the shared
 * member_health table:
 *
 *   429 rate limited   cooldown for the upstream's Retry-After, else 1 s, 2 s, 4 s … up to 60 s
 *   quota exhausted    cooldown for its Retry-After, else 5 minutes
 *   5xx / timeout /    after 3 in a row (across instances), the circuit opens: no new work for
 *   connection error   30 s, doubling with every further failure up to 5 minutes
 *   401 / 403          the member is taken out until an admin changes it (credentials_rejected_at)
 *   anything else      the member answered: counts as a success (a content-policy refusal is
 *                      about the request, not the account)
 *
 * Successes are counted in memory and written once a second in one statement, so the hot path
 * adds no SQL; failures are written at once, because they change where the next request goes.
 */
import type { Logger } from '../logger.ts';
import type { Metrics } from '../metrics.ts';
import { ProviderError } from '../providers/provider-error.ts';
import type { UpstreamAccount } from '../providers/types.ts';
import type { MemberHealthRepository } from '../repositories/member-health.repository.ts';

export const RATE_LIMIT_BACKOFF = { baseMs: 1000, maxMs: 60_000 };
export const QUOTA_COOLDOWN_MS = 5 * 60_000;
export const CIRCUIT = { threshold: 3, baseMs: 30_000, maxMs: 5 * 60_000 };
const FLUSH_MS = 1000;

export class MemberHealth {
  private successes = new Map<string, number>();
  private flushing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly repo: MemberHealthRepository,
    private readonly metrics: Metrics,
    private readonly log: Logger,
  ) {}

  /** Runs one adapter call on `account`, measuring it and recording what it says about the member. */
  async observe<T>(account: UpstreamAccount, call: () => Promise<T>): Promise<T> {
    const labels = { provider: account.provider, member: account.memberId };
    const started = process.hrtime.bigint();
    this.metrics.upstreamInFlight.inc(labels);
    try {
      const result = await call();
      this.metrics.upstreamRequests.inc({ ...labels, outcome: 'ok' });
      this.succeeded(account.memberId);
      return result;
    } catch (err) {
      if (err instanceof ProviderError) {
        this.metrics.upstreamRequests.inc({ ...labels, outcome: err.kind });
        await this.failed(account, err);
      }
      throw err;
    } finally {
      this.metrics.upstreamInFlight.dec(labels);
      this.metrics.upstreamDuration.observe(labels, Number(process.hrtime.bigint() - started) / 1e9);
    }
  }

  /** Records a failure by its kind (see the table above). Never throws: health is best effort. */
  async failed(account: UpstreamAccount, err: ProviderError): Promise<void> {
    const memberId = account.memberId;
    const message = err.message;
    try {
      switch (err.kind) {
        case 'rate_limited': {
          const { rateLimitStrikes } = await this.repo.strikes(memberId);
          const ms = err.retryAfterMs ?? Math.min(RATE_LIMIT_BACKOFF.maxMs, RATE_LIMIT_BACKOFF.baseMs * 2 ** rateLimitStrikes);
          await this.repo.recordFailure(memberId, { message, rateLimited: true, cooldown: { ms, reason: 'rate_limited' } });
          this.log.warn({ memberId, cooldownMs: ms }, 'upstream member rate limited; cooling down');
          return;
        }
        case 'quota_exhausted':
          await this.repo.recordFailure(memberId, { message, cooldown: { ms: err.retryAfterMs ?? QUOTA_COOLDOWN_MS, reason: 'quota_exhausted' } });
          this.log.warn({ memberId }, 'upstream member quota exhausted; cooling down');
          return;
        case 'retryable': {
          const { consecutiveFailures } = await this.repo.strikes(memberId);
          const beyond = Math.max(0, consecutiveFailures + 1 - CIRCUIT.threshold);
          const ms = Math.min(CIRCUIT.maxMs, CIRCUIT.baseMs * 2 ** beyond);
          await this.repo.recordFailure(memberId, { message, circuit: { threshold: CIRCUIT.threshold, ms } });
          if (consecutiveFailures + 1 >= CIRCUIT.threshold) this.log.warn({ memberId, failures: consecutiveFailures + 1, openMs: ms }, 'upstream member failing repeatedly; circuit open');
          return;
        }
        case 'auth':
          await this.repo.recordFailure(memberId, { message, rejectCredentials: true });
          this.log.error({ memberId, provider: account.provider }, 'upstream member credentials rejected; it takes no new work until an admin updates it');
          return;
        default:
          this.succeeded(memberId);
      }
    } catch (recordErr) {
      this.log.warn({ err: recordErr, memberId }, 'could not record member health');
    }
  }

  private succeeded(memberId: string): void {
    this.successes.set(memberId, (this.successes.get(memberId) ?? 0) + 1);
    this.timer ??= setTimeout(() => {
      this.timer = undefined;
      void this.flush();
    }, FLUSH_MS).unref();
  }

  /** Writes the counted successes (also on shutdown). */
  async flush(): Promise<void> {
    await this.flushing;
    if (this.successes.size === 0) return;
    const batch = this.successes;
    this.successes = new Map();
    this.flushing = this.repo.recordSuccesses(batch).catch((err: unknown) => this.log.warn({ err }, 'could not record member successes'));
    await this.flushing;
  }

  async stop(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    await this.flush();
  }
}
