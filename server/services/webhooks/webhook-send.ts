/**
 * One signed webhook POST (Standard Webhooks, with the `standardwebhooks` package), the one way
 * Mediagate sends a webhook: a delivery attempt of the outbox (WebhookRunner) and a test event
 * (WebhookTester). Headers `webhook-id`, `webhook-timestamp` (this send) and `webhook-signature`
 * (`v1,…` per signing secret: two during a rotation's overlap); the body goes through safeFetch
 * (checked targets, no proxies, no redirects followed, one timeout), and at most 4 KiB of the
 * answer are read and dropped. The outcome is what a receiver did, never an exception: a status,
 * or the class of the failure.
 */
import { performance } from 'node:perf_hooks';
import { Webhook } from 'standardwebhooks';
import { SafeFetchError, safeFetch, type SafeFetchErrorClass, type SafeFetchOptions } from '../../lib/safe-fetch.ts';

/** Bytes of a receiver's answer read (then dropped). */
const MAX_RESPONSE_BYTES = 4096;

export interface SendOptions {
  timeoutMs: number;
  allowPrivate: boolean;
  signal?: AbortSignal;
  /** Test seams of safeFetch: the resolver, extra trusted CAs, addresses that count as public. */
  fetchOptions?: Pick<SafeFetchOptions, 'resolve' | 'ca' | 'treatAsPublic'>;
}

export interface SendOutcome {
  /** The receiver's HTTP status, or null when no answer came. */
  statusCode: number | null;
  /** Why no answer came (safeFetch's class), or null. */
  errorClass: SafeFetchErrorClass | null;
  /** What went wrong, in words (a non-2xx status, or the failure), or null for a 2xx. */
  error: string | null;
  /** `error` with what only the operator may see (a refused name's addresses): for the delivery's record. */
  detail: string | null;
  latencyMs: number;
}

/** Signs `body` as message `id` with every secret in `secrets` and POSTs it to `url`. Rethrows only the caller's abort. */
export async function sendSignedWebhook(url: string, id: string, body: string, secrets: readonly string[], opts: SendOptions): Promise<SendOutcome> {
  const at = new Date();
  const headers = {
    'content-type': 'application/json',
    'user-agent': 'Mediagate-Webhooks/1',
    'webhook-id': id,
    'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
    'webhook-signature': secrets.map((secret) => new Webhook(secret).sign(id, at, body)).join(' '),
  };
  const started = performance.now();
  let statusCode: number | null = null;
  let errorClass: SafeFetchErrorClass | null = null;
  let error: string | null = null;
  let detail: string | null = null;
  try {
    const res = await safeFetch(url, { method: 'POST', headers, body, timeoutMs: opts.timeoutMs, maxResponseBytes: MAX_RESPONSE_BYTES, allowPrivate: opts.allowPrivate, signal: opts.signal, ...opts.fetchOptions });
    statusCode = res.status;
    if (statusCode < 200 || statusCode >= 300) error = `the receiver answered HTTP ${statusCode}`;
  } catch (err) {
    if (opts.signal?.aborted || !(err instanceof SafeFetchError)) throw err;
    errorClass = err.errorClass;
    error = err.message;
    detail = err.detail;
  }
  return { statusCode, errorClass, error, detail: detail ?? error, latencyMs: Math.round(performance.now() - started) };
}
