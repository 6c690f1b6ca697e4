/** All Kysely code for backend groups and their members. Returns rows or undefined. */
import { sql, type Kysely, type Selectable } from 'kysely';
import type { BackendGroups, DB, GroupMembers } from '../../generated/db.d.ts';

export type GroupRow = Selectable<BackendGroups> & { memberCount: number };
export type MemberRow = Omit<Selectable<GroupMembers>, 'credentialsCiphertext'> & { hasCredentials: boolean };

const GROUP_COLUMNS = ['g.id', 'g.name', 'g.description', 'g.createdAt', 'g.updatedAt'] as const;
const MEMBER_COLUMNS = [
  'id',
  'groupId',
  'name',
  'provider',
  'baseUrl',
  'enabled',
  'models',
  'priority',
  'weight',
  'concurrencyLimit',
  'createdAt',
  'updatedAt',
] as const;
// The ciphertext never leaves the repository: callers only learn whether there is one.
const hasCredentials = sql<boolean>`credentials_ciphertext is not null`.as('hasCredentials');

export interface MemberValues {
  name: string;
  provider: string;
  baseUrl: string | null;
  credentialsCiphertext: Buffer | null;
  enabled: boolean;
  models: string[];
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

  /** Inserts a member; undefined when the group already has a member of that name. */
  insertMember(values: MemberValues & { id: string; groupId: string }): Promise<MemberRow | undefined> {
    return this.db
      .insertInto('groupMembers')
      .values(values)
      .onConflict((oc) => oc.constraint('group_members_group_name_key').doNothing())
      .returning([...MEMBER_COLUMNS, hasCredentials])
      .executeTakeFirst();
  }

  findMember(groupId: string, memberId: string): Promise<MemberRow | undefined> {
    return this.db
      .selectFrom('groupMembers')
      .select([...MEMBER_COLUMNS, hasCredentials])
      .where('groupId', '=', groupId)
      .where('id', '=', memberId)
      .executeTakeFirst();
  }

  findMemberByName(groupId: string, name: string): Promise<MemberRow | undefined> {
    return this.db
      .selectFrom('groupMembers')
      .select([...MEMBER_COLUMNS, hasCredentials])
      .where('groupId', '=', groupId)
      .where('name', '=', name)
      .executeTakeFirst();
  }

  /** Every member, by descending priority, then name. */
  listMembers(groupId: string): Promise<MemberRow[]> {
    return this.db
      .selectFrom('groupMembers')
      .select([...MEMBER_COLUMNS, hasCredentials])
      .where('groupId', '=', groupId)
      .orderBy('priority', 'desc')
      .orderBy('name')
      .execute();
  }

  updateMember(groupId: string, memberId: string, patch: Partial<Omit<MemberValues, 'provider'>>): Promise<MemberRow | undefined> {
    return this.db
      .updateTable('groupMembers')
      .set(patch)
      .where('groupId', '=', groupId)
      .where('id', '=', memberId)
      .returning([...MEMBER_COLUMNS, hasCredentials])
      .executeTakeFirst();
  }
}
