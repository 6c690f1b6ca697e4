// `groups create|list|get|update`: groups are addressed by id or by name.
import { defined, nullable, optInt, required } from './args.ts';
import type { Commands } from './command.ts';
import { checkBody } from './contract.ts';
import { one, page } from './output.ts';

const GROUP_COLUMNS = ['id', 'name', 'member_count', 'description'];

export const groupCommands: Commands = {
  create: async ({ admin, flags }) =>
    one(await admin.groups.create(checkBody('AdminGroupCreate', defined({ name: required(flags.name, 'name'), description: flags.description })))),

  list: async ({ admin, flags }) => page(await admin.groups.list({ limit: optInt(flags.limit, 'limit'), cursor: flags.cursor }), GROUP_COLUMNS),

  get: async ({ admin, target }) => one(await admin.groups.resolve(target())),

  // `--description none` clears the description.
  update: async ({ admin, flags, target, groupId }) =>
    one(await admin.groups.update(await groupId(target()), checkBody('AdminGroupUpdate', defined({ name: flags.name, description: nullable(flags.description, (v) => v) })))),
};
