/**
 * What the pool learned about each member from its answers (table member_health), shared by every
 * instance. Each write is one upsert computed in SQL, so concurrent instances never lose an update;
 * the policy (how long a cooldown lasts) is decided by the caller, `pool/member-health.ts`.
 *
 * Times are compared on the database's clock only. A call's start is given as a reading of this
 * process's monotonic clock (`performance.now()`) and turned into the database's time as "now()
 * minus the time since", measured once the statement's connection is in hand, so neither the
 * instances' clocks nor a wait for a pooled connection move it.
 */
import { sql, type Kysely, type RawBuilder } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { MEMBER_CONFIG_VERSION } from './routing.repository.ts';

export type CooldownReason = 'rate_limited' | 'quota_exhausted' | 'circuit_open';

/** When the circuit of a member opens, and for how long (the caller's policy; applied in SQL). */
export interface CircuitPolicy {
  /** Counted failures in a row that open it (at least 2: a member's first failure never does). */
  threshold: number;
  /** How long it opens at the threshold; doubled with every counted failure beyond it, up to maxMs. */
  baseMs: number;
  maxMs: number;
}

/** A call let through to a member whose circuit is open (`claimProbe`): the lease it holds. */
export interface ProbeClaim {
  memberId: string;
  /** The claim's lease end: another call may probe once it passes. Also identifies the claim. */
  until: Date;
}

/** Successful calls of one member to record: how many, and when the last of them started (`performance.now()`). */
export interface SuccessCount {
  calls: number;
  lastStartedAt: number;
  /** When the last of them that gave the member new work (a submit, an image) started; absent: none did. */
  lastNewWorkStartedAt?: number;
}

/** Recent counts restart after this long. */
const WINDOW = sql`interval '1 hour'`;

/**
 * The member (group_members `m`) a health write applies to, fenced on the configuration version the
 * call used when one is given. FOR SHARE waits for an admin's update of the row in progress and
 * then re-reads it (read committed), so a write whose snapshot predates the change still sees the
 * new version and applies nothing; the admin clears the member's health after updating the row, so
 * a write that passed first is cleared with the rest.
 */
function memberOf(memberId: string, configVersion: string | undefined) {
  return configVersion === undefined
    ? sql`from group_members m where m.id = ${memberId}`
    : sql`from group_members m where m.id = ${memberId} and ${MEMBER_CONFIG_VERSION} = ${configVersion} for share of m`;
}

