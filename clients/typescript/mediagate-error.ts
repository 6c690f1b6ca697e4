import type { Middleware } from 'openapi-fetch';
import type { ErrorCode, ErrorType, VideoBillingRow } from './types.ts';

const ERROR_TYPES = [
  'invalid_request_error',
  'authentication_error',
  'permission_error',
  'not_found_error',
  'insufficient_credits',
  'conflict_error',
  'rate_limit_error',
  'server_error',
] as const satisfies readonly ErrorType[];

// Compile-time check that ERROR_TYPES lists every member of the generated union.
type MissingErrorType = Exclude<ErrorType, (typeof ERROR_TYPES)[number]>;
const errorTypesComplete: MissingErrorType extends never ? true : MissingErrorType = true;
void errorTypesComplete;

/** Fields of a `MediagateError`, as read from an error body or stream frame. */
export interface MediagateErrorInit {
  status: number;
  message: string;
  code: ErrorCode | null;
  param: string | null;
  type: ErrorType | null;
  requestId: string | null;
  body: unknown;
  currentQuote?: VideoBillingRow | undefined;
  retryAfterMs?: number | undefined;
  clientRequestId?: string | undefined;
}

/**
 * An error answered by Mediagate: a non-2xx response, or an `error` frame of an image stream
 * (then `status` is the stream's HTTP status, 200). Branch on `code`; `message` is for humans.
 */
export class MediagateError extends Error {
  override readonly name = 'MediagateError';
  /** HTTP status of the response that carried the error. */
  readonly status: number;
  /** The stable error code, or `null` when the body was not a Mediagate error body. */
  readonly code: ErrorCode | null;
  /** The request field at fault, when there is one. */
  readonly param: string | null;
  /** The error class (`invalid_request_error`, `conflict_error`, …). */
  readonly type: ErrorType | null;
  /** `X-Request-Id` of the response (else the body's `request_id`); quote it when reporting. */
  readonly requestId: string | null;
  /** The parsed error body (JSON when it parsed, else text). */
  readonly body: unknown;
  /** On `409 quote_stale` / `quote_expired`: the latest quote, with a fresh `quoteToken`. */
  readonly currentQuote: VideoBillingRow | undefined;
  /** The response's `Retry-After` (seconds or an HTTP date) in milliseconds, when it had one. */
  readonly retryAfterMs: number | undefined;
  /**
   * From `createVideo`: the `client_request_id` it sent (generated when the body had none). Send
   * the same body with it to retry without creating a second task.
   */
  readonly clientRequestId: string | undefined;

  constructor(init: MediagateErrorInit) {
    super(init.message);
    this.status = init.status;
    this.code = init.code;
    this.param = init.param;
    this.type = init.type;
    this.requestId = init.requestId;
    this.body = init.body;
    this.currentQuote = init.currentQuote;
    this.retryAfterMs = init.retryAfterMs;
    this.clientRequestId = init.clientRequestId;
  }

  /**
   * Builds the error of a non-2xx response from its parsed body. Tolerates bodies that are not
   * Mediagate error bodies (a proxy's HTML page, a mock server's problem+json): `code` is then null.
   * `clientRequestId` is the idempotency key the request carried, if any.
   */
  static fromResponse(response: Response, body: unknown, clientRequestId?: string): MediagateError {
    return MediagateError.fromErrorObject(
      response.status,
      readErrorObject(body),
      body,
      response.headers.get('X-Request-Id'),
      `HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ''}`,
      { retryAfterMs: parseRetryAfter(response.headers.get('Retry-After')), clientRequestId },
    );
  }

  /** Builds the error of an `event: error` frame (`{"type":"error","error":{…}}`). */
  static fromStreamFrame(response: Response, payload: unknown): MediagateError {
    return MediagateError.fromErrorObject(
      response.status,
      readErrorObject(payload),
      payload,
      response.headers.get('X-Request-Id'),
      'The image stream ended with an error frame',
    );
  }

  private static fromErrorObject(
    status: number,
    error: Record<string, unknown> | undefined,
    body: unknown,
    headerRequestId: string | null,
    fallbackMessage: string,
    extra: Pick<MediagateErrorInit, 'retryAfterMs' | 'clientRequestId'> = {},
  ): MediagateError {
    const bodyRequestId = typeof error?.request_id === 'string' ? error.request_id : null;
    return new MediagateError({
      status,
      message: typeof error?.message === 'string' ? error.message : fallbackMessage,
      // The server is the authority on codes: a code newer than this client passes through as-is.
      code: typeof error?.code === 'string' ? (error.code as ErrorCode) : null,
      param: typeof error?.param === 'string' ? error.param : null,
      type: isErrorType(error?.type) ? error.type : null,
      requestId: headerRequestId ?? bodyRequestId,
      body,
      currentQuote: readCurrentQuote(body),
      ...extra,
    });
  }
}

