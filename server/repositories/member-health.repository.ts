/**
 * What the pool learned about each member from its answers (table member_health), shared by every
 * instance. Each write is one upsert computed in SQL, so concurrent instances never lose an update;
 * the policy (how long a cooldown lasts) is decided by the caller, `pool/member-health.ts`.
 */
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';

export type CooldownReason = 'rate_limited' | 'quota_exhausted' | 'circuit_open';

export interface MemberHealthRow {
  memberId: string;
  cooldownUntil: Date | null;
  cooldownReason: string | null;
  consecutiveFailures: number;
  credentialsRejectedAt: Date | null;
  lastError: string | null;
  lastErrorAt: Date | null;
  lastSuccessAt: Date | null;
  windowStartedAt: Date;
  successes: number;
  failures: number;
}

/** Recent counts restart after this long. */
const WINDOW = sql`interval '1 hour'`;

export class MemberHealthRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /**
   * Records a failed call. `cooldown` (when set) puts the member aside for `ms` (keeping a longer
   * cooldown already in place); `circuit` gives the failure count from which repeated failures open
   * the circuit for `ms`; `rejectCredentials` takes the member out until an admin changes it.
   * Returns the member's consecutive failures and rate-limit strikes after this one.
   */
  async recordFailure(
    memberId: string,
    f: { message: string; rateLimited?: boolean; cooldown?: { ms: number; reason: CooldownReason }; circuit?: { threshold: number; ms: number }; rejectCredentials?: boolean },
  ): Promise<void> {
    const cooldown = f.cooldown ? sql`now() + ${Math.round(f.cooldown.ms)} * interval '1 millisecond'` : sql`null::timestamptz`;
    const circuitOpens = f.circuit ? sql`member_health.consecutive_failures + 1 >= ${f.circuit.threshold}` : sql`false`;
    const circuitUntil = f.circuit ? sql`now() + ${Math.round(f.circuit.ms)} * interval '1 millisecond'` : sql`null::timestamptz`;
    await sql`
      insert into member_health as member_health (member_id, cooldown_until, cooldown_reason, rate_limit_strikes, consecutive_failures,
        credentials_rejected_at, last_error, last_error_at, failures, updated_at)
      values (${memberId}, ${cooldown}, ${f.cooldown?.reason ?? null}, ${f.rateLimited ? 1 : 0}, ${f.circuit ? 1 : 0},
        ${f.rejectCredentials ? sql`now()` : null}, ${f.message}, now(), 1, now())
      on conflict (member_id) do update set
        cooldown_until = case
          when ${circuitOpens} and (member_health.cooldown_until is null or member_health.cooldown_until < ${circuitUntil}) then ${circuitUntil}
          when ${cooldown} is not null and (member_health.cooldown_until is null or member_health.cooldown_until < ${cooldown}) then ${cooldown}
          else member_health.cooldown_until end,
        cooldown_reason = case
          when ${circuitOpens} and (member_health.cooldown_until is null or member_health.cooldown_until < ${circuitUntil}) then 'circuit_open'
          when ${cooldown} is not null and (member_health.cooldown_until is null or member_health.cooldown_until < ${cooldown}) then ${f.cooldown?.reason ?? null}
          else member_health.cooldown_reason end,
        rate_limit_strikes = member_health.rate_limit_strikes + ${f.rateLimited ? 1 : 0},
        consecutive_failures = case when ${f.circuit ? sql`true` : sql`false`} then member_health.consecutive_failures + 1 else member_health.consecutive_failures end,
        credentials_rejected_at = coalesce(member_health.credentials_rejected_at, ${f.rejectCredentials ? sql`now()` : null}),
        last_error = excluded.last_error,
        last_error_at = now(),
        window_started_at = case when member_health.window_started_at < now() - ${WINDOW} then now() else member_health.window_started_at end,
        successes = case when member_health.window_started_at < now() - ${WINDOW} then 0 else member_health.successes end,
        failures = case when member_health.window_started_at < now() - ${WINDOW} then 1 else member_health.failures + 1 end,
        updated_at = now()`.execute(this.db);
  }

  /** A member's rate-limit strikes and consecutive failures so far (for the backoff of the next one). */
  async strikes(memberId: string): Promise<{ rateLimitStrikes: number; consecutiveFailures: number }> {
    const row = await this.db.selectFrom('memberHealth').select(['rateLimitStrikes', 'consecutiveFailures']).where('memberId', '=', memberId).executeTakeFirst();
    return row ?? { rateLimitStrikes: 0, consecutiveFailures: 0 };
  }

  /** Records `count` successful calls: the failure streaks end. One statement for many members. */
  async recordSuccesses(batch: ReadonlyMap<string, number>): Promise<void> {
    if (batch.size === 0) return;
    const ids = [...batch.keys()];
    const counts = ids.map((id) => batch.get(id)!);
    await sql`
      insert into member_health as member_health (member_id, successes, last_success_at, updated_at)
      select s.id, s.n, now(), now() from unnest(${ids}::text[], ${counts}::int[]) as s(id, n)
      join group_members m on m.id = s.id
      on conflict (member_id) do update set
        consecutive_failures = 0,
        rate_limit_strikes = 0,
        last_success_at = now(),
        window_started_at = case when member_health.window_started_at < now() - ${WINDOW} then now() else member_health.window_started_at end,
        successes = case when member_health.window_started_at < now() - ${WINDOW} then excluded.successes else member_health.successes + excluded.successes end,
        failures = case when member_health.window_started_at < now() - ${WINDOW} then 0 else member_health.failures end,
        updated_at = now()`.execute(this.db);
  }

  /** An admin changed the member: whatever made the pool put it aside is forgotten. */
  async reset(memberId: string): Promise<void> {
    await this.db
      .updateTable('memberHealth')
      .set({ credentialsRejectedAt: null, cooldownUntil: null, cooldownReason: null, consecutiveFailures: 0, rateLimitStrikes: 0, updatedAt: sql`now()` })
      .where('memberId', '=', memberId)
      .execute();
  }
}
