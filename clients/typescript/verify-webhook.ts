/**
 * Verifies a `videoTaskFinished` webhook (Standard Webhooks) with the maintained `standardwebhooks`
 * package: the signature over `{webhook-id}.{webhook-timestamp}.{raw body}` with the account's
 * secret (`GET /v1/webhooks/secret`), and a timestamp within 5 minutes. During a rotation's overlap
 * a delivery carries two signatures; one matching is enough. Pass the RAW body (the bytes
 * received, before any JSON parsing): re-serialized JSON does not verify.
 *
 * Returns the task; throws `WebhookVerificationError` when the delivery is not authentic. Dedupe on
 * the `webhook-id` header: delivery is at least once.
 */
import { Webhook, WebhookVerificationError } from 'standardwebhooks';
import type { FinishedVideoTask } from './types.ts';

export { WebhookVerificationError };

/** Headers as Node (`req.headers`), fetch (`Headers`) or a plain object give them. */
export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

export function verifyWebhook(body: string | Buffer | Uint8Array, headers: WebhookHeaders, secret: string): FinishedVideoTask {
  const get = (name: string): string => {
    const value = headers instanceof Headers ? headers.get(name) : (headers[name] ?? headers[name.toLowerCase()]);
    return (Array.isArray(value) ? value[0] : value) ?? '';
  };
  const raw = typeof body === 'string' ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('utf8');
  const task = new Webhook(secret).verify(raw, {
    'webhook-id': get('webhook-id'),
    'webhook-timestamp': get('webhook-timestamp'),
    'webhook-signature': get('webhook-signature'),
  });
  return task as FinishedVideoTask;
}
