import type { MediagateApi } from './api.ts';
import { MediagateError } from './mediagate-error.ts';
import type { MediagateResult, VideoBillingRow, VideoCreateRequest, VideoTaskCreated } from './types.ts';

/** Options of `createVideo`. */
export interface CreateVideoOptions {
  /**
   * Called on `409 quote_stale` / `quote_expired` with the server's current quote. Resolve `true`
   * to accept the new price: the request is sent once more with `currentQuote.quoteToken`.
   * Without it (or on `false`) the conflict is returned as `{ error }`.
   */
  onQuoteChange?: (currentQuote: VideoBillingRow, conflict: MediagateError) => boolean | Promise<boolean>;
  /** Aborts the request(s); the promise then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * Creates a video task (`POST /v1/videos/generations`). Adds a `client_request_id` when the body
 * has none, and keeps it on the quote retry so that the retry stays idempotent.
 */
export async function createVideo(
  api: MediagateApi,
  body: VideoCreateRequest,
  options: CreateVideoOptions = {},
): Promise<MediagateResult<VideoTaskCreated>> {
  const first = withClientRequestId(body);
  const result = await postVideo(api, first, options.signal);
  const conflict = result.error;
  if (conflict === undefined || !isQuoteConflict(conflict) || conflict.currentQuote === undefined) return result;
  if (options.onQuoteChange === undefined) return result;

  const currentQuote = conflict.currentQuote;
  if ((await options.onQuoteChange(currentQuote, conflict)) !== true) return result;

  // The alias would disagree with the new token (`400 alias_conflict`), so only the snake_case name is sent.
  const { quoteToken: _staleAlias, ...rest } = first;
  // A second 409 is returned as is: the price moved again and the caller must decide again.
  return postVideo(api, { ...rest, quote_token: currentQuote.quoteToken }, options.signal);
}

function withClientRequestId(body: VideoCreateRequest): VideoCreateRequest {
  if (body.client_request_id !== undefined || body.clientRequestIdRequired !== undefined) return body;
  return { ...body, client_request_id: globalThis.crypto.randomUUID() };
}

function isQuoteConflict(error: MediagateError): boolean {
  return error.status === 409 && (error.code === 'quote_stale' || error.code === 'quote_expired');
}

async function postVideo(
  api: MediagateApi,
  body: VideoCreateRequest,
  signal: AbortSignal | undefined,
): Promise<MediagateResult<VideoTaskCreated>> {
  const { data, error, response } = await api.POST('/v1/videos/generations', { body, signal });
  if (!response.ok || data === undefined) return { error: MediagateError.fromResponse(response, error) };
  // openapi-typescript-helpers' Readable<> drops keys typed exactly `null` (`VideoBillingLegacy`'s
  // `unitPrice`/`quotedCredits`), so the schema type is restored here; the wire shape is unchanged.
  return { data: data as VideoTaskCreated };
}
