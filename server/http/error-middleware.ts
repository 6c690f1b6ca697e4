/**
 * The one error middleware: domain errors, validator errors, body-parser errors and database errors
 * all become the contract's error body. Unknown errors are 500 with the request id and nothing else.
 */
import { logWith } from './access-log.ts';
import type { ErrorRequestHandler, Request } from 'express';
import type { Logger } from '../logger.ts';
import { isDatabaseUnavailable } from '../db/database.ts';
import { ApiError, apiErrorOfStorage, databaseUnavailable, invalidFieldMessage, type ErrorCode } from '../errors.ts';
import { StorageError } from '../services/file.service.ts';
import { lingerAfterResponse } from './request-guards.ts';
import { giveBackRateToken } from './request-rate.ts';

const AUTH_ERROR = Symbol('mediagate.authError');

/**
 * Lets the security handler keep its precise ApiError (the validator only keeps status and message,
 * and turns anything a security handler throws into a 401): a key that could not be checked
 * because the database is away is a 503, not an invalid key.
 */
export function rememberAuthError(req: Request, err: unknown): void {
  const apiError = err instanceof ApiError ? err : isDatabaseUnavailable(err) ? databaseUnavailable() : undefined;
  if (apiError) (req as Request & { [AUTH_ERROR]?: ApiError })[AUTH_ERROR] = apiError;
}

interface ValidatorError {
  status: number;
  message: string;
  path?: string;
  errors?: { path?: string; message?: string; errorCode?: string }[];
  /** A 405's `Allow`: the methods of the contract's path item, in lower case. */
  headers?: { Allow?: string };
}

function isValidatorError(err: unknown): err is ValidatorError {
  return typeof err === 'object' && err !== null && typeof (err as ValidatorError).status === 'number' && Array.isArray((err as ValidatorError).errors);
}

/** `/body/account/name` -> `account.name`; `/query/limit` -> `limit`. */
export function paramFromPath(path: string | undefined, message = ''): string | null {
  if (!path) return null;
  const parts = path.split('/').filter(Boolean);
  if (['body', 'query', 'params', 'path', 'headers', 'files'].includes(parts[0] ?? '')) parts.shift();
  const missing = /required property '([^']+)'/.exec(message)?.[1];
  if (missing && parts.at(-1) !== missing) parts.push(missing);
  const unknown = /additional properties|Unknown query parameter '([^']+)'/i.test(message) ? /'([^']+)'/.exec(message)?.[1] : undefined;
  if (unknown && !parts.includes(unknown)) parts.push(unknown);
  return parts.length ? parts.join('.') : null;
}

/** The methods a contract's path item can have, in the order an `Allow` header lists them. */
const ALLOW_ORDER = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'TRACE'];

/**
 * What a value that fits no branch of a `oneOf` (`seconds`: an integer or a string of digits) failed
 * in each branch, in order ("must be integer, or must match pattern …"): the first branch's failure
 * alone would say that the other form is not allowed. Any other failure: the first error's message.
 */
function validationDetail(err: ValidatorError): string {
  const first = err.errors?.[0];
  const atFirst = (err.errors ?? []).filter((e) => e.path === first?.path && e.message !== undefined);
  if (atFirst.some((e) => /must match exactly one schema in oneOf/.test(e.message!))) {
    const branches = [...new Set(atFirst.map((e) => e.message!).filter((m) => !/schema in oneOf/.test(m)))];
    if (branches.length > 1) return branches.join(', or ');
  }
  return first?.message ?? err.message;
}

