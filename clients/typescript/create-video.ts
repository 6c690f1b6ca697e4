import type { MediagateApi } from './api.ts';
import { MediagateError, MediagateNetworkError, sendRequest } from './mediagate-error.ts';
import type { MediagateResult, VideoBillingRow, VideoCreateRequest, VideoTaskCreated } from './types.ts';
import { sleep } from './wait-for-video.ts';

/** Options of `createVideo`. */
export interface CreateVideoOptions {
  /**
   * Called on `409 quote_stale` / `quote_expired` with the server's current quote. Resolve `true`
   * to accept the new price: the request is sent once more with `currentQuote.quoteToken`.
   * Without it (or on `false`) the conflict is returned as `{ error }`.
   */
  onQuoteChange?: (currentQuote: VideoBillingRow, conflict: MediagateError) => boolean | Promise<boolean>;
  /**
   * How many times a request that failed for a passing reason (no answer, `429`, `503`
   * `database_unavailable` / `not_ready` / `server_busy` / `storage_unavailable`, `507`, a reverse
   * proxy's own `502`/`503`/`504` page) is sent
   * again with the same `client_request_id` (default 2; 0 turns retries off).
   */
  maxRetries?: number;
  /** Aborts the request(s); the promise then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Codes of `503` that the contract says pass; the others (`no_reachable_member`, `capability_disabled`) last. */
const PASSING_503_CODES: ReadonlySet<string> = new Set(['database_unavailable', 'not_ready', 'server_busy', 'storage_unavailable']);
/** A `Retry-After` longer than this is returned to the caller instead of waited for. */
export const MAX_RETRY_AFTER_MS = 60_000;
/** The pause before the first retry when the answer gave no `Retry-After` (doubled for each next one). */
const FIRST_BACKOFF_MS = 500;

/**
 * Creates a video task (`POST /v1/videos/generations`). Adds a `client_request_id` when the body
 * has none, and sends it on every retry (of a passing failure, of an accepted quote change), so
 * that a retry returns the task the first request may have created instead of a second one. Every
 * failure carries that id as `clientRequestId` (`MediagateError`, `MediagateNetworkError`).
 */
export async function createVideo(
  api: MediagateApi,
  body: VideoCreateRequest,
  options: CreateVideoOptions = {},
): Promise<MediagateResult<VideoTaskCreated>> {
  const first = withClientRequestId(body);
  const result = await postVideo(api, first, options);
  const conflict = result.error;
  if (conflict === undefined || !isQuoteConflict(conflict) || conflict.currentQuote === undefined) return result;
  if (options.onQuoteChange === undefined) return result;

  const currentQuote = conflict.currentQuote;
  if ((await options.onQuoteChange(currentQuote, conflict)) !== true) return result;

  // The alias would disagree with the new token (`400 alias_conflict`), so only the snake_case name is sent.
  const { quoteToken: _staleAlias, ...rest } = first;
  // A second 409 is returned as is: the price moved again and the caller must decide again.
  return postVideo(api, { ...rest, quote_token: currentQuote.quoteToken }, options);
}

function withClientRequestId(body: VideoCreateRequest): VideoCreateRequest {
  if (body.client_request_id !== undefined || body.clientRequestIdRequired !== undefined) return body;
  return { ...body, client_request_id: globalThis.crypto.randomUUID() };
}

function isQuoteConflict(error: MediagateError): boolean {
  return error.status === 409 && (error.code === 'quote_stale' || error.code === 'quote_expired');
}

/** Whether the contract says this answer passes: nothing was created or stored, retry later (also `uploadFile`'s). */
export function isPassing(error: MediagateError): boolean {
  if (error.status === 429 || error.status === 507) return true; // rate_limited, too_many_in_flight; storage_full
  return error.status === 503 && error.code !== null && PASSING_503_CODES.has(error.code);
}

/**
 * A reverse proxy's own 502/503/504 page (no Mediagate error code: the gateway restarting or out of
 * reach behind nginx, an ingress, a load balancer). Retried for a create only: its
 * `client_request_id` makes a second send return the task the first may have created.
 */
function isProxyPage(error: MediagateError): boolean {
  return error.code === null && (error.status === 502 || error.status === 503 || error.status === 504);
}

/** Sends the create, and again with the same body (same id) after a passing failure, `maxRetries` times at most. */
async function postVideo(
  api: MediagateApi,
  body: VideoCreateRequest,
  options: CreateVideoOptions,
): Promise<MediagateResult<VideoTaskCreated>> {
  const { maxRetries = 2, signal } = options;
  // NaN would never stop retrying.
  if (!(maxRetries >= 0)) throw new RangeError('maxRetries must be 0 or more');
  const clientRequestId = body.client_request_id ?? body.clientRequestIdRequired;
  for (let attempt = 0; ; attempt += 1) {
    let delayMs: number | undefined;
    try {
      const { data, error, response } = await sendRequest(
        (middleware) => api.POST('/v1/videos/generations', { body, signal, middleware }),
        signal,
        clientRequestId,
      );
      // openapi-typescript-helpers' Readable<> drops keys typed exactly `null` (`VideoBillingLegacy`'s
      // `unitPrice`/`quotedCredits`), so the schema type is restored here; the wire shape is unchanged.
      if (response.ok && data !== undefined) return { data: data as VideoTaskCreated };
      const failure = MediagateError.fromResponse(response, error, clientRequestId);
      delayMs = retryDelay(failure, attempt, maxRetries, (e) => isPassing(e) || isProxyPage(e));
      if (delayMs === undefined) return { error: failure };
    } catch (err) {
      // No answer: the create may have been committed, and only the same id can tell.
      if (!(err instanceof MediagateNetworkError) || attempt >= maxRetries) throw err;
      delayMs = backoff(attempt);
    }
    await sleep(delayMs, signal);
  }
}

/**
 * The wait before sending again after `failure` (its `Retry-After`, else the backoff), or undefined
 * to give up: the retries used up, a failure that does not `pass`, or a wait over MAX_RETRY_AFTER_MS.
 * The retry rule of `createVideo`, `uploadFile` and the image streams.
 */
export function retryDelay(failure: MediagateError, attempt: number, maxRetries: number, pass: (failure: MediagateError) => boolean): number | undefined {
  if (attempt >= maxRetries || !pass(failure)) return undefined;
  const delayMs = failure.retryAfterMs ?? backoff(attempt);
  return delayMs > MAX_RETRY_AFTER_MS ? undefined : delayMs;
}

/** The pause before retry `attempt + 1` without a `Retry-After`: 0.5 s, 1 s, 2 s, … with jitter. */
export function backoff(attempt: number): number {
  return Math.min(FIRST_BACKOFF_MS * 2 ** attempt, MAX_RETRY_AFTER_MS) * (0.5 + Math.random() / 2);
}
