/**
 * The admin CLI's `usage` on a large report: the text table measures 100,000s of rows without a
 * spread past the stack's limit; a report is printed a batch of rows at a time, --json and --csv
 * exactly as a whole report would print, the table up to TABLE_ROWS rows (the report's reading
 * stopped there); and a query the report refuses is InvalidBody (exit code 2), before anything is read.
 */
import { describe, expect, it } from 'vitest';
import type { components } from '../../generated/api.d.ts';
import { ApiError } from '../../server/errors.ts';
import type { UsageQuery, UsageRepository, UsageRow } from '../../server/repositories/usage.repository.ts';
import type { AdminServices } from '../../server/services/admin/index.ts';
import { USAGE_CSV_COLUMNS, UsageService } from '../../server/services/admin/usage.service.ts';
import { parse, UsageError } from '../../scripts/admin/args.ts';
import { commandContext } from '../../scripts/admin/command.ts';
import { InvalidBody } from '../../scripts/admin/contract.ts';
import { table, type Output } from '../../scripts/admin/output.ts';
import { TABLE_ROWS, usageCommands } from '../../scripts/admin/usage.ts';

type AdminUsageRow = components['schemas']['AdminUsageRow'];

function usageRow(i: number): UsageRow {
  return {
    periodStart: new Date(Date.UTC(2026, 0, 1) + Math.floor(i / 100) * 3_600_000),
    accountId: `acct_${i % 100}`,
    apiKeyId: null,
    model: null,
    provider: null,
    creditsSpent: 1000 * (i + 1),
    creditsRefunded: i % 7 === 0 ? 500 : 0,
    videoTasksQueued: 0,
    videoTasksInProgress: 0,
    videoTasksCompleted: i % 3,
    videoTasksFailed: 0,
    imageTasksProcessing: 0,
    imageTasksNeedsAttention: 0,
    imageTasksCompleted: i % 5,
    imageTasksFailed: 0,
    imagesRequested: i % 5,
    imagesDelivered: i % 5,
  };
}

/** A repository whose report yields `rows` in batches of `batch`, and what the command made of it. */
function fakeUsage(rows: number, batch = 1000, failure?: Error) {
  const seen = { queries: [] as UsageQuery[], batchesRead: 0, closed: false };
  const repository = {
    async *report(q: UsageQuery) {
      seen.queries.push(q);
      try {
        if (failure) throw failure;
        for (let at = 0; at < rows; at += batch) {
          seen.batchesRead++;
          yield Array.from({ length: Math.min(batch, rows - at) }, (_, i) => usageRow(at + i));
        }
      } finally {
        seen.closed = true;
      }
    },
  } as unknown as UsageRepository;
  const admin = { usage: new UsageService(repository) } as unknown as AdminServices;
  const run = (...argv: string[]): Promise<Output> => {
    const { values: flags, positionals } = parse(['usage', 'report', ...argv]);
    return usageCommands.report!(commandContext(admin, 'usage', 'report', positionals.slice(2), flags));
  };
  return { seen, run };
}

/** What the CLI prints for the command (main.ts: each piece a line). */
async function printed(output: Output, json: boolean): Promise<string> {
  let out = '';
  if (output.print) await output.print((text) => void (out += `${text}\n`), json);
  else out = `${json ? JSON.stringify(output.json, null, 2) : output.text}\n`;
  return out;
}

const RANGE = ['--from', '2026-01-01T00:00:00Z', '--to', '2026-01-31T00:00:00Z', '--granularity', 'hour'];
const HEAD = { from: '2026-01-01T00:00:00.000Z', to: '2026-01-31T00:00:00.000Z', granularity: 'hour', group_by: ['account'] };

/** The report's API rows as a whole report would hold them. */
function apiRows(n: number): AdminUsageRow[] {
  return Array.from({ length: n }, (_, i) => {
    const r = usageRow(i);
    return {
      period_start: r.periodStart.toISOString(),
      account_id: r.accountId,
      api_key_id: null,
      model: null,
      provider: null,
      credits_spent: r.creditsSpent / 1e6,
      credits_refunded: r.creditsRefunded / 1e6,
      video_tasks_queued: 0,
      video_tasks_in_progress: 0,
      video_tasks_completed: r.videoTasksCompleted,
      video_tasks_failed: 0,
      image_tasks_processing: 0,
      image_tasks_needs_attention: 0,
      image_tasks_completed: r.imageTasksCompleted,
      image_tasks_failed: 0,
      images_requested: r.imagesRequested,
      images_delivered: r.imagesDelivered,
    };
  });
}

