/**
 * MiniMax's envelope and error codes (upstream-apis.md §10.4), for the Hailuo video adapter.
 *
 * MiniMax answers errors with HTTP 200 and `base_resp: {status_code ≠ 0, status_msg}`: the code
 * decides, not the HTTP status (its own clients read it so: new-api's hailuo adaptor, MiniMax-MCP,
 * MiniMax's CLI). An answer with another status and no such code (its edge's 429, a proxy's 502
 * page) is classified by the status, honouring `Retry-After`.
 *
 * The codes: MiniMax's error-code page (platform.minimax.io/docs/api-reference/errorcode: 1000,
 * 1001, 1002, 1004, 1008, 1024), new-api's constants.go (1026, 2013, 2049), MiniMax's CLI
 * (src/errors/api.ts: 1028/1030 a Token Plan's quota used up, 2061 a model the plan lacks),
 * MiniMax-MCP (2038: real-name verification missing), a live answer (1033 "system error",
 * MiniMax-AI/cli#59). A code not in the table is retried, not guessed.
 *
 * The v2 API (H3) refuses in another envelope (platform.minimaxi.com video-generation-v2-create
 * and -regeneration): `{type: "error", error: {type, message: "… (2013)", http_code: "400"},
 * request_id}`, with no `error.code`: the number is only in the message's trailing parentheses.
 */
import { ProviderError, kindOfCode, kindOfStatus, readJson, retryAfterMs, sanitizeMessage, upstreamFetch, upstreamUrl } from '../kit.ts';
import type { CodeTable, ProviderErrorKind, UpstreamAccount, UpstreamRequest } from '../kit.ts';
import type { UpstreamHeaders } from '../upstream-http.ts';

export const MINIMAX_CODES: CodeTable = {
  '1000': 'retryable',
  '1001': 'retryable',
  '1002': 'rate_limited',
  '1004': 'auth',
  // The balance is used up: nothing goes through until the account's owner tops it up.
  '1008': 'account_disabled',
  '1013': 'retryable',
  '1024': 'retryable',
  '1026': 'policy',
  '1027': 'policy',
  '1028': 'quota_exhausted',
  '1030': 'quota_exhausted',
  '1033': 'retryable',
  '2013': 'invalid_request',
  '2038': 'account_disabled',
  '2049': 'auth',
  '2061': 'model_not_open',
};

/**
 * What a code means, said before MiniMax's own words: to the operator in member health (the
 * account codes) and to the client in a failed task (a refusal of its request).
 */
const REASONS: Record<string, string> = {
  '1008': "the MiniMax account's balance is used up",
  '2038': 'the MiniMax account has not completed real-name verification',
  '2061': "the MiniMax account's plan does not include this model",
  '1026': 'MiniMax refused the prompt or an input image under its content policy',
  '1027': 'MiniMax refused the generated video under its content policy',
  '2013': 'MiniMax rejected the request as invalid',
};

/**
 * MiniMax's answer to a model name it does not have (2013 "invalid params, unknown model 'X'", or
 * a model that "does not exist" / "is not supported"). The phrase must end its clause: "the model
 * does not support this first_frame_image" is about the client's input, not the member's model.
 */
const UNKNOWN_MODEL = /unknown model|\bmodel\b[^,]*\bnot (?:exists?|found|supported)\s*(?:[,.;]|\(\d+\)|$)/i;

/** The code v2 writes at the end of its message only: "insufficient balance (1008)". */
const TRAILING_CODE = /\s*\((\d{4,5})\)\s*$/;

/**
 * v2's `error.type` words (video-generation-v2-create) by kind, for a refusal whose code is missing
 * or not in the table; each stands for the code the docs pair it with (2013, 1004, 1008, 1026,
 * 1002, 1000).
 */
const V2_TYPES: Record<string, ProviderErrorKind> = {
  bad_request_error: 'invalid_request',
  authorized_error: 'auth',
  insufficient_balance_error: 'account_disabled',
  unprocessable_entity_error: 'policy',
  rate_limit_error: 'rate_limited',
  server_error: 'retryable',
};

export interface MiniMaxAnswer {
  status: number;
  headers: UpstreamHeaders;
  /** Undefined when the answer is not a JSON object (a proxy's page). */
  body: Record<string, unknown> | undefined;
}

/** The answer's `base_resp` code and message; code 0 (or none) is no error. */
export function baseRespOf(body: Record<string, unknown> | undefined): { code: number; message: unknown } | undefined {
  const base = body?.base_resp;
  if (typeof base !== 'object' || base === null) return undefined;
  const { status_code: code, status_msg: message } = base as { status_code?: unknown; status_msg?: unknown };
  const n = typeof code === 'number' ? code : typeof code === 'string' && /^\d+$/.test(code) ? Number(code) : undefined;
  return n === undefined || n === 0 ? undefined : { code: n, message };
}

/**
 * A MiniMax code (of `base_resp`, or of a v2 refusal or task `error`) as a ProviderError;
 * `fallback`: the kind of a code the table does not know (v2 says it by `error.type`).
 */
export function minimaxErrorOf(code: number | string, message: unknown, what: string, answer: { status?: number; headers?: UpstreamHeaders } = {}, fallback: ProviderErrorKind = 'retryable'): ProviderError {
  const said = sanitizeMessage(message, `the upstream ${what} failed with code ${code}`);
  return describedError(kindOfCode(MINIMAX_CODES, code) ?? fallback, `MiniMax ${code}`, said, answer, String(code));
}

