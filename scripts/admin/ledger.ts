// `ledger list`: the ledger of every account, newest first, with filters.
import type { Commands } from './command.ts';
import { optInt } from './args.ts';
import { page } from './output.ts';
import { accountFilter, listOf, time } from './tasks.ts';

const LEDGER_COLUMNS = ['id', 'kind', 'amount', 'balance_change', 'account_id', 'api_key_id', 'task_id', 'reason', 'created_at'];
const KINDS = ['grant', 'debit', 'hold', 'capture', 'release'] as const;

export const ledgerCommands: Commands = {
  list: async (ctx) => {
    const { admin, flags } = ctx;
    return page(
      await admin.ledger.list({
        limit: optInt(flags.limit, 'limit'),
        cursor: flags.cursor,
        account_id: await accountFilter(ctx),
        api_key_id: flags.key,
        task_id: flags.task,
        kind: listOf(flags.kind, 'kind', KINDS),
        created_after: time(flags.after, 'after'),
        created_before: time(flags.before, 'before'),
      }),
      LEDGER_COLUMNS,
    );
  },
};
