// `members add|list|update|delete`: the upstream accounts of a group; credentials are stored encrypted
// and never printed (the API objects only say has_credentials).
import { ApiError } from '../../server/errors.ts';
import { PROVIDER_KINDS } from '../../server/providers/provider-kinds.ts';
import { bool, credentials, defined, int, list, modelMap, nullable, oneOf, optInt, required, UsageError } from './args.ts';
import type { AdminServices } from '../../server/services/admin/index.ts';
import type { Commands } from './command.ts';
import { checkBody } from './contract.ts';
import { one, table, type Row } from './output.ts';

const MEMBER_COLUMNS = ['id', 'name', 'provider', 'enabled', 'priority', 'weight', 'concurrency_limit', 'in_flight', 'state', 'ok/fail', 'last_error', 'models'];

type Member = Awaited<ReturnType<import('../../server/services/admin/group-admin.service.ts').GroupAdminService['listMembers']>>['data'][number];

/** A member as a table row: its configuration and, flattened, its health. */
function memberRow(m: Member): Row {
  const h = m.health;
  const cooling = h.cooldown_until ? `${h.cooldown_reason} until ${h.cooldown_until}` : h.circuit === 'half_open' ? 'circuit half-open (one probe at a time)' : undefined;
  const state = h.credentials_rejected ? 'credentials rejected' : (cooling ?? (m.enabled ? 'ok' : 'disabled'));
  const models = m.models.map((id) => (m.model_map[id] ? `${id}=${m.model_map[id]}` : id)).join(',');
  return { ...m, in_flight: h.in_flight, state, 'ok/fail': `${h.recent.successes}/${h.recent.failures}`, last_error: h.last_error, models } as unknown as Row;
}

export const memberCommands: Commands = {
  add: async ({ admin, flags, groupId }) => {
    const group = await groupId(required(flags.group, 'group'));
    const member = await admin.groups.createMember(
      group,
      checkBody(
        'AdminGroupMemberCreate',
        defined({
          name: required(flags.name, 'name'),
          provider: oneOf(required(flags.provider, 'provider'), 'provider', PROVIDER_KINDS)!,
          models: list(required(flags.models, 'models'))!,
          model_map: modelMap(flags['model-map']),
          credentials: credentials(flags.credential),
          base_url: flags['base-url'],
          priority: optInt(flags.priority, 'priority'),
          weight: optInt(flags.weight, 'weight'),
          concurrency_limit: nullable(flags['concurrency-limit'], (v) => int(v, 'concurrency-limit')),
          enabled: bool(flags.enabled, 'enabled'),
        }),
      ),
    );
    return one(member);
  },

  list: async ({ admin, flags, groupId }) => {
    const members = await admin.groups.listMembers(await groupId(required(flags.group, 'group')));
    return { json: members, text: table(members.data.map(memberRow), MEMBER_COLUMNS) };
  },

  // Members are addressed by id or name within their group, hence the required --group.
  update: async ({ admin, flags, target, groupId }) => {
    if (flags.provider !== undefined) throw new UsageError('the provider of a member cannot change; add a new member instead');
    const group = await groupId(required(flags.group, 'group'));
    const member = await memberOf(admin, group, target());
    return one(
      await admin.groups.updateMember(
        group,
        member.id,
        checkBody(
          'AdminGroupMemberUpdate',
          defined({
            name: flags.name,
            models: list(flags.models),
            model_map: modelMap(flags['model-map']),
            credentials: credentials(flags.credential),
            base_url: nullable(flags['base-url'], (v) => v),
            priority: optInt(flags.priority, 'priority'),
            weight: optInt(flags.weight, 'weight'),
            concurrency_limit: nullable(flags['concurrency-limit'], (v) => int(v, 'concurrency-limit')),
            enabled: bool(flags.enabled, 'enabled'),
          }),
        ),
      ),
    );
  },

  delete: async ({ admin, flags, target, groupId }) => {
    const group = await groupId(required(flags.group, 'group'));
    const member = await memberOf(admin, group, target());
    await admin.groups.deleteMember(group, member.id);
    const deleted = { id: member.id, name: member.name, deleted: true };
    return { json: deleted, text: `deleted member ${member.name} (${member.id})` };
  },
};

/** The group's member with this id, else with this name. */
async function memberOf(admin: AdminServices, group: string, ref: string): Promise<Member> {
  const members = (await admin.groups.listMembers(group)).data;
  const member = members.find((m) => m.id === ref) ?? members.find((m) => m.name === ref);
  if (!member) throw new ApiError(404, 'member_not_found', `The group has no member with the id or name '${ref}'.`);
  return member;
}
