// `keys create|list|get|update`: the full key is printed once, by `create`, and never again.
import { bool, defined, limitSetting, nullable, num, optInt, required } from './args.ts';
import type { Commands } from './command.ts';
import { checkBody } from './contract.ts';
import { lines, one, page } from './output.ts';

const KEY_COLUMNS = ['id', 'account_id', 'group_id', 'name', 'key_prefix', 'last_four', 'is_active', 'credit_limit', 'credits_used', 'requests_per_minute', 'max_in_flight', 'last_used_at'];

export const keyCommands: Commands = {
  create: async ({ admin, flags, accountId, groupId }) => {
    const created = await admin.apiKeys.create(
      checkBody(
        'AdminApiKeyCreate',
        defined({
          account_id: await accountId(required(flags.account, 'account')),
          name: required(flags.name, 'name'),
          credit_limit: nullable(flags['credit-limit'], (v) => num(v, 'credit-limit')),
          group_id: flags.group === undefined ? undefined : await groupId(flags.group),
          requests_per_minute: limitSetting(flags.rpm, 'rpm'),
          max_in_flight: limitSetting(flags['max-in-flight'], 'max-in-flight'),
        }),
      ),
    );
    const { key, ...shown } = created;
    return { json: created, text: `${lines(shown)}\n\nkey  ${key}\n\nStore this key now: it is shown only once and cannot be retrieved again.` };
  },

  list: async ({ admin, flags, accountId }) =>
    page(
      await admin.apiKeys.list({
        limit: optInt(flags.limit, 'limit'),
        cursor: flags.cursor,
        accountId: flags.account === undefined ? undefined : await accountId(flags.account),
      }),
      KEY_COLUMNS,
    ),

  get: async ({ admin, target }) => one(await admin.apiKeys.get(target())),

  update: async ({ admin, flags, target, groupId }) =>
    one(
      await admin.apiKeys.update(
        target(),
        checkBody(
          'AdminApiKeyUpdate',
          defined({
            name: flags.name,
            credit_limit: nullable(flags['credit-limit'], (v) => num(v, 'credit-limit')),
            group_id: flags.group === undefined ? undefined : await groupId(flags.group),
            is_active: bool(flags.active, 'active'),
            // N, none (no limit) or default (DEFAULT_KEY_RPM / DEFAULT_KEY_MAX_IN_FLIGHT).
            requests_per_minute: limitSetting(flags.rpm, 'rpm'),
            max_in_flight: limitSetting(flags['max-in-flight'], 'max-in-flight'),
          }),
        ),
      ),
    ),
};