/** `said` as a ProviderError of `kind`, told under `tag` (a code's reason first when it has one). */
function describedError(kind: ProviderErrorKind, tag: string, said: string, answer: { status?: number; headers?: UpstreamHeaders }, code?: string): ProviderError {
  // The member's model map names a model MiniMax does not have: its configuration, not the request.
  if (kind === 'invalid_request' && UNKNOWN_MODEL.test(said)) kind = 'misconfigured';
  let text: string;
  if (kind === 'auth') text = `MiniMax refused the account's API key (${tag}: ${said})`;
  else if (kind === 'misconfigured') text = `MiniMax does not have the model the member asked for (${tag}: ${said})`;
  else if (code === undefined) text = `${said} (${tag})`;
  else text = REASONS[code] ? `${REASONS[code]} (${tag}: ${said})` : said;
  const wait = kind === 'rate_limited' && answer.headers ? retryAfterMs(answer.headers) : undefined;
  return new ProviderError(kind, text, { upstreamStatus: answer.status, ...(code !== undefined && { upstreamCode: code }), ...(wait !== undefined && { retryAfterMs: wait }) });
}

/**
 * A v2 `error`'s code and message: its `code` when it has one (a task's `error`), else the
 * number at the end of its message, taken off the message (a refusal: "insufficient balance (1008)").
 */
export function v2CodeOf(error: { code?: unknown; message?: unknown }): { code: string | undefined; message: unknown } {
  const { code, message } = error;
  if (typeof code === 'number' || (typeof code === 'string' && /^\d+$/.test(code))) return { code: String(code), message };
  const end = typeof message === 'string' ? TRAILING_CODE.exec(message) : null;
  return end ? { code: end[1], message: (message as string).slice(0, end.index) } : { code: undefined, message };
}

/**
 * The error an answer carries, or undefined: its `base_resp` code first; then v2's envelope
 * (`type: "error"`, at any HTTP status: a refusal answered, never a job maybe accepted; or an
 * `error` object at an error status), by its code, else its `error.type`, else its HTTP status;
 * then the HTTP status alone (an edge's 429, a proxy's 502 page).
 */
export function errorOfAnswer(answer: MiniMaxAnswer, what: string): ProviderError | undefined {
  const base = baseRespOf(answer.body);
  if (base) return minimaxErrorOf(base.code, base.message, what, answer);
  const ok = answer.status >= 200 && answer.status < 300;
  const v2 = answer.body?.error;
  if (typeof v2 === 'object' && v2 !== null && (!ok || answer.body?.type === 'error')) return v2Refusal(v2 as Record<string, unknown>, answer, what);
  if (ok) return undefined;
  const kind = kindOfStatus(answer.status);
  const wait = kind === 'rate_limited' ? retryAfterMs(answer.headers) : undefined;
  return new ProviderError(kind, `the upstream ${what} answered HTTP ${answer.status}`, { upstreamStatus: answer.status, ...(wait !== undefined && { retryAfterMs: wait }) });
}

function v2Refusal(error: Record<string, unknown>, answer: MiniMaxAnswer, what: string): ProviderError {
  const { code, message } = v2CodeOf(error);
  // The envelope's `http_code` is the status it stands for, also when it came at HTTP 200.
  const httpCode = Number(error.http_code);
  const status = answer.status >= 300 || !(httpCode >= 400 && httpCode < 600) ? answer.status : httpCode;
  // MiniMax's CLI (src/errors/api.ts) reads a 402 as a balance used up.
  const byStatus = status === 402 ? 'account_disabled' : status < 300 ? 'retryable' : kindOfStatus(status);
  const kind = (typeof error.type === 'string' ? V2_TYPES[error.type] : undefined) ?? byStatus;
  if (code !== undefined) return minimaxErrorOf(code, message, what, answer, kind);
  return describedError(kind, `HTTP ${status}`, sanitizeMessage(message, `the upstream ${what} failed`), answer);
}

export function minimaxAuth(account: UpstreamAccount): Record<string, string> {
  return { Authorization: `Bearer ${account.credentials.api_key ?? ''}` };
}

export interface MiniMaxCall {
  method: 'GET' | 'POST';
  path: string;
  /** A JSON body streamed with its length (`jsonStream`). */
  body?: { body: NonNullable<UpstreamRequest['body']>; length: number };
}

/** One call to the member's MiniMax API, its (short JSON) answer read whole. */
export async function minimaxCall(account: UpstreamAccount, call: MiniMaxCall, signal: AbortSignal, what: string): Promise<MiniMaxAnswer> {
  const headers: Record<string, string> = { ...minimaxAuth(account), Accept: 'application/json' };
  if (call.body) {
    headers['content-type'] = 'application/json';
    headers['content-length'] = String(call.body.length);
  }
  // A streamed body cannot follow a redirect; MiniMax answers where it is asked.
  const res = await upstreamFetch(upstreamUrl(account, call.path), { method: call.method, headers, body: call.body?.body, redirect: 'manual' }, signal, what);
  const json = await readJson(res);
  const body = typeof json === 'object' && json !== null && !Array.isArray(json) ? (json as Record<string, unknown>) : undefined;
  return { status: res.status, headers: res.headers, body };
}
