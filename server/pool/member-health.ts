/**
 * How the pool learns from each upstream answer (design §8). Every adapter call runs through
 * `observe`, which keeps the per-member metrics and records the outcome in the shared
 * member_health table:
 *
 *   429 rate limited   cooldown for the upstream's Retry-After, else 1 s, 2 s, 4 s … up to 60 s,
 *                      one step per burst (the calls in flight when it began refusing count once,
 *                      as the circuit's failures do); the doubling restarts once the member takes
 *                      new work (`observe`), not when
 *                      it answers about work it has (`observeAccepted`: polls keep succeeding at a
 *                      parallel-task limit while every submit is refused)
 *   quota exhausted    cooldown for its Retry-After, else 5 minutes
 *   5xx / timeout /    after 3 in a row (across instances), the circuit opens: no new work for
 *   connection error   30 s, doubling with every further failure up to 5 minutes (see below)
 *   401 / 403          the member is taken out until an admin changes it (credentials_rejected_at)
 *   404 / NOT_FOUND    the member is left out for that model only (member_model_faults, `faultModel`;
 *   model not open     for 10 minutes, or until an admin changes it when the account lacks the model)
 *   account disabled   arrears, an exhausted balance or resource pack: out until an admin changes it
 *   anything else      the member answered: counts as a success (a content-policy refusal is
 *                      about the request, not the account)
 *
 * Successes are counted in memory and written once a second in one statement, so the hot path
 * adds no SQL; failures are written at once, because they change where the next request goes.
 *
 * What blames the member's configuration (rejected credentials, a disabled account, a model it
 * cannot serve: the rows "until an admin changes it") is fenced on the configuration the call used
 * (`UpstreamAccount.configVersion`): once an admin has changed the member, an answer to the old
 * credentials — a call in flight across the change, or one made from a cache that had not yet
 * heard of it — records nothing, instead of taking the fixed member out again. Cooldowns, the
 * circuit and the 429 backoff are not fenced: they are about the upstream's state, not what the
 * admin changed, and they end by themselves.
 *
 * The circuit (issue 26, item 7). "In a row" counts outages, not calls: a failure counts only when
 * its call started after the last counted failure was recorded, so the twenty calls in flight when
 * an upstream went away count once, and a five-second outage opens the circuit for 30 s, not
 * 5 minutes. Once the cooldown is over the circuit is half-open: one call (the probe, claimed by
 * `claimProbe` across all instances, for PROBE_LEASE_MS at most) goes through while the pool keeps
 * everything else away. Its success is written at once, closing the circuit for every instance (the
 * cleared cooldown sends NOTIFY mediagate_config); its failure counts and re-opens it for twice as
 * long. Any success of a call that started after the last counted failure closes the circuit too
 * (a sticky poll of an accepted job, say); a call that was already running then proves nothing.
 */
import type { Logger } from '../logger.ts';
import type { Metrics } from '../metrics.ts';
import { ProviderError } from '../providers/provider-error.ts';
import type { UpstreamAccount } from '../providers/types.ts';
import type { CircuitPolicy, MemberHealthRepository, ProbeClaim, SuccessCount } from '../repositories/member-health.repository.ts';

export type { ProbeClaim } from '../repositories/member-health.repository.ts';

export const RATE_LIMIT_BACKOFF = { baseMs: 1000, maxMs: 60_000 };
export const QUOTA_COOLDOWN_MS = 5 * 60_000;
export const CIRCUIT: CircuitPolicy = { threshold: 3, baseMs: 30_000, maxMs: 5 * 60_000 };
/**
 * How long a probe keeps other calls away from a half-open member at most: a probe that outlives it
 * (a slow answer, or its process died) lets the next one through. A probe that ends without an
 * answer about the member gives its claim back at once.
 */
export const PROBE_LEASE_MS = 60_000;
const FLUSH_MS = 1000;
/**
 * How long a member is left out for a model the upstream said it does not know (a wrong base URL or
 * model map): long enough not to spend a call per request on it, short enough to notice a fix made
 * at the upstream rather than here.
 */
export const MISCONFIGURED_FAULT_MS = 10 * 60_000;

export class MemberHealth {
  private successes = new Map<string, SuccessCount>();
  private flushing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  /** Set by `stop`: the database is about to close, so no batch is scheduled any more. */
  private stopped = false;

  constructor(
    private readonly repo: MemberHealthRepository,
    private readonly metrics: Metrics,
    private readonly log: Logger,
  ) {}

  /**
   * Runs one adapter call that gives `account` new work (a video submit, an image), measuring it and
   * recording what it says about the member.
   * `probe`: the call is the probe of a half-open circuit (`claimProbe`): its outcome is written at
   * once, and a call that ends without one (not a ProviderError) gives the claim back.
   * `signal`: the caller's, so that a call it cut short is counted `aborted`, not `error`.
   */
  observe<T>(account: UpstreamAccount, call: () => Promise<T>, probe?: ProbeClaim, signal?: AbortSignal): Promise<T> {
    return this.run(account, call, true, probe, signal);
  }

