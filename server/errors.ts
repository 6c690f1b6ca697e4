/**
 * The closed set of domain errors. Services throw these; the error middleware turns them (and
 * validator, parser and database errors) into the one error body of the contract.
 */
import type { components } from '../generated/api.d.ts';
import type { ProviderError } from './providers/provider-error.ts';
import type { StorageError } from './storage/storage-error.ts';

export type ErrorCode = components['schemas']['ErrorCode'];
export type ErrorBody = components['schemas']['ErrorResponse'];

type ErrorType = ErrorBody['error']['type'];

const TYPE_BY_STATUS: Record<number, ErrorType> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'insufficient_credits',
  403: 'permission_error',
  404: 'not_found_error',
  405: 'invalid_request_error',
  408: 'invalid_request_error',
  409: 'conflict_error',
  413: 'invalid_request_error',
  415: 'invalid_request_error',
  416: 'invalid_request_error',
  429: 'rate_limit_error',
};

export function errorTypeFor(status: number): ErrorType {
  return TYPE_BY_STATUS[status] ?? (status >= 500 ? 'server_error' : 'invalid_request_error');
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: ErrorCode,
    message: string,
    readonly param: string | null = null,
    /** Extra top-level members of the error body (e.g. `currentQuote`). */
    readonly extra: Record<string, unknown> = {},
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = 'ApiError';
  }

  /**
   * A refusal that came before the request cost the server anything (its body unread, no media
   * stored or fetched: `429 too_many_in_flight` of a cap checked first, or of a hold with no inputs):
   * its request-per-minute tokens go back (http/request-rate.ts). Set by `returningRateToken`.
   */
  rateTokenBack = false;

  body(requestId?: string): ErrorBody {
    const error: ErrorBody['error'] = { message: this.message, type: errorTypeFor(this.status), code: this.code, param: this.param };
    if (requestId !== undefined && this.status >= 500) error.request_id = requestId;
    return { error, ...this.extra } as ErrorBody;
  }
}

/** Marks `err` as a refusal whose request-per-minute tokens go back (ApiError.rateTokenBack). */
export function returningRateToken(err: ApiError): ApiError {
  err.rateTokenBack = true;
  return err;
}

/**
 * The message of a `400 invalid_request` for a body field: a field the operation does not take (an
 * OpenAI parameter this gateway does not offer, a typo) is named as unknown, not with the schema
 * validator's wording ("must NOT have additional properties"). The API's error middleware and the
 * CLI's body check (scripts/admin/contract.ts) both say it so.
 */
export function invalidFieldMessage(param: string | null, detail: string): string {
  if (param !== null && /must NOT have additional properties/.test(detail)) return `Unknown parameter '${param}': the operation does not take it.`;
  return param ? `Invalid '${param}': ${detail}.` : `Invalid request: ${detail}.`;
}

export const badRequest = (code: ErrorCode, message: string, param: string | null = null) => new ApiError(400, code, message, param);
export const notFound = (code: ErrorCode, message: string) => new ApiError(404, code, message);

/** A file the request names was deleted or expired while the request was being made (the hold's `input_files_gone`). */
export const inputFilesGone = () => notFound('file_not_found', 'A file this request names was deleted or expired while the request was being made; nothing was created or charged.');
export const conflict = (code: ErrorCode, message: string, extra: Record<string, unknown> = {}, param: string | null = null) =>
  new ApiError(409, code, message, param, extra);
export const paymentRequired = (code: 'key_quota_exceeded' | 'insufficient_balance', message: string) => new ApiError(402, code, message);
export const tooLarge = (code: ErrorCode, message: string, param: string | null = null) => new ApiError(413, code, message, param);
export const unavailable = (code: ErrorCode, message: string) => new ApiError(503, code, message);

/** Seconds a client is told to wait before retrying while the database is away. */
export const DATABASE_RETRY_AFTER_SECONDS = 2;

/** The database cannot be reached right now (down, restarting, crashed): retryable, never the client's fault. */
export const databaseUnavailable = () =>
  new ApiError(503, 'database_unavailable', `The database is unavailable right now; retry in ${DATABASE_RETRY_AFTER_SECONDS} s.`, null, {}, {
    'Retry-After': String(DATABASE_RETRY_AFTER_SECONDS),
  });

/** The one 401 body for a missing, malformed or unknown key: callers learn nothing about which. */
export const invalidApiKey = () =>
  new ApiError(401, 'invalid_api_key', "Missing or invalid API key. Send 'Authorization: Bearer <API_KEY>'.", null, {}, {
    'WWW-Authenticate': 'Bearer',
  });

/**
 * A key deactivated, or an account suspended: what authentication answers, and what the credit hold
 * answers when that happened after the request was authenticated (while its body arrived).
 */
