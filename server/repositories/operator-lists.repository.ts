/**
 * The operator's listings across every account (GET /admin/v1/tasks, /ledger, /webhook-deliveries):
 * keyset pages, newest first, one statement a page. A page continues strictly after the previous
 * page's last row (its position is in the cursor), so rows inserted meanwhile never shift the pages:
 * nothing is listed twice or skipped. The indexes are in the operator-views migration.
 *
 * Tasks are image and video tasks together: each table gives its own newest `limit` rows after the
 * position (on its (created_at, id) index, or the account's, the key's, the member's, the
 * unfinished rows'), and the union is cut to `limit` again (a provider filter first reads the
 * provider's member ids). Filters are plain SQL conditions on the column (never on an
 * expression of it), so the indexes apply.
 */
import { sql, type Kysely, type RawBuilder } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { createdAtMicros, microsToTimestamp, type CreatedAtPosition } from './account.repository.ts';

export type TaskKind = 'image' | 'video';
const VIDEO_STATUSES = ['queued', 'in_progress', 'completed', 'failed'] as const;
const IMAGE_STATUSES = ['processing', 'needs_attention', 'completed', 'failed'] as const;

/** Time bounds as the API shows times (RFC 3339 text, milliseconds; see account-pages.ts). */
export interface CreatedRange {
  createdAfter?: string;
  createdBefore?: string;
}

export interface TaskFilter extends CreatedRange {
  kind?: TaskKind;
  statuses?: readonly string[];
  accountId?: string;
  apiKeyId?: string;
  model?: string;
  memberId?: string;
  provider?: string;
}

/** A task as listings show it: its row's common columns, its member's provider and its hold. */
export interface TaskSummaryRow {
  id: string;
  kind: TaskKind;
  status: string;
  accountId: string;
  apiKeyId: string;
  model: string;
  memberId: string | null;
  provider: string | null;
  attempt: number;
  upstreamJobId: string | null;
  errorCode: string | null;
  errorMessage: string | null;
  lastError: string | null;
  lastErrorAt: Date | null;
  createdAt: Date;
  updatedAt: Date;
  completedAt: Date | null;
  createdAtMicros: number;
  holdAmount: number | null;
  holdStatus: string | null;
  holdCaptured: number | null;
}

export interface LedgerFilter extends CreatedRange {
  accountId?: string;
  apiKeyId?: string;
  taskId?: string;
  kinds?: readonly string[];
}

export interface LedgerRow {
  id: number;
  kind: string;
  amount: number;
  accountId: string;
  apiKeyId: string | null;
  taskId: string | null;
  holdId: string | null;
  reason: string | null;
  createdAt: Date;
}

export interface WebhookFilter extends CreatedRange {
  statuses?: readonly string[];
  accountId?: string;
}

/** Millisecond bounds on the parameter side, the column bare (for the index); as account-pages.ts. */
function rangeConditions(column: RawBuilder<unknown>, range: CreatedRange): RawBuilder<unknown>[] {
  const out: RawBuilder<unknown>[] = [];
  if (range.createdAfter !== undefined) out.push(sql`${column} >= date_trunc('milliseconds', ${range.createdAfter}::timestamptz) + interval '1 millisecond'`);
  if (range.createdBefore !== undefined) out.push(sql`${column} < date_trunc('milliseconds', ${range.createdBefore}::timestamptz + interval '999 microseconds')`);
  return out;
}

const and = (conditions: RawBuilder<unknown>[]) => (conditions.length === 0 ? sql`true` : sql.join(conditions, sql` and `));
/** Literals, not parameters: the planner proves a partial index's predicate only from constants (the values are the contract's enums). */
const literals = (values: readonly string[]) => sql.join(values.map((v) => sql.lit(v)));

