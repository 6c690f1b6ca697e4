/** Admin: the ledger and webhook deliveries of every account, and usage reports (JSON or CSV). */
import type { AppContext } from '../context.ts';
import { usageCsv } from '../services/admin/usage.service.ts';
import { noStore } from './auth.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function adminOperationsHandlers(ctx: AppContext): Pick<HandlerMap, 'listLedgerEntries' | 'listWebhookDeliveries' | 'getUsage'> {
  const admin = ctx.services.admin;
  return {
    async listLedgerEntries(req, res) {
      sendJson(res, 'listLedgerEntries', 200, await admin.ledger.list(req.query));
    },
    async listWebhookDeliveries(req, res) {
      sendJson(res, 'listWebhookDeliveries', 200, await admin.webhooks.list(req.query));
    },
    async getUsage(req, res) {
      const report = await admin.usage.report(req.query);
      noStore(res);
      // JSON unless the client prefers CSV (Accept: text/csv).
      if (req.accepts(['application/json', 'text/csv']) === 'text/csv') {
        res.status(200).type('text/csv; charset=utf-8').send(usageCsv(report));
        return;
      }
      sendJson(res, 'getUsage', 200, report);
    },
  };
}