  /**
   * Runs one adapter call about work `account` already accepted (a poll, a download, a cancel), as
   * `observe` does, except that its success does not end a 429 backoff: an answered poll does not
   * mean a submit would be.
   */
  observeAccepted<T>(account: UpstreamAccount, call: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    return this.run(account, call, false, undefined, signal);
  }

  private async run<T>(account: UpstreamAccount, call: () => Promise<T>, newWork: boolean, probe?: ProbeClaim, signal?: AbortSignal): Promise<T> {
    const labels = { provider: account.provider, member: account.memberId };
    const started = process.hrtime.bigint();
    const startedAt = performance.now();
    this.metrics.upstreamInFlight.inc(labels);
    // The call's metrics end with the call: the health writes after it (a 429's two round trips) are not upstream latency.
    const ended = (outcome: string) => {
      this.metrics.upstreamInFlight.dec(labels);
      this.metrics.upstreamDuration.observe(labels, Number(process.hrtime.bigint() - started) / 1e9);
      this.metrics.upstreamRequests.inc({ ...labels, outcome });
    };
    let result: T;
    try {
      result = await call();
    } catch (err) {
      if (err instanceof ProviderError) {
        ended(err.kind);
        await this.failed(account, err, startedAt, probe);
      } else {
        // No answer about the member: the caller cut the call short, or the gateway failed inside it.
        ended(signal?.aborted || (err instanceof Error && err.name === 'AbortError') ? 'aborted' : 'error');
        if (probe) await this.releaseProbe(probe);
      }
      throw err;
    }
    ended('ok');
    await this.succeeded(account.memberId, startedAt, newWork, probe);
    return result;
  }

  /**
   * Claims the probe of a member whose circuit is open and whose cooldown is over (see above):
   * `taken` when another call of any instance holds it, `not_open` when the circuit closed meanwhile.
   */
  claimProbe(memberId: string): Promise<ProbeClaim | 'taken' | 'not_open'> {
    return this.repo.claimProbe(memberId, PROBE_LEASE_MS);
  }

  /** Gives a claimed probe back without an outcome (the work never ran, or ended for its own reasons). */
  async releaseProbe(probe: ProbeClaim): Promise<void> {
    try {
      await this.repo.releaseProbe(probe);
    } catch (err) {
      // The claim's lease ends it anyway.
      this.log.warn({ err, memberId: probe.memberId }, 'could not give a member probe back');
    }
  }

  /**
   * Records a failure of a call that started at `startedAt` (`performance.now()`) by its kind (see
   * the table above). Never throws: health is best effort.
   */
  async failed(account: UpstreamAccount, err: ProviderError, startedAt: number, probe?: ProbeClaim): Promise<void> {
    const memberId = account.memberId;
    const message = err.message;
    // For the kinds that blame the configuration (see above).
    const configVersion = account.configVersion;
    try {
      switch (err.kind) {
        case 'rate_limited': {
          // One strike per burst and the backoff from the strikes before it, in the one statement.
          const { cooldownMs } = await this.repo.recordFailure(memberId, { message, startedAt, rateLimit: { retryAfterMs: err.retryAfterMs, ...RATE_LIMIT_BACKOFF } });
          // The client is told how long the member is aside when the upstream said nothing (apiErrorOf).
          if (cooldownMs > 0) err.cooldownMs = cooldownMs;
          this.log.warn({ memberId, cooldownMs }, 'upstream member rate limited; cooling down');
          return;
        }
        case 'quota_exhausted':
          await this.repo.recordFailure(memberId, { message, startedAt, cooldown: { ms: err.retryAfterMs ?? QUOTA_COOLDOWN_MS, reason: 'quota_exhausted' } });
          this.log.warn({ memberId }, 'upstream member quota exhausted; cooling down');
          return;
        case 'retryable': {
          // The circuit's length follows the streak as the database counts it (concurrent instances included).
          const { consecutiveFailures, counted } = await this.repo.recordFailure(memberId, { message, startedAt, circuit: CIRCUIT });
          if (counted && consecutiveFailures >= CIRCUIT.threshold) {
            const openMs = Math.min(CIRCUIT.maxMs, CIRCUIT.baseMs * 2 ** (consecutiveFailures - CIRCUIT.threshold));
            this.log.warn({ memberId, failures: consecutiveFailures, openMs, probe: probe !== undefined }, 'upstream member failing repeatedly; circuit open');
          }
          return;
        }
        case 'misconfigured':
        case 'model_not_open':
          // The member's configuration, for one model (the pool records that: faultModel); the
          // member itself answered, so no cooldown or circuit — its other models keep working.
          await this.repo.recordFailure(memberId, { message, startedAt, configVersion });
          return;
        case 'account_disabled':
          if (!(await this.repo.recordFailure(memberId, { message, startedAt, disableAccount: message, configVersion })).recorded) return this.changedSince(account, err);
          this.log.error({ memberId, provider: account.provider, reason: message }, 'upstream account cannot take work (billing: arrears, balance or resource pack); it takes no new work until an admin updates it');
          return;
        case 'auth':
          if (!(await this.repo.recordFailure(memberId, { message, startedAt, rejectCredentials: true, configVersion })).recorded) return this.changedSince(account, err);
          this.log.error({ memberId, provider: account.provider }, 'upstream member credentials rejected; it takes no new work until an admin updates it');
          return;
        default:
          // The member answered (a refusal is about the request): for the circuit, a success; it
          // took no work, so a 429 backoff goes on.
          await this.succeeded(memberId, startedAt, false, probe);
      }
    } catch (recordErr) {
      this.log.warn({ err: recordErr, memberId }, 'could not record member health');
    } finally {
      // Whatever the answer recorded (a re-opened or closed circuit already ended the claim; a 429,
      // an exhausted quota or rejected credentials put their own cooldown in its place), this probe is over.
      if (probe) await this.releaseProbe(probe);
    }
  }