export class OperatorListsRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /** Up to `limit` tasks of both kinds after `after` (newest first). */
  async tasks(filter: TaskFilter, limit: number, after: CreatedAtPosition | undefined): Promise<TaskSummaryRow[]> {
    // The provider's members (a kind no member has lists nothing).
    const members = filter.provider === undefined ? undefined : await this.membersOf(filter.provider);
    if (members !== undefined && members.length === 0) return [];
    const parts: RawBuilder<unknown>[] = [];
    for (const kind of ['video', 'image'] as const) {
      if (filter.kind !== undefined && filter.kind !== kind) continue;
      const own = kind === 'video' ? VIDEO_STATUSES : IMAGE_STATUSES;
      const statuses = filter.statuses?.filter((s) => (own as readonly string[]).includes(s));
      if (statuses !== undefined && statuses.length === 0) continue;
      parts.push(this.taskPart(kind, filter, statuses, limit, after, members));
    }
    if (parts.length === 0) return [];
    const { rows } = await sql<TaskSummaryRow>`
      select p.*, ${createdAtMicros('p.created_at')} as created_at_micros, m.provider,
             h.amount as hold_amount, h.status as hold_status, h.captured as hold_captured
      from (${sql.join(parts, sql` union all `)}) p
      left join group_members m on m.id = p.member_id
      left join credit_holds h on h.task_id = p.id
      order by p.created_at desc, p.id desc
      limit ${limit}`.execute(this.db);
    return rows;
  }

  private taskPart(kind: TaskKind, filter: TaskFilter, statuses: readonly string[] | undefined, limit: number, after: CreatedAtPosition | undefined, members: readonly string[] | undefined): RawBuilder<unknown> {
    const table = sql.table(kind === 'video' ? 'video_tasks' : 'image_tasks');
    const c = (name: string) => sql.ref(`t.${name}`);
    const conditions: RawBuilder<unknown>[] = rangeConditions(c('created_at'), filter);
    if (statuses !== undefined) conditions.push(sql`t.status in (${literals(statuses)})`);
    if (filter.accountId !== undefined) conditions.push(sql`t.account_id = ${filter.accountId}`);
    if (filter.apiKeyId !== undefined) conditions.push(sql`t.api_key_id = ${filter.apiKeyId}`);
    if (filter.model !== undefined) conditions.push(sql`t.model = ${filter.model}`);
    if (filter.memberId !== undefined) conditions.push(sql`t.member_id = ${filter.memberId}`);
    if (after) conditions.push(sql`(t.created_at, t.id) < (${microsToTimestamp(after.createdAtMicros)}, ${after.id})`);
    const jobId = kind === 'video' ? sql`t.upstream_job_id` : sql`null::text`;
    const columns = sql`t.id, ${sql.lit(kind)}::text as kind, t.status, t.account_id, t.api_key_id, t.model, t.member_id, t.attempt, ${jobId} as upstream_job_id,
        t.error_code, t.error_message, t.last_error, t.last_error_at, t.created_at, t.updated_at, t.completed_at`;
    const page = (where: RawBuilder<unknown>[]) => sql`(select ${columns} from ${table} t where ${and(where)} order by t.created_at desc, t.id desc limit ${limit})`;
    if (members === undefined) return page(conditions);
    // A provider is a few members: each one's newest rows on the (member_id, created_at, id) index,
    // merged. Named one by one (not joined), so that the planner sees each member's own share of
    // the rows and takes that index for a member that ran none of them (a join's generic estimate
    // would walk every task of the table in creation order instead).
    return sql`(select * from (${sql.join(members.map((m) => page([...conditions, sql`t.member_id = ${m}`])), sql` union all `)}) m
      order by m.created_at desc, m.id desc limit ${limit})`;
  }

  /** Up to `limit` ledger entries with ids below `beforeId` (newest first). */
  async ledger(filter: LedgerFilter, limit: number, beforeId: number | undefined): Promise<LedgerRow[]> {
    const conditions: RawBuilder<unknown>[] = rangeConditions(sql.ref('l.created_at'), filter);
    if (filter.accountId !== undefined) conditions.push(sql`l.account_id = ${filter.accountId}`);
    if (filter.apiKeyId !== undefined) conditions.push(sql`l.api_key_id = ${filter.apiKeyId}`);
    if (filter.taskId !== undefined) conditions.push(sql`l.task_id = ${filter.taskId}`);
    if (filter.kinds !== undefined) conditions.push(sql`l.kind in (${literals(filter.kinds)})`);
    if (beforeId !== undefined) conditions.push(sql`l.id < ${beforeId}`);
    const { rows } = await sql<LedgerRow>`
      select l.id, l.kind, l.amount, l.account_id, l.api_key_id, l.task_id, l.hold_id, l.reason, l.created_at
      from ledger_entries l where ${and(conditions)}
      order by l.id desc limit ${limit}`.execute(this.db);
    return rows;
  }

  /** Up to `limit` webhook deliveries after `after` (newest first). */
  async webhookDeliveries(filter: WebhookFilter, limit: number, after: CreatedAtPosition | undefined) {
    const conditions: RawBuilder<unknown>[] = rangeConditions(sql.ref('d.created_at'), filter);
    if (filter.statuses !== undefined) conditions.push(sql`d.status in (${literals(filter.statuses)})`);
    if (filter.accountId !== undefined) conditions.push(sql`d.account_id = ${filter.accountId}`);
    if (after) conditions.push(sql`(d.created_at, d.id) < (${microsToTimestamp(after.createdAtMicros)}, ${after.id})`);
    return this.db
      .selectFrom('webhookDeliveries as d')
      .selectAll('d')
      .select(createdAtMicros('d.created_at').as('createdAtMicros'))
      .where(sql<boolean>`${and(conditions)}`)
      .orderBy('d.createdAt', 'desc')
      .orderBy('d.id', 'desc')
      .limit(limit)
      .execute();
  }

  /** The attempts of several deliveries at once, oldest first. */
  webhookAttempts(deliveryIds: readonly string[]) {
    if (deliveryIds.length === 0) return Promise.resolve([]);
    return this.db.selectFrom('webhookAttempts').selectAll().where('deliveryId', 'in', deliveryIds).orderBy('id').execute();
  }

  /** A task's ledger entries, oldest first. */
  ledgerOfTask(taskId: string): Promise<LedgerRow[]> {
    return this.db
      .selectFrom('ledgerEntries')
      .select(['id', 'kind', 'amount', 'accountId', 'apiKeyId', 'taskId', 'holdId', 'reason', 'createdAt'])
      .where('taskId', '=', taskId)
      .orderBy('id')
      .execute();
  }

  /** A task's hold, whole. */
  holdOfTask(taskId: string) {
    return this.db.selectFrom('creditHolds').selectAll().where('taskId', '=', taskId).executeTakeFirst();
  }

  /** The ids of the members of a provider kind. */
  private async membersOf(provider: string): Promise<string[]> {
    const rows = await this.db.selectFrom('groupMembers').select('id').where('provider', '=', provider).orderBy('id').execute();
    return rows.map((r) => r.id);
  }

  /** The provider kind of a member (undefined once it was deleted). */
  async providerOf(memberId: string): Promise<string | undefined> {
    const row = await this.db.selectFrom('groupMembers').select('provider').where('id', '=', memberId).executeTakeFirst();
    return row?.provider;
  }
}
