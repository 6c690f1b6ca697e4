/** /healthz, /readyz and /metrics for operators and orchestrators. */
import type { AppContext } from '../context.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function operationsHandlers(ctx: AppContext): Pick<HandlerMap, 'getHealth' | 'getReadiness' | 'getMetrics'> {
  return {
    getHealth(_req, res) {
      sendJson(res, 'getHealth', 200, { status: 'ok' });
    },
    async getReadiness(_req, res) {
      await ctx.services.readiness.check();
      sendJson(res, 'getReadiness', 200, { status: 'ready' });
    },
    async getMetrics(_req, res) {
      res.setHeader('Content-Type', ctx.metrics.registry.contentType);
      res.status(200).send(await ctx.metrics.registry.metrics());
    },
  };
}