  /**
   * The upstream told the member it cannot serve `model` (a 404 for the model or the API path: a
   * wrong base URL or model map): the pool leaves the member out for that model for
   * MISCONFIGURED_FAULT_MS (or until an operator changes the member), and member health shows why.
   * Never throws.
   */
  async faultModel(account: UpstreamAccount, model: string, err: ProviderError): Promise<void> {
    const code = [err.upstreamStatus && `HTTP ${err.upstreamStatus}`, err.upstreamCode].filter(Boolean).join(' ') || 'not found';
    const reason = `${code}: ${err.message}`;
    // Not activated: only the account's owner changes that (no expiry); a 404 may be fixed upstream.
    const notOpen = err.kind === 'model_not_open';
    const untilMs = notOpen ? null : MISCONFIGURED_FAULT_MS;
    try {
      if (!(await this.repo.recordModelFault(account.memberId, model, { kind: notOpen ? 'model_not_open' : 'misconfigured', reason, untilMs, configVersion: account.configVersion }))) {
        return this.changedSince(account, err);
      }
      this.log.error(
        { memberId: account.memberId, provider: account.provider, model, reason, retryInMs: untilMs },
        notOpen
          ? 'upstream account has not activated this model; the member takes no work for it until an admin changes the member'
          : 'upstream member cannot serve this model (check its base URL and model map); it takes no work for the model until an admin changes it or the fault expires',
      );
    } catch (recordErr) {
      this.log.warn({ err: recordErr, memberId: account.memberId }, 'could not record a model fault of the member');
    }
  }

  /** A failure that blamed a configuration the member no longer has (or a member since deleted): not recorded. */
  private changedSince(account: UpstreamAccount, err: ProviderError): void {
    this.log.warn({ memberId: account.memberId, provider: account.provider, kind: err.kind, err: err.message }, 'upstream answer about a member configuration changed since the call was made; not recorded');
  }

  /**
   * Counts a success of a call that started at `startedAt` (`newWork`: the member took new work),
   * written with the next batch; a probe's is written at once (it closes the circuit for every
   * instance). Never throws.
   */
  private async succeeded(memberId: string, startedAt: number, newWork: boolean, probe?: ProbeClaim): Promise<void> {
    if (probe) {
      try {
        await this.repo.recordSuccesses(new Map([[memberId, { calls: 1, lastStartedAt: startedAt, ...(newWork && { lastNewWorkStartedAt: startedAt }) }]]));
        this.log.info({ memberId }, 'upstream member answered its probe; circuit closed');
      } catch (err) {
        this.log.warn({ err, memberId }, 'could not record member health');
      }
      return;
    }
    const counted = this.successes.get(memberId);
    if (counted) {
      counted.calls++;
      counted.lastStartedAt = Math.max(counted.lastStartedAt, startedAt);
      if (newWork) counted.lastNewWorkStartedAt = Math.max(counted.lastNewWorkStartedAt ?? startedAt, startedAt);
    } else this.successes.set(memberId, { calls: 1, lastStartedAt: startedAt, ...(newWork && { lastNewWorkStartedAt: startedAt }) });
    // After `stop` a success comes only from a call that outlived the process's stop: it is dropped
    // with the process, as a crash would drop it (a count of calls, not money or a task).
    if (this.stopped) return;
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

  /** Writes what is counted and schedules nothing more: before the database closes (main.ts). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    await this.flush();
  }
}
