// `usage [report] --from T --to T [--group-by account,key,model,provider] [--granularity hour|day] [--account A] [--csv]`
// A report is printed while it is read (a month by hour of every account is 100,000s of rows): CSV
// and --json a batch of rows at a time, exactly as the API answers them (JSON indented as every
// --json is); the text table, whose column widths need every row it shows, stops at TABLE_ROWS.
import { ApiError } from '../../server/errors.ts';
import { USAGE_CSV_COLUMNS, USAGE_CSV_HEADER, usageCsvLines, type UsageReport } from '../../server/services/admin/usage.service.ts';
import { oneOf, required, UsageError } from './args.ts';
import type { Commands } from './command.ts';
import { InvalidBody } from './contract.ts';
import { table, type Row } from './output.ts';
import { accountFilter, listOf, time } from './tasks.ts';

const DIMENSIONS = ['account', 'key', 'model', 'provider'] as const;

/** Rows of the text table at most: a terminal's reading; past them it says to use --csv or --json. */
export const TABLE_ROWS = 10_000;

export const usageCommands: Commands = {
  report: async (ctx) => {
    const { admin, flags } = ctx;
    if (flags.csv && flags.json) throw new UsageError('--csv and --json are two formats; pick one');
    const query = {
      from: time(required(flags.from, 'from'), 'from')!,
      to: time(required(flags.to, 'to'), 'to')!,
      group_by: listOf(flags['group-by'], 'group-by', DIMENSIONS),
      granularity: oneOf(flags.granularity, 'granularity', ['hour', 'day'] as const),
      account_id: await accountFilter(ctx),
    };
    let report: UsageReport;
    try {
      report = await admin.usage.report(query);
    } catch (err) {
      // The report's refusals of its query (`--to` not after `--from`, a range too long for its
      // granularity, a year PostgreSQL has not) are what was typed, as the API's 400 says: exit code 2.
      if (err instanceof ApiError && err.status === 400) throw new InvalidBody(err.status, err.code, err.message, err.param);
      throw err;
    }
    return {
      print: (out, json) => (json ? printJson(report, out) : flags.csv ? printCsv(report, out) : printTable(report, out)),
    };
  },
};

/** The API's CSV; the header goes with the first batch, so that a report that fails to run prints nothing. */
async function printCsv(report: UsageReport, out: (text: string) => void): Promise<void> {
  // Each piece is printed without its last `\n`: `out` ends it.
  let header = USAGE_CSV_HEADER;
  for await (const rows of report.rows()) {
    out((header + usageCsvLines(rows)).slice(0, -1));
    header = '';
  }
  if (header) out(header.slice(0, -1));
}

/** JSON.stringify(report, null, 2), the form of every --json, a batch of rows at a time. */
async function printJson(report: UsageReport, out: (text: string) => void): Promise<void> {
  const whole = JSON.stringify({ ...report.head, rows: [] }, null, 2);
  // Each row indented as an element of `rows`; a batch is printed once the next one is read, so that
  // its last row can take the comma that goes before the line end.
  const element = (row: object) => `    ${JSON.stringify(row, null, 2).replace(/\n/g, '\n    ')}`;
  let held: string | undefined;
  for await (const rows of report.rows()) {
    // The head: the empty report without the `]\n}` that ends it, up to the array's `[`.
    if (held === undefined) out(whole.slice(0, -']\n}'.length));
    else out(`${held},`);
    held = rows.map(element).join(',\n');
  }
  if (held === undefined) out(whole);
  else out(`${held}\n  ]\n}`);
}

/** The table of the dimensions grouped by and the counters; its first TABLE_ROWS rows, then a line saying there are more. */
async function printTable(report: UsageReport, out: (text: string) => void): Promise<void> {
  const dims: Record<string, string> = { account: 'account_id', key: 'api_key_id', model: 'model', provider: 'provider' };
  const columns = USAGE_CSV_COLUMNS.filter((c) => !Object.values(dims).includes(c) || report.head.group_by.some((d) => dims[d] === c));
  let shown: Row[] = [];
  let more = false;
  for await (const rows of report.rows()) {
    const room = TABLE_ROWS - shown.length;
    shown = shown.concat(rows.slice(0, room) as unknown as Row[]);
    if (rows.length > room) {
      // Leaving the loop ends the report's statement: nothing past the table is read.
      more = true;
      break;
    }
  }
  out(table(shown, [...columns]));
  if (more) out(`(the table stops at ${TABLE_ROWS} rows; --csv or --json prints the whole report)`);
}
