// `accounts create|list|get|update|credit`: accounts are addressed by id or by name.
import { defined, int, limitSetting, nullable, num, oneOf, optInt, optNum, required } from './args.ts';
import type { Commands } from './command.ts';
import { checkBody } from './contract.ts';
import { lines, one, page } from './output.ts';

const ACCOUNT_COLUMNS = ['id', 'name', 'status', 'balance', 'total_earned', 'total_spent', 'requests_per_minute', 'max_in_flight', 'created_at'];
const STATUSES = ['active', 'suspended'] as const;

const retention = (v: string | undefined) => (v?.trim().toLowerCase() === 'default' ? 'none' : v);

export const accountCommands: Commands = {
  create: async ({ admin, flags }) =>
    one(
      await admin.accounts.create(
        checkBody(
          'AdminAccountCreate',
          defined({
            name: required(flags.name, 'name'),
            initial_credits: optNum(flags['initial-credits'], 'initial-credits'),
            status: oneOf(flags.status, 'status', STATUSES),
            requests_per_minute: limitSetting(flags.rpm, 'rpm'),
            max_in_flight: limitSetting(flags['max-in-flight'], 'max-in-flight'),
          }),
        ),
      ),
    ),

  list: async ({ admin, flags }) =>
    page(
      await admin.accounts.list({
        limit: optInt(flags.limit, 'limit'),
        cursor: flags.cursor,
        status: oneOf(flags.status, 'status', STATUSES),
      }),
      ACCOUNT_COLUMNS,
    ),

  get: async ({ admin, target }) => one(await admin.accounts.resolve(target())),

  update: async ({ admin, flags, target, accountId }) =>
    one(
      await admin.accounts.update(
        await accountId(target()),
        checkBody(
          'AdminAccountUpdate',
          defined({
            name: flags.name,
            status: oneOf(flags.status, 'status', STATUSES),
            // `default` (or none) returns the account to the operator's OUTPUT_/INPUT_RETENTION_DAYS.
            output_retention_days: nullable(retention(flags['output-retention-days']), (v) => int(v, 'output-retention-days')),
            input_retention_days: nullable(retention(flags['input-retention-days']), (v) => int(v, 'input-retention-days')),
            // N, none (no limit) or default (DEFAULT_ACCOUNT_RPM / DEFAULT_ACCOUNT_MAX_IN_FLIGHT).
            requests_per_minute: limitSetting(flags.rpm, 'rpm'),
            max_in_flight: limitSetting(flags['max-in-flight'], 'max-in-flight'),
          }),
        ),
      ),
    ),

  // A negative amount debits; the service refuses to go below zero. With --idempotency-key, running
  // the same command again (after an error that left the outcome unknown) applies it at most once.
  credit: async ({ admin, flags, target, accountId }) => {
    const result = await admin.accounts.adjustCredits(
      await accountId(target()),
      checkBody(
        'AdminCreditAdjustment',
        defined({ amount: num(required(flags.amount, 'amount'), 'amount'), reason: required(flags.reason, 'reason'), idempotency_key: flags['idempotency-key'] }),
      ),
    );
    const { replayed, ...shown } = result;
    const head = replayed ? `already applied under this idempotency key (ledger entry ${result.entry.id}): nothing changed now\n\n` : '';
    return { json: result, text: `${head}${lines(shown.account)}\n\n${replayed ? 'original ledger entry' : 'ledger entry'}:\n${lines(shown.entry)}` };
  },
};
