import type { AppContext } from '../context.ts';
import { authOf, noStore } from './auth.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function creditsHandlers(ctx: AppContext): Pick<HandlerMap, 'getCredits'> {
  return {
    async getCredits(req, res) {
      noStore(res);
      sendJson(res, 'getCredits', 200, await ctx.services.credits.getBalance(authOf(req)));
    },
  };
}