describe('the text table', () => {
  it('measures 200,000 rows (a spread of one argument per row overflowed the stack past about 125,000)', () => {
    const rows = Array.from({ length: 200_000 }, (_, i) => ({ id: `row_${i}`, n: i }));
    rows.push({ id: 'the-longest-id-of-all', n: -1 });
    const lines = table(rows, ['id', 'n']).split('\n');
    expect(lines).toHaveLength(200_002);
    expect([lines[0], lines[1], lines.at(-1)]).toEqual([`id${' '.repeat(21)}n`, `row_0${' '.repeat(18)}0`, 'the-longest-id-of-all  -1']);
  });
});

describe('usage: printed a batch at a time', () => {
  it('--json prints what JSON.stringify(report, null, 2) prints, whatever the batches (none, one, several)', async () => {
    for (const [rows, batch] of [[0, 1000], [1, 1000], [1000, 1000], [2500, 1000], [7, 2]]) {
      const { seen, run } = fakeUsage(rows!, batch);
      const out = await printed(await run(...RANGE, '--json'), true);
      expect([rows, out]).toEqual([rows, `${JSON.stringify({ ...HEAD, rows: apiRows(rows!) }, null, 2)}\n`]);
      expect(seen.closed).toBe(true);
    }
  });

  it('--csv prints the header, then a line per row', async () => {
    const { run } = fakeUsage(2500);
    const lines = (await printed(await run(...RANGE, '--csv'), false)).split('\n');
    expect(lines).toEqual([USAGE_CSV_COLUMNS.join(','), ...apiRows(2500).map((r) => USAGE_CSV_COLUMNS.map((c) => r[c] ?? '').join(',')), '']);
  });

  it(`the table shows at most ${TABLE_ROWS} rows, says so, and reads no further than it needs`, async () => {
    const { seen, run } = fakeUsage(130_200);
    const lines = (await printed(await run(...RANGE), false)).trimEnd().split('\n');
    expect(lines).toHaveLength(1 + TABLE_ROWS + 1);
    expect(lines[0]).toMatch(/^period_start +account_id +credits_spent +credits_refunded +video_tasks_queued/);
    expect(lines[TABLE_ROWS]).toMatch(/^2026-01-05T03:00:00\.000Z +acct_99 +10 /);
    expect(lines.at(-1)).toBe(`(the table stops at ${TABLE_ROWS} rows; --csv or --json prints the whole report)`);
    expect([seen.batchesRead, seen.closed]).toEqual([TABLE_ROWS / 1000 + 1, true]);

    const whole = fakeUsage(TABLE_ROWS);
    const all = (await printed(await whole.run(...RANGE), false)).trimEnd().split('\n');
    expect([all.length, all.at(-1)]).toEqual([1 + TABLE_ROWS, expect.stringMatching(/^2026-01-05T03:00:00\.000Z +acct_99 +10 /)]);
  });

  it('a report whose statement fails prints nothing, in every format', async () => {
    for (const format of [['--csv'], ['--json'], []]) {
      const { run } = fakeUsage(10, 1000, new Error('date/time field value out of range'));
      const output = await run(...RANGE, ...format);
      let out = '';
      await expect(output.print!((text) => void (out += text), format[0] === '--json')).rejects.toThrow('date/time field value out of range');
      expect([format, out]).toEqual([format, '']);
    }
  });
});

describe('usage: refusals', () => {
  it("a query the report refuses is the API's 400 as InvalidBody (exit code 2), before anything is read", async () => {
    for (const [args, param, message] of [
      [['--from', '2026-01-02T00:00:00Z', '--to', '2026-01-01T00:00:00Z'], 'to', "'to' must be after 'from'."],
      [['--from', '2026-01-01T00:00:00Z', '--to', '2026-03-01T00:00:00Z', '--granularity', 'hour'], 'to', "A report by hour covers at most 31 days; shorten the range between 'from' and 'to' or report by day."],
      [['--from', '0000-01-01T00:00:00Z', '--to', '0000-01-02T00:00:00Z'], 'from', "'from' must be from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z (UTC)."],
    ] as const) {
      const { seen, run } = fakeUsage(10);
      const err = await run(...args).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(InvalidBody);
      expect([args, (err as ApiError).status, (err as ApiError).code, (err as ApiError).param, (err as ApiError).message]).toEqual([args, 400, 'invalid_request', param, message]);
      expect(seen.queries).toEqual([]);
    }
  });

  it('--csv with --json is a usage error before the report is asked for', async () => {
    const { seen, run } = fakeUsage(10);
    await expect(run(...RANGE, '--csv', '--json')).rejects.toThrow(new UsageError('--csv and --json are two formats; pick one'));
    expect(seen.queries).toEqual([]);
  });
});