function fromValidator(err: ValidatorError, req: Request): ApiError {
  const first = err.errors?.[0];
  switch (err.status) {
    case 400: {
      const param = paramFromPath(first?.path, first?.message);
      const detail = validationDetail(err);
      return new ApiError(400, 'invalid_request', invalidFieldMessage(param, detail), param);
    }
    case 401: {
      // Routes match paths in any letter case (Express, the validator): so does the blame.
      const path = req.path.toLowerCase();
      if (path.startsWith('/admin/')) return new ApiError(401, 'invalid_admin_token', 'Missing or invalid admin token.');
      if (path === '/metrics') return new ApiError(401, 'invalid_metrics_token', 'Missing or invalid metrics token.');
      return new ApiError(401, 'invalid_api_key', "Missing or invalid API key. Send 'Authorization: Bearer <API_KEY>'.", null, {}, { 'WWW-Authenticate': 'Bearer' });
    }
    case 404:
      return new ApiError(404, 'not_found', `No route for ${req.method} ${req.path}.`);
    case 405: {
      // RFC 9110 §15.5.6: a 405 says which methods the resource has (method names are upper case),
      // here in one order whatever the validator's.
      const given = (err.headers?.Allow ?? '').split(',').map((method) => method.trim().toUpperCase());
      const allow = ALLOW_ORDER.filter((method) => given.includes(method)).join(', ');
      return new ApiError(405, 'method_not_allowed', `Method ${req.method} is not allowed on ${req.path}${allow ? `; it answers ${allow}` : ''}.`, null, {}, allow ? { Allow: allow } : {});
    }
    case 413:
      return new ApiError(413, 'body_too_large', 'The request body is too large.');
    case 415:
      return new ApiError(415, 'unsupported_media_type', `Unsupported Content-Type '${req.headers['content-type'] ?? ''}' for ${req.method} ${req.path}.`);
    default:
      return new ApiError(500, 'internal_error', 'Internal error.');
  }
}

/** Body-parser errors carry a `type`; a body that fails to decompress is a zlib error it passes on with status 400. */
function fromBodyParser(err: { type?: string; status?: number; limit?: number; code?: string; expose?: boolean }, req: Request): ApiError | undefined {
  if (err.type === undefined && err.status === 400 && err.expose === true && typeof err.code === 'string' && /^(Z_|ERR_)/.test(err.code)) {
    return new ApiError(400, 'invalid_content_encoding', `The request body does not decode as its Content-Encoding '${String(req.headers['content-encoding'] ?? '')}' says.`);
  }
  switch (err.type) {
    case 'entity.parse.failed':
      return new ApiError(400, 'invalid_json', 'The request body is not valid JSON.');
    case 'entity.too.large':
      return new ApiError(413, 'body_too_large', `The request body exceeds the limit of ${err.limit ?? 'the configured'} bytes.`);
    case 'encoding.unsupported':
    case 'charset.unsupported':
      return new ApiError(415, 'unsupported_media_type', `Unsupported body encoding for ${req.method} ${req.path}.`);
    case 'request.aborted':
      return new ApiError(400, 'invalid_request', 'The request was aborted by the client.');
    default:
      return undefined;
  }
}

const SQLSTATE: Record<string, [number, ErrorCode, string]> = {
  '23505': [409, 'conflict', 'A resource with this unique value already exists.'],
  '23503': [400, 'invalid_request', 'The request references a resource that does not exist.'],
  '23514': [400, 'invalid_request', 'The request violates a constraint.'],
  '22P02': [400, 'invalid_request', 'A value has an invalid format.'],
  '22003': [400, 'invalid_request', 'A number is out of range.'],
  // A date-time the validator passes and PostgreSQL cannot take (year 0000, an offset past 15:59).
  '22007': [400, 'invalid_request', 'A date or time has an invalid format.'],
  '22008': [400, 'invalid_request', 'A date or time is out of range.'],
  '22009': [400, 'invalid_request', 'A time zone offset is out of range.'],
  '57014': [503, 'not_ready', 'The database cancelled the statement; retry.'],
  '53300': [503, 'not_ready', 'The database has no free connections; retry.'],
  '40001': [503, 'not_ready', 'A concurrent update conflicted; retry.'],
  '40P01': [503, 'not_ready', 'A concurrent update conflicted; retry.'],
};

/**
 * The query parameter whose value PostgreSQL quotes in its message (`date/time field value out of
 * range: "0000-01-01T00:00:00Z"`), if one has exactly that value.
 */
function quotedParam(req: Request, message: string | undefined): string | null {
  const quoted = /: "([^"]*)"$/.exec(message ?? '')?.[1];
  if (quoted === undefined) return null;
  return Object.entries(req.query).find(([, value]) => value === quoted)?.[0] ?? null;
}

