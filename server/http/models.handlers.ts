import type { AppContext } from '../context.ts';
import { authOf, noStore } from './auth.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function modelsHandlers(ctx: AppContext): Pick<HandlerMap, 'listModels'> {
  return {
    async listModels(req, res) {
      noStore(res);
      sendJson(res, 'listModels', 200, await ctx.services.models.listForKey(authOf(req)));
    },
  };
}
