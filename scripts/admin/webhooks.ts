// `webhooks show|redeliver <video task id>`: a task's webhook delivery with its attempts, and sending it again.
import type { Commands } from './command.ts';
import { lines, table, type Output, type Row } from './output.ts';
import type { AdminServices } from '../../server/services/admin/index.ts';

const ATTEMPT_COLUMNS = ['attempted_at', 'status_code', 'error_class', 'latency_ms', 'next_retry_at'];

function show(result: Awaited<ReturnType<AdminServices['webhooks']['forTask']>>): Output {
  const d = result.delivery;
  if (!d) return { json: result, text: `task ${result.task_id} has no webhook (no callback_url, or it has not finished)` };
  const { attempts, ...summary } = d;
  const text = `${lines(summary as unknown as Row)}\n\n${attempts.length === 0 ? '(no attempts yet)' : table(attempts as unknown as Row[], ATTEMPT_COLUMNS)}`;
  return { json: result, text };
}

export const webhookCommands: Commands = {
  show: async ({ admin, target }) => show(await admin.webhooks.forTask(target())),
  redeliver: async ({ admin, target }) => show(await admin.webhooks.redeliver(target())),
};