/**
 * A request that got no HTTP answer: the connection was refused or reset, the host did not
 * resolve, or the answer broke off (an image stream whose connection was cut). The
 * request may or may not have reached the server; `cause` is the error fetch threw, or what showed
 * that the answer broke off.
 */
export class MediagateNetworkError extends Error {
  override readonly name = 'MediagateNetworkError';
  /** From `createVideo`: the `client_request_id` it sent; retry with it (see `MediagateError`). */
  readonly clientRequestId: string | undefined;

  /** `what`: how the message begins (an answer that began, then broke off, says so). */
  constructor(cause: unknown, clientRequestId?: string, what = 'No answer from Mediagate') {
    const code = networkCodeOf(cause);
    super(`${what}: ${cause instanceof Error ? cause.message : String(cause)}${code ? ` (${code})` : ''}`, { cause });
    this.clientRequestId = clientRequestId;
  }
}

/**
 * Runs one openapi-fetch call and turns a failed connection (fetch's `TypeError`, an
 * `ECONNREFUSED`-style code, a body that broke off) into a `MediagateNetworkError`, which the
 * helpers retry. The caller's abort, and errors raised before the request left (an invalid
 * `baseUrl`), pass through unchanged: they would only fail the same way again.
 */
export async function sendRequest<T>(
  call: (middleware: Middleware[]) => Promise<T>,
  signal: AbortSignal | undefined,
  clientRequestId?: string,
): Promise<T> {
  let sent = false;
  try {
    return await call([{ onRequest: () => void (sent = true) }]);
  } catch (err) {
    if (!sent || signal?.aborted === true || !isNetworkFailure(err)) throw err;
    throw new MediagateNetworkError(err, clientRequestId);
  }
}

/**
 * Runs one read of an answer that has begun (`reader.read()` of its body); a body that breaks off
 * (the connection reset or closed mid-chunk: fetch's `TypeError: terminated`) throws a
 * `MediagateNetworkError`. The caller's abort passes through unchanged, as in `sendRequest`.
 */
export async function readBody<T>(read: () => Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  try {
    return await read();
  } catch (err) {
    if (signal?.aborted === true || !isNetworkFailure(err)) throw err;
    throw new MediagateNetworkError(err, undefined, 'The answer from Mediagate broke off');
  }
}

/**
 * `Retry-After` as milliseconds from now: delay-seconds, or an HTTP date (RFC 9110 §10.2.3), which
 * starts with a day name. `undefined` when absent or unreadable.
 */
export function parseRetryAfter(value: string | null): number | undefined {
  const text = value?.trim();
  if (!text) return undefined;
  if (/^\d+$/.test(text)) return Number(text) * 1_000;
  const at = /^[A-Za-z]{3}/.test(text) ? Date.parse(text) : Number.NaN;
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/** True for errors whose `code` is one of `codes` (narrows to `MediagateError`). */
export function isMediagateError(value: unknown, ...codes: ErrorCode[]): value is MediagateError {
  return value instanceof MediagateError && (codes.length === 0 || (value.code !== null && codes.includes(value.code)));
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isErrorType(value: unknown): value is ErrorType {
  return typeof value === 'string' && (ERROR_TYPES as readonly string[]).includes(value);
}

function readErrorObject(body: unknown): Record<string, unknown> | undefined {
  return isRecord(body) && isRecord(body.error) ? body.error : undefined;
}

function readCurrentQuote(body: unknown): VideoBillingRow | undefined {
  if (!isRecord(body) || !isRecord(body.currentQuote)) return undefined;
  // Only the token is needed to retry; the rest of the row is the contract's business.
  return typeof body.currentQuote.quoteToken === 'string' ? (body.currentQuote as VideoBillingRow) : undefined;
}

/** Codes of a connection that failed or broke off (Node, undici, node-fetch). */
const NETWORK_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ENETUNREACH',
  'EHOSTUNREACH',
  'UND_ERR_SOCKET',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
]);

function networkCodeOf(err: unknown): string | undefined {
  // The socket's error is the `cause` of fetch's TypeError (undici), or the error itself (node-fetch).
  let e = err;
  for (let depth = 0; depth < 3 && isRecord(e); depth += 1, e = e.cause) {
    if (typeof e.code === 'string' && NETWORK_CODES.has(e.code)) return e.code;
  }
  return undefined;
}

function isNetworkFailure(err: unknown): boolean {
  // fetch rejects with a TypeError when it gets no answer (Node: `fetch failed`, with the socket's
  // error as `cause`; browsers: `Failed to fetch`), and so does reading a body that broke off.
  return err instanceof TypeError || networkCodeOf(err) !== undefined;
}