export class MemberHealthRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /**
   * Runs `write` on one connection of the pool, handing it a function that turns a call's start
   * (`performance.now()`) into milliseconds before the database's now(), measured with the
   * connection in hand: only the statement's own trip separates the two readings.
   */
  private withElapsed<T>(write: (db: Kysely<DB>, msSince: (startedAt: number) => number) => Promise<T>): Promise<T> {
    return this.db.connection().execute((conn) => {
      const now = performance.now();
      return write(conn, (startedAt) => Math.max(0, now - startedAt));
    });
  }

  /**
   * Records a failed call that started at `startedAt` (`performance.now()`). `cooldown` (when set)
   * puts the member aside for `ms` (keeping a longer cooldown already in place); `rejectCredentials`
   * takes the member out until an admin changes it. `configVersion` (a failure that blames the
   * member's configuration) records it only while the member still has that version: else, or for
   * a member since deleted, nothing is written and `recorded` is false.
   *
   * `circuit` makes the failure one of a streak (5xx, timeouts, connection errors). It counts only
   * when its call started after the last counted failure was recorded: the calls in flight when an
   * outage began fail together and count once. A counted failure that brings the streak to the
   * threshold, or any counted failure while the circuit is open (a failed probe), opens it for
   * baseMs × 2^(streak − threshold), at most maxMs, and ends any probe.
   * Returns the streak after this failure and whether this one counted.
   */
  async recordFailure(
    memberId: string,
    f: {
      message: string;
      startedAt: number;
      /**
       * A 429: one strike when its call started after the last counted one was recorded (a burst of
       * concurrent 429s is one strike), and a cooldown of `retryAfterMs` (the upstream's word) or else
       * baseMs × 2^strikes before this one, at most maxMs, computed in this statement.
       */
      rateLimit?: { retryAfterMs: number | undefined; baseMs: number; maxMs: number };
      cooldown?: { ms: number; reason: CooldownReason };
      circuit?: CircuitPolicy;
      rejectCredentials?: boolean;
      /** The upstream account cannot take work until its owner acts (arrears, an exhausted resource pack): why. */
      disableAccount?: string;
      /** The member's configuration version the call used (`UpstreamAccount.configVersion`). */
      configVersion?: string;
    },
  ): Promise<{ consecutiveFailures: number; counted: boolean; recorded: boolean; cooldownMs: number }> {
    const c = f.circuit;
    const r = f.rateLimit;
    return this.withElapsed(async (db, msSince) => {
      const started = sql`now() - ${msSince(f.startedAt)}::float8 * interval '1 millisecond'`;
      // A 429's strike counts once per burst; its backoff from the strikes counted before it.
      const strikeCounts = r ? sql`(member_health.rate_limit_counted_at is null or ${started} > member_health.rate_limit_counted_at)` : sql`false`;
      const backoffMs = (strikes: RawBuilder<unknown>) =>
        r!.retryAfterMs !== undefined ? sql`${Math.round(r!.retryAfterMs)}::float8` : sql`least(${r!.maxMs}::float8, ${r!.baseMs}::float8 * power(2::float8, least(30, ${strikes})))`;
      // A 429 of a burst already counted cools as long as the one that counted (its strikes before it).
      const cooldown = r
        ? sql`now() + ${backoffMs(sql`(case when ${strikeCounts} then member_health.rate_limit_strikes else greatest(member_health.rate_limit_strikes - 1, 0) end)`)} * interval '1 millisecond'`
        : f.cooldown
          ? sql`now() + ${Math.round(f.cooldown.ms)} * interval '1 millisecond'`
          : sql`null::timestamptz`;
      // The first row of a member: no strikes before.
      const firstCooldown = r ? sql`now() + ${backoffMs(sql`0`)} * interval '1 millisecond'` : cooldown;
      const reason = r ? 'rate_limited' : (f.cooldown?.reason ?? null);
      const counts = c ? sql`(member_health.failure_counted_at is null or ${started} > member_health.failure_counted_at)` : sql`false`;
      const streak = sql`(member_health.consecutive_failures + 1)`;
      const opens = c ? sql`(${counts} and (${streak} >= ${c.threshold}::int or member_health.cooldown_reason = 'circuit_open'))` : sql`false`;
      // 2^(streak - threshold), the exponent capped so that the power stays a finite number.
      const openMs = c ? sql`least(${c.maxMs}::float8, ${c.baseMs}::float8 * power(2::float8, least(30, greatest(0, ${streak} - ${c.threshold}::int))))` : sql`0`;
      const circuitUntil = c ? sql`now() + ${openMs} * interval '1 millisecond'` : sql`null::timestamptz`;
      const { rows } = await sql<{ streak: number; counted: boolean; cooldownMs: number }>`
        insert into member_health as member_health (member_id, cooldown_until, cooldown_reason, rate_limit_strikes, rate_limit_counted_at, consecutive_failures, failure_counted_at,
          credentials_rejected_at, account_disabled_at, account_disabled_reason, last_error, last_error_at, failures, updated_at)
        select m.id, ${firstCooldown}, ${reason}, ${r ? 1 : 0}, ${r ? sql`now()` : sql`null::timestamptz`}, ${c ? 1 : 0}, ${c ? sql`now()` : sql`null::timestamptz`},
          ${f.rejectCredentials ? sql`now()` : null}::timestamptz, ${f.disableAccount ? sql`now()` : null}::timestamptz, ${f.disableAccount ?? null}, ${f.message}, now(), 1, now()
        ${memberOf(memberId, f.configVersion)}
        on conflict (member_id) do update set
          cooldown_until = case
            when ${opens} and (member_health.cooldown_until is null or member_health.cooldown_until < ${circuitUntil}) then ${circuitUntil}
            when ${cooldown} is not null and (member_health.cooldown_until is null or member_health.cooldown_until < ${cooldown}) then ${cooldown}
            else member_health.cooldown_until end,
          cooldown_reason = case
            when ${opens} and (member_health.cooldown_until is null or member_health.cooldown_until < ${circuitUntil}) then 'circuit_open'
            when ${cooldown} is not null and (member_health.cooldown_until is null or member_health.cooldown_until < ${cooldown}) then ${reason}
            else member_health.cooldown_reason end,
          probe_until = case when ${opens} then null else member_health.probe_until end,
          rate_limit_strikes = member_health.rate_limit_strikes + case when ${strikeCounts} then 1 else 0 end,
          rate_limit_counted_at = case when ${strikeCounts} then now() else member_health.rate_limit_counted_at end,
          consecutive_failures = case when ${counts} then ${streak} else member_health.consecutive_failures end,
          failure_counted_at = case when ${counts} then now() else member_health.failure_counted_at end,
          credentials_rejected_at = coalesce(member_health.credentials_rejected_at, ${f.rejectCredentials ? sql`now()` : null}),
          account_disabled_at = coalesce(member_health.account_disabled_at, ${f.disableAccount ? sql`now()` : null}),
          account_disabled_reason = coalesce(${f.disableAccount ?? null}, member_health.account_disabled_reason),
          last_error = excluded.last_error,
          last_error_at = now(),
          window_started_at = case when member_health.window_started_at < now() - ${WINDOW} then now() else member_health.window_started_at end,
          successes = case when member_health.window_started_at < now() - ${WINDOW} then 0 else member_health.successes end,
          failures = case when member_health.window_started_at < now() - ${WINDOW} then 1 else member_health.failures + 1 end,
          updated_at = now()
        returning consecutive_failures as streak, coalesce(failure_counted_at = now(), false) as counted,
          greatest(0, coalesce(extract(epoch from cooldown_until - now()) * 1000, 0))::float8 as cooldown_ms`.execute(db);
      const row = rows[0];
      return row
        ? { consecutiveFailures: row.streak, counted: row.counted, recorded: true, cooldownMs: Number(row.cooldownMs) }
        : { consecutiveFailures: 0, counted: false, recorded: false, cooldownMs: 0 };
    });
  }

  /**
   * Records successful calls, one statement for many members. The failure streak ends, unless the
   * member's circuit is open and stays so. A success closes an open circuit (cooldown, streak and
   * probe cleared, at once) when the last call counted started after the last counted failure was
   * recorded (as failures count): a call that was already running then proves nothing about the
   * member since.
   * Cooldowns of 429s and exhausted quotas are the upstream's word and stay (a poll answered does not
   * mean a submit would be). For the same reason the 429 backoff (rate_limit_strikes) ends only on
   * new work the member took, in a call that started after its last failure was recorded (the last
   * 429, or a later failure): polls of accepted jobs, and submits already in flight when the 429
   * came, prove nothing about whether the member takes work now.
   */
  async recordSuccesses(batch: ReadonlyMap<string, SuccessCount>): Promise<void> {
    if (batch.size === 0) return;
    const ids = [...batch.keys()];
    await this.withElapsed(async (db, msSince) => {
      const counts = ids.map((id) => batch.get(id)!.calls);
      const ago = ids.map((id) => msSince(batch.get(id)!.lastStartedAt));
      const newWorkAgo = ids.map((id) => {
        const started = batch.get(id)!.lastNewWorkStartedAt;
        return started === undefined ? null : msSince(started);
      });
      const closes = sql`(member_health.cooldown_reason = 'circuit_open'
        and (member_health.failure_counted_at is null or (select s.started from s where s.id = member_health.member_id) > member_health.failure_counted_at))`;
      const endsBackoff = sql`((select s.new_work_started from s where s.id = member_health.member_id)
        > coalesce(member_health.last_error_at, '-infinity'::timestamptz))`;
      await sql`
        with s as (
          select u.id, u.n, now() - u.ago * interval '1 millisecond' as started, now() - u.new_work_ago * interval '1 millisecond' as new_work_started
          from unnest(${ids}::text[], ${counts}::int[], ${ago}::float8[], ${newWorkAgo}::float8[]) as u(id, n, ago, new_work_ago)
        )
        insert into member_health as member_health (member_id, successes, last_success_at, updated_at)
        select s.id, s.n, now(), now() from s
        join group_members m on m.id = s.id
        on conflict (member_id) do update set
          consecutive_failures = case when member_health.cooldown_reason = 'circuit_open' and not ${closes} then member_health.consecutive_failures else 0 end,
          cooldown_until = case when ${closes} then null else member_health.cooldown_until end,
          cooldown_reason = case when ${closes} then null else member_health.cooldown_reason end,
          probe_until = case when ${closes} then null else member_health.probe_until end,
          rate_limit_strikes = case when ${endsBackoff} then 0 else member_health.rate_limit_strikes end,
          last_success_at = now(),
          window_started_at = case when member_health.window_started_at < now() - ${WINDOW} then now() else member_health.window_started_at end,
          successes = case when member_health.window_started_at < now() - ${WINDOW} then excluded.successes else member_health.successes + excluded.successes end,
          failures = case when member_health.window_started_at < now() - ${WINDOW} then 0 else member_health.failures end,
          updated_at = now()`.execute(db);
    });
  }

  /**
   * Claims the probe of a member whose circuit is open and whose cooldown is over, unless another
   * call (of any instance) holds it: the claim lasts `leaseMs` or until the probe's outcome is
   * recorded. Returns the claim; `taken` when the member has no probe to give now (held by another
   * call, or the cooldown not over by the database's clock); `not_open` when its circuit is closed
   * by now (the caller's view was behind).
   */
  async claimProbe(memberId: string, leaseMs: number): Promise<ProbeClaim | 'taken' | 'not_open'> {
    // Milliseconds only, so that the claim read back into a Date still identifies it (releaseProbe).
    // `open` is read from the statement's snapshot, before the claim: whether there was a circuit.
    const { rows } = await sql<{ until: Date | null; open: boolean }>`
      with claim as (
        update member_health set probe_until = date_trunc('milliseconds', now() + ${Math.round(leaseMs)} * interval '1 millisecond'), updated_at = now()
        where member_id = ${memberId} and cooldown_reason = 'circuit_open' and cooldown_until <= now() and (probe_until is null or probe_until <= now())
        returning probe_until
      )
      select (select probe_until from claim) as until,
        exists (select 1 from member_health where member_id = ${memberId} and cooldown_reason = 'circuit_open') as open`.execute(this.db);
    const { until, open } = rows[0]!;
    if (until) return { memberId, until };
    return open ? 'taken' : 'not_open';
  }

  /** Gives a probe back without an outcome (the call never reached the upstream, or ended for its own reasons). */
  async releaseProbe(claim: ProbeClaim): Promise<void> {
    await this.db.updateTable('memberHealth').set({ probeUntil: null, updatedAt: sql`now()` }).where('memberId', '=', claim.memberId).where('probeUntil', '=', claim.until).execute();
  }

  /**
   * Records that the member cannot serve `model` (the upstream said so): the pool leaves the member
   * out for that model until `untilMs` from now (null: until an operator changes the member). A
   * fault already recorded is replaced, so the latest reason shows. `configVersion`: only while the
   * member still has the configuration the call used. Returns whether it was recorded (false: the
   * member was changed since, or deleted).
   */
  async recordModelFault(
    memberId: string,
    model: string,
    fault: { kind: 'misconfigured' | 'model_not_open'; reason: string; untilMs: number | null; configVersion?: string },
  ): Promise<boolean> {
    const until = fault.untilMs === null ? sql`null::timestamptz` : sql`now() + ${Math.round(fault.untilMs)} * interval '1 millisecond'`;
    const { numAffectedRows } = await sql`
      insert into member_model_faults (member_id, model, kind, reason, until)
      select m.id, ${model}, ${fault.kind}, ${fault.reason}, ${until} ${memberOf(memberId, fault.configVersion)}
      on conflict (member_id, model) do update set kind = excluded.kind, reason = excluded.reason, until = excluded.until, created_at = now()`.execute(this.db);
    return (numAffectedRows ?? 0n) > 0n;
  }
}