function fromDatabase(err: { code?: string; severity?: string; message?: string }, req: Request): ApiError | undefined {
  const mapped = typeof err.code === 'string' && typeof err.severity === 'string' ? SQLSTATE[err.code] : undefined;
  if (mapped) {
    // A data exception (class 22) is about a value the request sent: named when it can be told.
    const [status, code, detail] = mapped;
    const param = err.code!.startsWith('22') ? quotedParam(req, err.message) : null;
    return new ApiError(status, code, param ? `Invalid '${param}': ${detail.charAt(0).toLowerCase()}${detail.slice(1)}` : detail, param);
  }
  return isDatabaseUnavailable(err) ? databaseUnavailable() : undefined;
}

/**
 * Up to this many bytes of a body left unread are read (and discarded) to keep the connection alive:
 * an error is often answered before a small body has arrived, even one sent with its head.
 */
const READ_ON_BYTES = 64 * 1024;

/**
 * Whether the request announced a body that has not been read to its end and may be large: refused
 * before it was read (credentials, requests per minute, the large-body budget, a declared length
 * over a limit) or while it was read. Keeping such a connection alive means reading the rest, up to
 * the whole declared length, for a request already answered.
 */
function hasLargeUnreadBody(req: Request): boolean {
  if (req.complete || req.destroyed) return false;
  const length = req.headers['content-length'];
  return length === undefined ? req.headers['transfer-encoding'] !== undefined : Number(length) > READ_ON_BYTES;
}

/** What a known error says, without its stack. */
function errorLine(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const code = (err as { code?: unknown }).code;
  return typeof code === 'string' ? `${code}: ${err.message}` : err.message;
}

export function errorMiddleware(log: Logger): ErrorRequestHandler {
  return (err, req, res, next) => {
    // The client went away while a response was streamed to it (a download): not a failure; the
    // access log says what happened.
    if (res.headersSent && res.destroyed && (err as { code?: unknown }).code === 'ERR_STREAM_PREMATURE_CLOSE') return;
    const requestId = (req as Request & { id?: string }).id ?? '';
    let apiError: ApiError | undefined;
    const remembered = (req as Request & { [AUTH_ERROR]?: ApiError })[AUTH_ERROR];
    if (err instanceof ApiError) apiError = err;
    else if (err instanceof StorageError) apiError = apiErrorOfStorage(err);
    else if (remembered && isValidatorError(err) && (err.status === 401 || err.status === 403)) apiError = remembered;
    else if (isValidatorError(err)) apiError = fromValidator(err, req);
    else apiError = fromBodyParser(err as never, req) ?? fromDatabase(err as never, req);

    if (!apiError || apiError.status >= 500) {
      // An unknown error keeps its stack; a known one (the database away, an upstream failing) is one line.
      // A full or failing media store needs the operator: an error, not a warning.
      if (apiError) log[err instanceof StorageError ? 'error' : 'warn']({ requestId, path: req.path, code: apiError.code, err: errorLine(err) }, 'request failed');
      else log.error({ err, requestId, path: req.path }, 'request failed');
    }
    if (!apiError) apiError = new ApiError(500, 'internal_error', `Internal error. Quote request id '${requestId}' when reporting it.`);

    if (res.headersSent) {
      // A streamed response already began; the stream writer reports its own errors.
      next(err);
      return;
    }
    // The request's line says which error it was answered (its status alone does not).
    logWith(res, { errorCode: apiError.code });
    if (apiError.rateTokenBack) giveBackRateToken(res);
    // An error is about this one request: never kept by a cache (whatever the route had set).
    res.setHeader('Cache-Control', 'no-store');
    for (const [name, value] of Object.entries(apiError.headers)) res.setHeader(name, value);
    if (hasLargeUnreadBody(req)) {
      // Close the connection after the answer instead of reading the body to keep it alive.
      res.setHeader('Connection', 'close');
      lingerAfterResponse(req, res);
    }
    // Discard (never buffer) what still arrives, also of a body a parser stopped reading.
    if (!req.complete && !req.destroyed) req.resume();
    res.status(apiError.status).json(apiError.body(requestId));
  };
}
