/**
 * Admin: usage reports (GET /admin/v1/usage), as JSON or CSV; one SQL statement per report, whose
 * rows are handed on a batch at a time as they are read (UsageRepository.report), never held whole.
 */
import type { components } from '../../../generated/api.d.ts';
import { isDateTime } from '../../contract-schemas.ts';
import { badRequest } from '../../errors.ts';
import { toCredits } from '../../lib/money.ts';
import type { Granularity, UsageDimension, UsageRepository, UsageRow } from '../../repositories/usage.repository.ts';

type AdminUsageReport = components['schemas']['AdminUsageReport'];
type AdminUsageRow = components['schemas']['AdminUsageRow'];

/** A report checked and ready to be read. */
export interface UsageReport {
  /** The answer without its rows: AdminUsageReport's other fields, which come before `rows`. */
  head: Omit<AdminUsageReport, 'rows'>;
  /**
   * Runs the report and yields its rows in order, a batch at a time, each read as the last is taken.
   * Read it with `for await` or `pipeline`, to its end or stopping early: from the first `next()`
   * until then it holds a database connection. Its statement's own failure comes with the first
   * batch, before anything of an answer needs to be written. `signal`: its reader went away; the
   * statement still running is cancelled and the generator throws the signal's reason.
   */
  rows(signal?: AbortSignal): AsyncGenerator<AdminUsageRow[], void, undefined>;
}

export interface UsageQueryParams {
  from: string;
  to: string;
  group_by?: UsageDimension[];
  granularity?: Granularity;
  account_id?: string;
}

/** Longest range of a report, by granularity (hours of a month; days of two years). */
const MAX_RANGE_DAYS: Record<Granularity, number> = { hour: 31, day: 731 };

/** The CSV columns, in the order of AdminUsageRow. */
export const USAGE_CSV_COLUMNS = [
  'period_start', 'account_id', 'api_key_id', 'model', 'provider', 'credits_spent', 'credits_refunded',
  'video_tasks_queued', 'video_tasks_in_progress', 'video_tasks_completed', 'video_tasks_failed',
  'image_tasks_processing', 'image_tasks_needs_attention', 'image_tasks_completed', 'image_tasks_failed',
  'images_requested', 'images_delivered',
] as const satisfies readonly (keyof AdminUsageRow)[];

/**
 * An RFC 3339 date-time as an instant; an invalid date for one that does not exist (Feb 30, which
 * JavaScript's Date would roll to Mar 2; the validator refuses it, the admin CLI's callers need not).
 * A leap second (`23:59:60`, valid RFC 3339 that JavaScript's Date refuses) is the instant after
 * second 59, as POSIX clocks count it: the next minute's start.
 */
function instant(text: string): Date {
  if (!isDateTime(text)) return new Date(NaN);
  const leap = /^(.*T\d\d:\d\d:)60(\.\d+)?(Z|[+-]\d\d:\d\d)$/i.exec(text);
  return leap ? new Date(new Date(`${leap[1]}59${leap[2] ?? ''}${leap[3]}`).getTime() + 1000) : new Date(text);
}

/**
 * The instants PostgreSQL's timestamptz and RFC 3339 both write (years 0001 to 9999, UTC): RFC 3339
 * has a year 0000, PostgreSQL none (1 BC comes before 1 AD), and an offset can move a time of
 * 9999-12-31 into year 10000, which RFC 3339 cannot write.
 */
const FIRST_INSTANT = Date.parse('0001-01-01T00:00:00Z');
const END_INSTANT = Date.parse('+010000-01-01T00:00:00Z');

/** A time of the query: the API's 400 for one that does not exist or that PostgreSQL cannot hold. */
function queryTime(text: string, param: 'from' | 'to'): Date {
  const at = instant(text);
  if (Number.isNaN(at.getTime())) throw badRequest('invalid_request', `'${param}' must be an RFC 3339 date-time of a date and time that exist.`, param);
  if (at.getTime() < FIRST_INSTANT || at.getTime() >= END_INSTANT) {
    throw badRequest('invalid_request', `'${param}' must be from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z (UTC).`, param);
  }
  return at;
}

export class UsageService {
  constructor(private readonly usage: UsageRepository) {}

  /** Checks the query (every refusal is a 400 naming its parameter, before anything is read). */
  async report(params: UsageQueryParams): Promise<UsageReport> {
    const from = queryTime(params.from, 'from');
    const to = queryTime(params.to, 'to');
    if (to <= from) throw badRequest('invalid_request', `'to' must be after 'from'.`, 'to');
    const granularity = params.granularity ?? 'day';
    const maxDays = MAX_RANGE_DAYS[granularity];
    if (to.getTime() - from.getTime() > maxDays * 86_400_000) {
      throw badRequest('invalid_request', `A report by ${granularity} covers at most ${maxDays} days; shorten the range between 'from' and 'to'${granularity === 'hour' ? ' or report by day' : ''}.`, 'to');
    }
    const groupBy = params.group_by && params.group_by.length > 0 ? [...new Set(params.group_by)] : (['account'] as UsageDimension[]);
    const query = {
      from: from.toISOString(),
      to: to.toISOString(),
      granularity,
      groupBy,
      ...(params.account_id !== undefined && { accountId: params.account_id }),
    };
    const usage = this.usage;
    return {
      head: { from: query.from, to: query.to, granularity, group_by: groupBy },
      async *rows(signal?: AbortSignal) {
        for await (const batch of usage.report(query, signal)) yield batch.map(toApiRow);
      },
    };
  }
}

function toApiRow(r: UsageRow): AdminUsageRow {
  return {
    period_start: r.periodStart.toISOString(),
    account_id: r.accountId,
    api_key_id: r.apiKeyId,
    model: r.model,
    provider: r.provider,
    credits_spent: toCredits(r.creditsSpent),
    credits_refunded: toCredits(r.creditsRefunded),
    video_tasks_queued: r.videoTasksQueued,
    video_tasks_in_progress: r.videoTasksInProgress,
    video_tasks_completed: r.videoTasksCompleted,
    video_tasks_failed: r.videoTasksFailed,
    image_tasks_processing: r.imageTasksProcessing,
    image_tasks_needs_attention: r.imageTasksNeedsAttention,
    image_tasks_completed: r.imageTasksCompleted,
    image_tasks_failed: r.imageTasksFailed,
    images_requested: r.imagesRequested,
    images_delivered: r.imagesDelivered,
  };
}

/** RFC 4180: a field with a comma, quote or line break is quoted, quotes doubled; null is empty. */
function csvField(value: string | number | null): string {
  if (value === null) return '';
  const text = String(value);
  return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

/** The CSV form of a report is this header line, then one line per row (CRLF-free: `\n` line ends). */
export const USAGE_CSV_HEADER = `${USAGE_CSV_COLUMNS.join(',')}\n`;

/** Rows as lines of the report's CSV, each ended by `\n`. */
export function usageCsvLines(rows: readonly AdminUsageRow[]): string {
  let text = '';
  for (const row of rows) text += `${USAGE_CSV_COLUMNS.map((c) => csvField(row[c])).join(',')}\n`;
  return text;
}
