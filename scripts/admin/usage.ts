// `usage [report] --from T --to T [--group-by account,key,model,provider] [--granularity hour|day] [--account A] [--csv]`
import { oneOf, required, UsageError } from './args.ts';
import type { Commands } from './command.ts';
import { table, type Row } from './output.ts';
import { accountFilter, listOf, time } from './tasks.ts';
import { USAGE_CSV_COLUMNS, usageCsv } from '../../server/services/admin/usage.service.ts';

const DIMENSIONS = ['account', 'key', 'model', 'provider'] as const;

export const usageCommands: Commands = {
  report: async (ctx) => {
    const { admin, flags } = ctx;
    const report = await admin.usage.report({
      from: time(required(flags.from, 'from'), 'from')!,
      to: time(required(flags.to, 'to'), 'to')!,
      group_by: listOf(flags['group-by'], 'group-by', DIMENSIONS),
      granularity: oneOf(flags.granularity, 'granularity', ['hour', 'day'] as const),
      account_id: await accountFilter(ctx),
    });
    if (flags.csv && flags.json) throw new UsageError('--csv and --json are two formats; pick one');
    if (flags.csv) return { json: report, text: usageCsv(report).trimEnd() };
    // Only the columns that say something: the dimensions grouped by and the counters.
    const dims: Record<string, string> = { account: 'account_id', key: 'api_key_id', model: 'model', provider: 'provider' };
    const columns = USAGE_CSV_COLUMNS.filter((c) => !Object.values(dims).includes(c) || report.group_by.some((d) => dims[d] === c));
    return { json: report, text: table(report.rows as unknown as Row[], [...columns]) };
  },
};
