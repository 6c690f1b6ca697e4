/** /healthz, /readyz and /metrics for operators and orchestrators. */
import { sql } from 'kysely';
import type { AppContext } from '../context.ts';
import { ApiError } from '../errors.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function operationsHandlers(ctx: AppContext): Pick<HandlerMap, 'getHealth' | 'getReadiness' | 'getMetrics'> {
  return {
    getHealth(_req, res) {
      sendJson(res, 'getHealth', 200, { status: 'ok' });
    },
    async getReadiness(_req, res) {
      try {
        await sql`select 1`.execute(ctx.db);
      } catch (err) {
        ctx.log.warn({ err }, 'readiness check: database unreachable');
        throw new ApiError(503, 'not_ready', 'The database is unreachable.');
      }
      sendJson(res, 'getReadiness', 200, { status: 'ready' });
    },
    async getMetrics(_req, res) {
      res.setHeader('Content-Type', ctx.metrics.registry.contentType);
      res.status(200).send(await ctx.metrics.registry.metrics());
    },
  };
}
