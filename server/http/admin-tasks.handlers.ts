/** Admin: read any task (image or video) and settle needs_attention image tasks. */
import type { AppContext } from '../context.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function adminTasksHandlers(ctx: AppContext): Pick<HandlerMap, 'getTask' | 'settleImageTask'> {
  const tasks = ctx.services.admin.tasks;
  return {
    async getTask(req, res) {
      sendJson(res, 'getTask', 200, await tasks.get(req.params.task_id));
    },
    async settleImageTask(req, res) {
      sendJson(res, 'settleImageTask', 200, await tasks.settleImageTask(req.params.task_id, req.body.outcome, req.body.reason));
    },
  };
}
