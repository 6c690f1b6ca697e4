// `webhooks list|show|redeliver`: every delivery (by state, account, time), a task's delivery with its attempts, and sending it again.
import type { Commands } from './command.ts';
import { optInt } from './args.ts';
import { lines, page, table, type Output, type Row } from './output.ts';
import { accountFilter, listOf, time } from './tasks.ts';
import type { AdminServices } from '../../server/services/admin/index.ts';

const ATTEMPT_COLUMNS = ['attempted_at', 'status_code', 'error_class', 'latency_ms', 'next_retry_at'];

function show(result: Awaited<ReturnType<AdminServices['webhooks']['forTask']>>): Output {
  const d = result.delivery;
  if (!d) return { json: result, text: `task ${result.task_id} has no webhook (no callback_url, or it has not finished)` };
  const { attempts, ...summary } = d;
  const text = `${lines(summary as unknown as Row)}\n\n${attempts.length === 0 ? '(no attempts yet)' : table(attempts as unknown as Row[], ATTEMPT_COLUMNS)}`;
  return { json: result, text };
}

const DELIVERY_COLUMNS = ['webhook_id', 'task_id', 'account_id', 'event_type', 'status', 'next_attempt_at', 'delivered_at', 'created_at'];
const STATES = ['pending', 'delivered', 'gone', 'failed'] as const;

export const webhookCommands: Commands = {
  list: async (ctx) => {
    const { admin, flags } = ctx;
    const result = await admin.webhooks.list({
      limit: optInt(flags.limit, 'limit'),
      cursor: flags.cursor,
      status: listOf(flags.status, 'status', STATES),
      account_id: await accountFilter(ctx),
      created_after: time(flags.after, 'after'),
      created_before: time(flags.before, 'before'),
    });
    return page({ ...result, data: result.data.map((d) => ({ ...d, attempts: d.attempts.length })) }, [...DELIVERY_COLUMNS, 'attempts']);
  },
  show: async ({ admin, target }) => show(await admin.webhooks.forTask(target())),
  redeliver: async ({ admin, target }) => show(await admin.webhooks.redeliver(target())),
};
