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

  constructor(init: MediagateErrorInit) {
    super(init.message);
    this.status = init.status;
    this.code = init.code;
    this.param = init.param;
    this.type = init.type;
    this.requestId = init.requestId;
    this.body = init.body;
    this.currentQuote = init.currentQuote;
  }

  /**
   * Builds the error of a non-2xx response from its parsed body. Tolerates bodies that are not
   * Mediagate error bodies (a proxy's HTML page, a mock server's problem+json): `code` is then null.
   */
  static fromResponse(response: Response, body: unknown): MediagateError {
    return MediagateError.fromErrorObject(
      response.status,
      readErrorObject(body),
      body,
      response.headers.get('X-Request-Id'),
      `HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ''}`,
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
    });
  }
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
