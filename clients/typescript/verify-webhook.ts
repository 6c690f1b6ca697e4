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
import { Webhook, WebhookVerificationError as LibraryVerificationError } from 'standardwebhooks';
import type { FinishedVideoTask } from './types.ts';

/**
 * A webhook delivery that is not authentic: a header missing or malformed, no signature matching
 * the secret, or a timestamp more than 5 minutes off; `cause` is the `standardwebhooks` error. The
 * package's own class rather than the library's, whose declarations need Node's types (`Buffer`):
 * consumers of this package need none.
 */
export class WebhookVerificationError extends Error {
  override readonly name = 'WebhookVerificationError';
}

/** Headers as Node (`req.headers`), fetch (`Headers`) or a plain object give them. */
export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

/** `body` is the raw request body: a string, or its bytes (a Node `Buffer` is a `Uint8Array`). */
export function verifyWebhook(body: string | Uint8Array, headers: WebhookHeaders, secret: string): FinishedVideoTask {
  // A plain object may keep the sender's case (`Webhook-Id`): names are matched case-insensitively.
  // A `Headers` of any implementation (undici's, node-fetch's, a ponyfill's) has `get`; `instanceof` knows only the global one.
  const fetchLike = typeof (headers as Headers).get === 'function' ? (headers as Headers) : undefined;
  const plain = fetchLike ? undefined : Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.toLowerCase(), v]));
  const get = (name: string): string => {
    const value = plain ? plain[name] : fetchLike!.get(name);
    return (Array.isArray(value) ? value[0] : value) ?? '';
  };
  // TextDecoder rather than Buffer: the package's declarations then need no Node types.
  const raw = typeof body === 'string' ? body : new TextDecoder().decode(body);
  let task: unknown;
  try {
    task = new Webhook(secret).verify(raw, {
      'webhook-id': get('webhook-id'),
      'webhook-timestamp': get('webhook-timestamp'),
      'webhook-signature': get('webhook-signature'),
    });
  } catch (err) {
    // Only the library's verdict on the delivery; a malformed secret is the caller's error, thrown as it is.
    if (err instanceof LibraryVerificationError) throw new WebhookVerificationError(err.message, { cause: err });
    throw err;
  }
  return task as FinishedVideoTask;
}
