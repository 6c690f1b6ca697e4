/** All Kysely code for backend groups and their members. Returns rows or undefined. */
import { sql, type Kysely, type Selectable } from 'kysely';
import type { BackendGroups, DB, GroupMembers } from '../../generated/db.d.ts';
import { inFlightOf } from './routing.repository.ts';

export type GroupRow = Selectable<BackendGroups> & { memberCount: number };
/** A model the pool leaves a member out for (member_model_faults); times as PostgreSQL's JSON writes them. */
export interface ModelFault {
  model: string;
  kind: 'misconfigured' | 'model_not_open';
  reason: string;
  since: string;
  until: string | null;
}
export interface MemberHealthView {
  inFlight: number;
  cooldownUntil: Date | null;
  cooldownReason: string | null;
  credentialsRejectedAt: Date | null;
  accountDisabledAt: Date | null;
  accountDisabledReason: string | null;
  lastError: string | null;
  lastErrorAt: Date | null;
  lastSuccessAt: Date | null;
  windowStartedAt: Date | null;
  successes: number | null;
  failures: number | null;
  modelFaults: ModelFault[];
}
export type MemberRow = Omit<Selectable<GroupMembers>, 'credentialsCiphertext' | 'modelMap'> & { hasCredentials: boolean; modelMap: Record<string, string>; health: MemberHealthView };

const GROUP_COLUMNS = ['g.id', 'g.name', 'g.description', 'g.createdAt', 'g.updatedAt'] as const;
const MEMBER_COLUMNS = [
  'id',
  'groupId',
  'name',
  'provider',
  'baseUrl',
  'enabled',
  'models',
  'modelMap',
  'priority',
  'weight',
  'concurrencyLimit',
  'createdAt',
  'updatedAt',
] as const;
// The ciphertext never leaves the repository: callers only learn whether there is one.

export interface MemberValues {
  name: string;
  provider: string;
  baseUrl: string | null;
  credentialsCiphertext: Buffer | null;
  enabled: boolean;
  models: string[];
  modelMap: Record<string, string>;
  priority: number;
  weight: number;
  concurrencyLimit: number | null;
}

export class GroupRepository {
  constructor(private readonly db: Kysely<DB>) {}

  private selectGroups() {
    return this.db
      .selectFrom('backendGroups as g')
      .select(GROUP_COLUMNS)
      .select((eb) =>
        eb
          .selectFrom('groupMembers as m')
          .select(sql<number>`count(*)::int`.as('n'))
          .whereRef('m.groupId', '=', 'g.id')
          .as('memberCount'),
      )
      .$narrowType<{ memberCount: number }>();
  }

  /** Inserts a group; undefined when the name is taken. */
  async insert(values: { id: string; name: string; description: string | null }): Promise<GroupRow | undefined> {
    const row = await this.db
      .insertInto('backendGroups')
      .values(values)
      .onConflict((oc) => oc.constraint('backend_groups_name_key').doNothing())
      .returning(['id', 'name', 'description', 'createdAt', 'updatedAt'])
      .executeTakeFirst();
    return row && { ...row, memberCount: 0 };
  }

  findById(id: string): Promise<GroupRow | undefined> {
    return this.selectGroups().where('g.id', '=', id).executeTakeFirst();
  }

  findByName(name: string): Promise<GroupRow | undefined> {
    return this.selectGroups().where('g.name', '=', name).executeTakeFirst();
  }

  /** In name order after `afterName`; `limit + 1` rows tell whether another page follows. */
  list(opts: { limit: number; afterName?: string }): Promise<GroupRow[]> {
    let query = this.selectGroups().orderBy('g.name').limit(opts.limit);
    if (opts.afterName !== undefined) query = query.where('g.name', '>', opts.afterName);
    return query.execute();
  }

  async update(id: string, patch: { name?: string; description?: string | null }): Promise<GroupRow | undefined> {
    const row = await this.db.updateTable('backendGroups').set(patch).where('id', '=', id).returning('id').executeTakeFirst();
    return row && this.findById(row.id);
  }

  /** Members with their health (member_health and the work in flight on them), one query. */
  private selectMembers() {
    return this.db
      .selectFrom('groupMembers as m')
      .leftJoin('memberHealth as h', 'h.memberId', 'm.id')
      .select(MEMBER_COLUMNS.map((c) => `m.${c}` as const))
      .select([
        sql<boolean>`m.credentials_ciphertext is not null`.as('hasCredentials'),
        sql<number>`${inFlightOf(sql.ref('m.id'))}`.as('inFlight'),
        'h.cooldownUntil',
        'h.cooldownReason',
        'h.credentialsRejectedAt',
        'h.accountDisabledAt',
        'h.accountDisabledReason',
        'h.lastError',
        'h.lastErrorAt',
        'h.lastSuccessAt',
        'h.windowStartedAt',
        'h.successes',
        'h.failures',
        // Models the pool leaves the member out for (member_model_faults), newest reason each.
        sql<ModelFault[]>`coalesce((
          select json_agg(json_build_object('model', f.model, 'kind', f.kind, 'reason', f.reason, 'since', f.created_at, 'until', f.until) order by f.model)
          from member_model_faults f where f.member_id = m.id and (f.until is null or f.until > now())), '[]'::json)`.as('modelFaults'),
      ]);
  }