export const apiKeyInactive = () => new ApiError(403, 'api_key_inactive', 'This API key is inactive.');
export const accountSuspended = () => new ApiError(403, 'account_suspended', 'The account that owns this API key is suspended.');

/**
 * `text` as a sentence: first letter capitalized, ending in a full stop (unless it already ends in
 * punctuation). Upstream reasons arrive as fragments ("the upstream … could not be reached"); every
 * message a client or an operator reads is made of whole sentences.
 */
export function sentence(text: string): string {
  const t = ended(text);
  return t === '' ? t : `${t[0]!.toUpperCase()}${t.slice(1)}`;
}

/** `text` ending in a full stop (unless it already ends in punctuation): a clause after a colon. */
export function ended(text: string): string {
  const t = text.trim();
  return t === '' || /[.!?]$/.test(t) ? t : `${t}.`;
}

/** Seconds to tell a client to wait, from milliseconds (at least 1). */
const seconds = (ms: number | undefined) => Math.max(1, Math.ceil((ms ?? 1000) / 1000));

/**
 * Unavailable upstream capacity: every account that serves the model is rate-limited by the
 * upstream, cooling down after failures, or at its concurrency limit. The gateway's side, not the
 * client's: 503 with Retry-After (429 is for the client's own limits).
 */
export function noUpstreamCapacity(model: string | undefined, retryAfterMs: number | undefined, why: string): ApiError {
  const s = seconds(retryAfterMs);
  const which = model ? `model '${model}'` : 'this request';
  return new ApiError(503, 'no_upstream_capacity', `No upstream account can take ${which} right now: ${why}; retry in ${s} s.`, null, {}, { 'Retry-After': String(s) });
}

/**
 * The one mapping from an upstream failure to the API error a client sees (synchronous requests)
 * and to the stable code a failed task carries. Only a refusal of the client's own input is a 4xx
 * (with the upstream's sanitized reason); what is wrong with an upstream account (credentials,
 * quota, configuration, capacity) or the upstream itself is a 5xx, and the operator finds the
 * reason in the member's health and the logs.
 */
export function apiErrorOf(err: ProviderError, model?: string): ApiError {
  switch (err.kind) {
    case 'policy':
      return new ApiError(400, 'content_policy_violation', `The upstream refused this request under its content policy: ${ended(err.message)}`);
    case 'invalid_request':
      return new ApiError(400, 'upstream_rejected', `The upstream rejected the request: ${ended(err.message)}`);
    case 'rate_limited':
      return noUpstreamCapacity(model, err.waitMs, 'the upstream is rate-limiting it');
    case 'auth':
    case 'quota_exhausted':
    case 'account_disabled':
      return new ApiError(503, 'upstream_unavailable', "The upstream account cannot take work right now (its credentials, quota or balance); the operator can see why in the pool member's health.");
    case 'misconfigured':
    case 'model_not_open':
      return new ApiError(502, 'upstream_error', "The upstream account that serves this request is misconfigured; the operator can see why in the pool member's health.");
    case 'retryable':
    case 'failed':
      return new ApiError(502, 'upstream_error', `The upstream failed: ${ended(err.message)}`);
  }
}

/** The stable `error.code` of a task that failed because of `err`. */
export function taskErrorCodeOf(err: ProviderError): ErrorCode {
  return apiErrorOf(err).code;
}

/** Seconds a client is told to wait after a storage failure: space is freed by an operator, an I/O fault may pass sooner. */
export const STORAGE_RETRY_AFTER_SECONDS = { full: 60, unavailable: 30 } as const;

/**
 * The one mapping of a media store failure (storage/storage-error.ts) to the API error a client
 * sees: the gateway's own fault, never the request's nor the upstream's. The message says nothing
 * of paths or system details; the log line has them. An unavailable store fails writes and reads
 * (stat, download) alike, so its message names neither.
 */
export function apiErrorOfStorage(err: StorageError): ApiError {
  const seconds = STORAGE_RETRY_AFTER_SECONDS[err.condition];
  const headers = { 'Retry-After': String(seconds) };
  return err.condition === 'full'
    ? new ApiError(507, 'storage_full', `The gateway's media storage is full, so the request could not be carried out (not a fault of the request); retry in ${seconds} s. The operator has been notified in the logs.`, null, {}, headers)
    : new ApiError(503, 'storage_unavailable', `The gateway's media storage is unavailable right now, so the request could not be carried out (not a fault of the request); retry in ${seconds} s. The operator has been notified in the logs.`, null, {}, headers);
}

/**
 * The reason a request's signal is aborted with when the server's stop cut its connection after the
 * grace period (main.ts `drain`): the gateway's doing, not the client's (`interrupted`, never
 * `client_disconnected`).
 */
export class CutByStop extends Error {
  override readonly name = 'CutByStop';
  constructor() {
    super('the server stopped and cut the connection');
  }
}
