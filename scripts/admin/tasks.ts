// `tasks list|show`: every task (images and videos) with filters, and one task's whole story.
import { isDateTime } from '../../server/contract-schemas.ts';
import { list, oneOf, optInt, UsageError } from './args.ts';
import type { CommandContext, Commands } from './command.ts';
import { lines, page, table, type Output, type Row } from './output.ts';

const TASK_COLUMNS = ['id', 'kind', 'status', 'account_id', 'model', 'provider', 'held_credits', 'captured_credits', 'released_credits', 'created_at'];
export const TASK_STATUSES = ['processing', 'needs_attention', 'queued', 'in_progress', 'completed', 'failed'] as const;
const KINDS = ['image', 'video'] as const;
const ATTEMPT_COLUMNS = ['step', 'outcome', 'member_id', 'provider', 'upstream_job_id', 'started_at', 'duration_ms', 'error'];
const LEDGER_COLUMNS = ['id', 'kind', 'amount', 'balance_change', 'created_at'];
const OUTPUT_COLUMNS = ['file_id', 'content_type', 'bytes', 'width', 'height', 'expires_at'];

/** Each value of a comma-separated flag, checked against the allowed ones (the API's enum). */
export function listOf<T extends string>(value: string | undefined, flag: string, allowed: readonly T[]): T[] | undefined {
  const values = list(value);
  if (values === undefined) return undefined;
  for (const v of values) if (!allowed.includes(v as T)) throw new UsageError(`--${flag} takes ${allowed.join(', ')} (comma-separated), not '${v}'`);
  return values.length > 0 ? (values as T[]) : undefined;
}

/**
 * An RFC 3339 time as the API takes it (checked here with the validator's own check, which does not
 * run for the CLI): a date and time that exist, so 2026-02-31 is a usage error, not PostgreSQL's.
 */
export function time(value: string | undefined, flag: string): string | undefined {
  if (value === undefined) return undefined;
  if (!isDateTime(value)) throw new UsageError(`--${flag} takes an RFC 3339 time such as 2026-01-15T00:00:00Z (a date and time that exist), not '${value}'`);
  return value;
}

/** --account by id or name. */
export async function accountFilter(ctx: CommandContext): Promise<string | undefined> {
  return ctx.flags.account === undefined ? undefined : ctx.accountId(ctx.flags.account);
}

export const taskCommands: Commands = {
  list: async (ctx) => {
    const { admin, flags } = ctx;
    return page(
      await admin.tasks.list({
        limit: optInt(flags.limit, 'limit'),
        cursor: flags.cursor,
        kind: oneOf(flags.kind, 'kind', KINDS),
        status: listOf(flags.status, 'status', TASK_STATUSES),
        account_id: await accountFilter(ctx),
        api_key_id: flags.key,
        model: flags.model,
        member_id: flags.member,
        provider: flags.provider,
        created_after: time(flags.after, 'after'),
        created_before: time(flags.before, 'before'),
      }),
      TASK_COLUMNS,
    );
  },

  show: async ({ admin, target }) => {
    const task = await admin.tasks.get(target());
    const { quote, hold, ledger, attempts, webhook, outputs, ...summary } = task;
    const parts = [
      lines(summary as unknown as Row),
      `\nquote:\n${lines(quote as unknown as Row)}`,
      `\nhold:\n${hold ? lines(hold as unknown as Row) : '(none: nothing to hold)'}`,
      `\nledger:\n${table(ledger as unknown as Row[], LEDGER_COLUMNS)}`,
      `\nupstream attempts:\n${table(attempts as unknown as Row[], ATTEMPT_COLUMNS)}`,
      `\nwebhook:\n${webhook ? `${lines({ ...webhook, attempts: `${webhook.attempts.length} (webhooks show ${task.id})` } as unknown as Row)}` : '(none)'}`,
      `\noutputs:\n${table(outputs as unknown as Row[], OUTPUT_COLUMNS)}${outputs.map((o) => `\n${o.file_id}: ${o.url}`).join('')}`,
    ];
    return { json: task, text: parts.join('\n') } satisfies Output;
  },
};
