/** The account's webhook signing secret (read, created on first use; rotate) and a test event to a receiver. */
import type { AppContext } from '../context.ts';
import type { WebhookSecretView } from '../services/webhooks/webhook-secrets.ts';
import { authOf, noStore } from './auth.ts';
import { sendJson, type HandlerMap } from './types.ts';

const toSecret = (v: WebhookSecretView) => ({
  object: 'webhook_secret' as const,
  secret: v.secret,
  created_at: v.createdAt.toISOString(),
  previous_secret_expires_at: v.previousExpiresAt ? v.previousExpiresAt.toISOString() : null,
});

export function webhooksHandlers(ctx: AppContext): Pick<HandlerMap, 'getWebhookSecret' | 'rotateWebhookSecret' | 'testWebhook'> {
  const secrets = ctx.services.webhookSecrets;
  return {
    async getWebhookSecret(req, res) {
      noStore(res);
      sendJson(res, 'getWebhookSecret', 200, toSecret(await secrets.get(authOf(req).accountId)));
    },
    async rotateWebhookSecret(req, res) {
      noStore(res);
      const rotated = await secrets.rotate(authOf(req).accountId);
      ctx.log.info({ accountId: authOf(req).accountId }, 'webhook secret rotated');
      sendJson(res, 'rotateWebhookSecret', 200, toSecret(rotated));
    },
    async testWebhook(req, res) {
      const { url, event_type: eventType = 'video.completed' } = req.body;
      const r = await ctx.services.webhookTester.send(authOf(req), url, eventType);
      noStore(res);
      sendJson(res, 'testWebhook', 200, {
        object: 'webhook_test',
        url,
        event_type: r.eventType,
        webhook_id: r.webhookId,
        task_id: r.taskId,
        delivered: r.statusCode !== null && r.statusCode >= 200 && r.statusCode < 300,
        status_code: r.statusCode,
        error: r.error === null ? null : { class: r.errorClass, message: r.error },
        latency_ms: r.latencyMs,
      });
    },
  };
}