  private toMemberRow(r: Awaited<ReturnType<ReturnType<GroupRepository['selectMembers']>['executeTakeFirstOrThrow']>>): MemberRow {
    const { inFlight, cooldownUntil, cooldownReason, credentialsRejectedAt, accountDisabledAt, accountDisabledReason, lastError, lastErrorAt, lastSuccessAt, windowStartedAt, successes, failures, modelFaults, ...member } = r;
    return {
      ...member,
      modelMap: member.modelMap as Record<string, string>,
      health: { inFlight, cooldownUntil, cooldownReason, credentialsRejectedAt, accountDisabledAt, accountDisabledReason, lastError, lastErrorAt, lastSuccessAt, windowStartedAt, successes, failures, modelFaults },
    };
  }

  /** Inserts a member; undefined when the group already has a member of that name. */
  async insertMember(values: MemberValues & { id: string; groupId: string }): Promise<MemberRow | undefined> {
    const row = await this.db
      .insertInto('groupMembers')
      .values({ ...values, modelMap: JSON.stringify(values.modelMap) })
      .onConflict((oc) => oc.constraint('group_members_group_name_key').doNothing())
      .returning('id')
      .executeTakeFirst();
    return row && this.findMember(values.groupId, row.id);
  }

  async findMember(groupId: string, memberId: string): Promise<MemberRow | undefined> {
    const row = await this.selectMembers().where('m.groupId', '=', groupId).where('m.id', '=', memberId).executeTakeFirst();
    return row && this.toMemberRow(row);
  }

  async findMemberByName(groupId: string, name: string): Promise<MemberRow | undefined> {
    const row = await this.selectMembers().where('m.groupId', '=', groupId).where('m.name', '=', name).executeTakeFirst();
    return row && this.toMemberRow(row);
  }

  /** Every member, by descending priority, then name. */
  async listMembers(groupId: string): Promise<MemberRow[]> {
    const rows = await this.selectMembers().where('m.groupId', '=', groupId).orderBy('m.priority', 'desc').orderBy('m.name').execute();
    return rows.map((r) => this.toMemberRow(r));
  }

  /**
   * Deletes a disabled member of the group unless tasks that have not finished run on it (their jobs
   * are collected with its credentials), in one statement. Disabled first, no new work is routed to
   * it (every instance's candidates drop it at the change's NOTIFY, or within their cache's few
   * seconds), so no task takes it while it is deleted. Its health and model faults go with it
   * (foreign keys); tasks keep its id. `undefined`: no such member.
   */
  async deleteMember(groupId: string, memberId: string): Promise<{ deleted: boolean; enabled: boolean; running: number } | undefined> {
    const { rows } = await sql<{ found: number; enabled: boolean; running: number; deleted: number }>`
      with target as (select id, enabled from group_members where group_id = ${groupId} and id = ${memberId}),
      running as (
        select (select count(*) from video_tasks where member_id = ${memberId} and status in ('queued', 'in_progress'))
          + (select count(*) from image_tasks where member_id = ${memberId} and status in ('processing', 'needs_attention')) as n),
      gone as (
        delete from group_members m using running, target
        where m.id = target.id and not target.enabled and running.n = 0 returning m.id)
      select (select count(*) from target)::int as found, coalesce((select enabled from target), false) as enabled,
        (select n from running)::int as running, (select count(*) from gone)::int as deleted`.execute(this.db);
    const row = rows[0]!;
    return row.found === 0 ? undefined : { deleted: row.deleted > 0, enabled: row.enabled, running: row.running };
  }

  /**
   * Changes a member. Whatever the pool had learned that keeps it from new work (a cooldown, an
   * open circuit, refused credentials, a disabled account, models it could not serve) is forgotten:
   * the operator acted.
   */
  async updateMember(groupId: string, memberId: string, patch: Partial<Omit<MemberValues, 'provider'>>): Promise<MemberRow | undefined> {
    const { modelMap, ...rest } = patch;
    const row = await this.db
      .updateTable('groupMembers')
      .set({ ...rest, ...(modelMap !== undefined && { modelMap: JSON.stringify(modelMap) }) })
      .where('groupId', '=', groupId)
      .where('id', '=', memberId)
      .returning('id')
      .executeTakeFirst();
    if (!row) return undefined;
    await this.db
      .updateTable('memberHealth')
      .set({ credentialsRejectedAt: null, accountDisabledAt: null, accountDisabledReason: null, cooldownUntil: null, cooldownReason: null, probeUntil: null, consecutiveFailures: 0, rateLimitStrikes: 0, updatedAt: sql`now()` })
      .where('memberId', '=', memberId)
      .execute();
    await this.db.deleteFrom('memberModelFaults').where('memberId', '=', memberId).execute();
    return this.findMember(groupId, memberId);
  }
}
