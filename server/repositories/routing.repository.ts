/**
 * Which group members can serve a model (design §8), with what the pool needs to route among them
 * in one query: the encrypted credentials it decrypts, the model map and the member's shared health
 * (cooldown, open circuit and its probe, rejected credentials). Work in flight is counted under a
 * member's slot lock (lockSlots).
 *
 * In-flight work is counted from the task rows themselves (video tasks naming the member from
 * submit to a terminal state, one slot each; image tasks while their upstream calls run, with the
 * slots each took), so it holds across instances and a crashed process never leaks a slot.
 */
import { sql, type Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';

export interface MemberCandidate {
  id: string;
  name: string;
  provider: string;
  baseUrl: string | null;
  credentialsCiphertext: Buffer | null;
  priority: number;
  weight: number;
  concurrencyLimit: number | null;
  /** Catalog model id -> upstream model id. */
  modelMap: Record<string, string>;
  /** The version of this configuration (`MEMBER_CONFIG_VERSION`): health that blames it is fenced on it. */
  configVersion: string;
}

export interface RoutableMember extends MemberCandidate {
  /**
   * Milliseconds until the member may take work (0: now): its cooldown, and while its circuit is
   * open, a probe another call holds.
   */
  cooldownMs: number;
  /** Its circuit is open: once `cooldownMs` is over, the next call must claim the probe (MemberHealth.claimProbe). */
  circuitOpen: boolean;
}

/**
 * The configuration version of the member aliased `m` (a group_members row): its updated_at, which
 * the set_updated_at trigger moves on every change of the row (credentials included), as exact
 * microseconds since the epoch in text. Not a Date: it would drop the microseconds, and the version
 * could never be matched again.
 */
export const MEMBER_CONFIG_VERSION = sql<string>`(extract(epoch from m.updated_at) * 1000000)::bigint::text`;

/** A member's slots in use: the active task rows naming it (one per video task, `member_slots` per image task). */
export function inFlightOf(memberId: ReturnType<typeof sql.ref> | string) {
  const id = typeof memberId === 'string' ? sql`${memberId}` : memberId;
  return sql<number>`(
    (select count(*) from video_tasks v where v.member_id = ${id} and v.status in ('queued', 'in_progress'))
    + (select coalesce(sum(i.member_slots), 0) from image_tasks i where i.member_id = ${id} and i.status = 'processing'))::int`;
}

export class RoutingRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /**
   * Enabled members of the group that list the model and can run here (their provider is one of
   * `kinds`, and they have credentials unless their provider needs none), leaving out members
   * whose credentials the upstream rejected or whose account it disabled, and members with a fault
   * for this model. Highest
   * priority first.
   */
  async candidates(groupId: string, model: string, kinds: readonly string[], credentialFree: readonly string[]): Promise<RoutableMember[]> {
    const rows = await this.db
      .selectFrom('groupMembers as m')
      .leftJoin('memberHealth as h', 'h.memberId', 'm.id')
      .select([
        'm.id',
        'm.name',
        'm.provider',
        'm.baseUrl',
        'm.credentialsCiphertext',
        'm.priority',
        'm.weight',
        'm.concurrencyLimit',
        'm.modelMap',
        MEMBER_CONFIG_VERSION.as('configVersion'),
        // A probe's claim matters only while the circuit is open (greatest() skips a null).
        sql<number>`greatest(0, coalesce(ceil(extract(epoch from
          case when h.cooldown_reason = 'circuit_open' then greatest(h.cooldown_until, h.probe_until) else h.cooldown_until end - now()) * 1000), 0))::int`.as('cooldownMs'),
        sql<boolean>`coalesce(h.cooldown_reason = 'circuit_open', false)`.as('circuitOpen'),
      ])
      .where('m.groupId', '=', groupId)
      .where('m.enabled', '=', true)
      .where(sql<boolean>`${model} = any(m.models)`)
      .where('m.provider', 'in', kinds.length > 0 ? [...kinds] : [''])
      .where((eb) => eb.or([eb('m.provider', 'in', credentialFree.length > 0 ? [...credentialFree] : ['']), eb('m.credentialsCiphertext', 'is not', null)]))
      .where('h.credentialsRejectedAt', 'is', null)
      .where('h.accountDisabledAt', 'is', null)
      // Nor members the upstream told they cannot serve this model (member_model_faults).
      .where(({ not, exists, selectFrom }) =>
        not(
          exists(
            selectFrom('memberModelFaults as f')
              .select(sql`1`.as('one'))
              .whereRef('f.memberId', '=', 'm.id')
              .where('f.model', '=', model)
              .where((eb) => eb.or([eb('f.until', 'is', null), eb('f.until', '>', sql<Date>`now()`)])),
          ),
        ),
      )
      .orderBy('m.priority', 'desc')
      .orderBy('m.id')
      .execute();
    return rows.map((r) => ({ ...r, modelMap: r.modelMap as Record<string, string> }));
  }

  /** The aggregator mappings of a catalog model (catalog_models.upstream_mappings; `{}` when none or no model). */
  async upstreamMappings(modelId: string): Promise<Record<string, unknown>> {
    const row = await this.db.selectFrom('catalogModels').select('upstreamMappings').where('id', '=', modelId).executeTakeFirst();
    return (row?.upstreamMappings as Record<string, unknown> | undefined) ?? {};
  }

  find(id: string): Promise<MemberCandidate | undefined> {
    return this.db
      .selectFrom('groupMembers as m')
      .select(['m.id', 'm.name', 'm.provider', 'm.baseUrl', 'm.credentialsCiphertext', 'm.priority', 'm.weight', 'm.concurrencyLimit', 'm.modelMap', MEMBER_CONFIG_VERSION.as('configVersion')])
      .where('m.id', '=', id)
      .executeTakeFirst() as Promise<MemberCandidate | undefined>;
  }

  /**
   * Inside a transaction: serializes slot takers of one member (an advisory lock, so admin edits
   * and foreign keys are not blocked) and returns its slots in use as now committed. Lock order:
   * member slot, then the task row.
   */
  async lockSlots(trx: Executor, memberId: string): Promise<number> {
    await sql`select pg_advisory_xact_lock(hashtextextended(${`member-slots:${memberId}`}, 0))`.execute(trx);
    const { rows } = await sql<{ n: number }>`select ${inFlightOf(memberId)} as n`.execute(trx);
    return rows[0]!.n;
  }
}
