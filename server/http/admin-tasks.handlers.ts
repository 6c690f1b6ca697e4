/** Admin: list and read any task (image or video) with its story, settle needs_attention image tasks, see and resend a video task's webhook. */
import type { AppContext } from '../context.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function adminTasksHandlers(ctx: AppContext): Pick<HandlerMap, 'listTasks' | 'getTask' | 'settleImageTask' | 'getTaskWebhook' | 'redeliverTaskWebhook'> {
  const tasks = ctx.services.admin.tasks;
  const webhooks = ctx.services.admin.webhooks;
  return {
    async listTasks(req, res) {
      sendJson(res, 'listTasks', 200, await tasks.list(req.query));
    },
    async getTask(req, res) {
      sendJson(res, 'getTask', 200, await tasks.get(req.params.task_id));
    },
    async settleImageTask(req, res) {
      sendJson(res, 'settleImageTask', 200, await tasks.settleImageTask(req.params.task_id, req.body.outcome, req.body.reason));
    },
    async getTaskWebhook(req, res) {
      sendJson(res, 'getTaskWebhook', 200, await webhooks.forTask(req.params.task_id));
    },
    async redeliverTaskWebhook(req, res) {
      sendJson(res, 'redeliverTaskWebhook', 200, await webhooks.redeliver(req.params.task_id));
    },
  };
}
