/**
 * Kling's envelope and error codes (upstream-apis.md §6.4, §6.6), shared by the video and image
 * adapters: every answer is `{code, message, request_id, data}`, and `code` decides, not the HTTP
 * status. `code: 0` is success whatever the status; an error code may come with HTTP 200 (a task
 * that failed Kling's risk control is answered 200 with its code, QuantumNous/new-api #3148), or
 * with the status of Kling's table (401 for 1000–1004, 429 for 1100–1102 and 1302–1304, …). An
 * answer without the envelope (a proxy's HTML page) is classified by its status alone.
 *
 * `klingCall` signs every call with the member's cached token (kling-auth.ts).
 */
import { ProviderError, asProviderError, type ProviderErrorKind } from '../provider-error.ts';
import { kindOfCode, type CodeTable } from '../kit/error-codes.ts';
import type { UpstreamAccount } from '../types.ts';
import { kindOfStatus, readJson, retryAfterMs, sanitizeMessage, upstreamFetch, upstreamUrl, type UpstreamHeaders, type UpstreamRequest } from '../upstream-http.ts';
import type { KlingTokens } from './kling-auth.ts';

/**
 * Kling's business codes (§6.6) as kinds. The account codes take the member out until an operator
 * acts (1100 account abnormal, 1101 arrears, 1102 resource pack used up or expired: HTTP 429 but not
 * transient); 1103 is the account's permission for the model (out for that model only); 1304 (the
 * gateway's IP is not on the account's whitelist) is a permission of the account like its keys.
 */
export const KLING_CODES: CodeTable = {
  '1000': 'auth',
  '1001': 'auth',
  '1002': 'auth',
  '1003': 'auth',
  '1004': 'auth',
  '1100': 'account_disabled',
  '1101': 'account_disabled',
  '1102': 'account_disabled',
  '1103': 'model_not_open',
  '1200': 'invalid_request',
  '1201': 'invalid_request',
  '1202': 'misconfigured',
  '1203': 'misconfigured',
  '1300': 'policy',
  '1301': 'policy',
  '1302': 'rate_limited',
  '1303': 'rate_limited',
  '1304': 'auth',
  '5000': 'retryable',
  '5001': 'retryable',
  '5002': 'retryable',
};

/** What the account codes mean, said to the operator in member health. */
const ACCOUNT_REASONS: Record<string, string> = {
  '1100': 'the Kling account is abnormal',
  '1101': 'the Kling account is in arrears',
  '1102': "the Kling account's resource pack is used up or expired",
  '1304': "this gateway's IP address is not on the Kling account's whitelist",
};

export interface KlingEnvelope<T> {
  code?: unknown;
  message?: unknown;
  request_id?: unknown;
  data?: T;
}

/** The envelope's code as a number, or undefined when the answer has none. */
export function codeOf(envelope: KlingEnvelope<unknown> | undefined): number | undefined {
  const code = envelope?.code;
  if (typeof code === 'number' && Number.isInteger(code)) return code;
  if (typeof code === 'string' && /^\d+$/.test(code)) return Number(code);
  return undefined;
}

/** The ProviderError of a non-zero code (the HTTP status says what the code does not know). */
export function klingErrorOf(code: number | undefined, message: unknown, httpStatus: number, headers: UpstreamHeaders | undefined, what: string): ProviderError {
  const kind: ProviderErrorKind = kindOfCode(KLING_CODES, code) ?? (httpStatus >= 300 ? kindOfStatus(httpStatus) : 'retryable');
  const said = sanitizeMessage(message, `the upstream ${what} failed${code !== undefined ? ` with code ${code}` : ` with HTTP ${httpStatus}`}`);
  const tag = code !== undefined ? `Kling ${code}` : `HTTP ${httpStatus}`;
  let text: string;
  if (kind === 'auth') {
    // Kling's own words only: they never hold the token or the keys.
    text = code === 1003 ? `Kling refused the account's token as not yet valid (${tag}); check this server's clock` : `Kling refused the account's credentials (${tag}: ${said})`;
    if (code === 1304) text = `${ACCOUNT_REASONS['1304']} (${tag})`;
  } else if (kind === 'account_disabled') text = `${ACCOUNT_REASONS[String(code)] ?? 'the Kling account cannot take work'} (${tag}: ${said})`;
  else text = said;
  const wait = kind === 'rate_limited' && headers ? retryAfterMs(headers) : undefined;
  return new ProviderError(kind, text, { ...(wait !== undefined && { retryAfterMs: wait }), upstreamStatus: httpStatus, ...(code !== undefined && { upstreamCode: String(code) }) });
}

/** A Kling answer, read whole (every answer of the API is a short JSON envelope). */
export interface KlingAnswer<T> {
  status: number;
  headers: UpstreamHeaders;
  /** Undefined when the answer is not JSON (a proxy's page). */
  body: KlingEnvelope<T> | undefined;
}

export type KlingOutcome<T> = { ok: true; data: T | undefined } | { ok: false; error: ProviderError; data: T | undefined };

/**
 * An answer as Kling means it: code 0 → its data; any other code, or an answer that is not the
 * envelope, → the classified ProviderError, with the data still there (a task that failed Kling's
 * risk control comes as code 1301 with the task in `data`).
 */
export function outcomeOf<T>(answer: KlingAnswer<T>, what: string): KlingOutcome<T> {
  const body = typeof answer.body === 'object' && answer.body !== null ? answer.body : undefined;
  const code = codeOf(body);
  if (code === 0) return { ok: true, data: body!.data };
  if (code === undefined) {
    const ok = answer.status >= 200 && answer.status < 300;
    const kind = ok ? 'retryable' : kindOfStatus(answer.status);
    const wait = kind === 'rate_limited' ? retryAfterMs(answer.headers) : undefined;
    // A 2xx took the request whatever its body says: a submitted task may be running (design §8).
    const error = new ProviderError(kind, `the upstream ${what} answered HTTP ${answer.status} without Kling's envelope`, { upstreamStatus: answer.status, ...(wait !== undefined && { retryAfterMs: wait }), maybeAccepted: ok });
    return { ok: false, error, data: undefined };
  }
  return { ok: false, error: klingErrorOf(code, body!.message, answer.status, answer.headers, what), data: body!.data };
}

export interface KlingCall {
  method: 'GET' | 'POST';
  path: string;
  /** A JSON body, made anew for each send (a streamed body is read once). */
  body?: () => { body: NonNullable<UpstreamRequest['body']>; length: number };
  timeoutMs?: number;
}

/**
 * One signed call, its answer read whole. When Kling says the token expired (1004: its clock runs
 * ahead of ours), the token is signed anew and the call sent once more.
 */
export async function klingCall<T>(tokens: KlingTokens, account: UpstreamAccount, call: KlingCall, signal: AbortSignal, what: string): Promise<KlingAnswer<T>> {
  for (let attempt = 0; ; attempt++) {
    const headers: Record<string, string> = { Authorization: `Bearer ${await tokens.token(account)}`, Accept: 'application/json' };
    let body: UpstreamRequest['body'];
    if (call.body) {
      const made = call.body();
      body = made.body;
      headers['content-type'] = 'application/json';
      headers['content-length'] = String(made.length);
    }
    // A streamed body cannot follow a redirect; Kling's API answers where it is asked.
    const res = await upstreamFetch(upstreamUrl(account, call.path), { method: call.method, headers, body, redirect: 'manual', timeoutMs: call.timeoutMs }, signal, what);
    const answer: KlingAnswer<T> = { status: res.status, headers: res.headers, body: (await readJson(res)) as KlingEnvelope<T> | undefined };
    if (attempt === 0 && answer.status === 401 && codeOf(answer.body) === 1004) {
      tokens.forget(account);
      continue;
    }
    return answer;
  }
}

/**
 * Kling says it has no such task: code 1203 in its envelope. A 404 without the envelope is not
 * Kling's answer (an edge's error or maintenance page in front of it) and says nothing of the task.
 */
export function isUnknownTask(err: ProviderError): boolean {
  return err.upstreamCode === '1203';
}

/**
 * The failure of a status call of a task Kling took. A 404 without Kling's envelope passes: the
 * task is not gone for it (isUnknownTask), and the member's address served the task's create.
 */
export function statusCallError(err: ProviderError): ProviderError {
  return err.upstreamCode === undefined && err.upstreamStatus === 404 ? err.with({ kind: 'retryable' }) : err;
}

/**
 * What a query by external_task_id found:
 *   found    the task made with that id (whatever its state: a task that failed risk control comes
 *            with its code), its Kling task id
 *   unknown  Kling says it has no such task (`isUnknownTask`)
 *   absent   Kling answered the query (code 0) without that task
 *   failed   the query itself failed (refused, rate-limited, no answer): `error` says how
 * What each means for the submit that led to the query is the caller's to decide.
 */
export type KlingLookup = { state: 'found'; taskId: string } | { state: 'unknown' | 'absent' | 'failed'; error: ProviderError };

/**
 * Where a single-task query takes the external id. Kling's documents name `task_id` a path
 * parameter and `external_task_id` the other of "two ways to query" without saying where it goes;
 * third-party clients send it as a query parameter (`GET …/text2video?external_task_id=`), and one
 * copy of the documents lists it with the path parameters. Either may be the one Kling takes.
 */
type LookupForm = 'query' | 'path';

/**
 * A lookup's failure that hides what Kling has: one in passing (429, 5xx, no answer) or the
 * member's own (its credentials, its account), which the other form would meet too. Any other
 * failure refuses the lookup as a request (1200/1201, 1202, a 404 without the envelope, a
 * redirect): that form is not one Kling takes.
 */
export function lookupBlocked(err: ProviderError): boolean {
  return err.transient || err.kind === 'auth' || err.kind === 'account_disabled' || err.kind === 'quota_exhausted' || err.kind === 'model_not_open';
}

/**
 * Looks up the task created with `externalId` under `collection` (`/v1/images/generations`,
 * `/v1/videos/<endpoint>`): first with the external id as a query parameter, then, unless that
 * found the task or was blocked (`lookupBlocked`: asked later), with it in the path. An API that
 * does not know one form answers it as something else (the list, ignoring the parameter; a task id
 * it has not got), so the more telling answer of the two stands: the task found, then a blocked
 * lookup (what it hides may be the task), then Kling's "no such task", then an answer without the
 * task, then a refusal. Throws only when `signal` ended the call (the lease lost, the worker
 * stopping): that is not the lookup's failure.
 */
export async function lookUpExternalId(tokens: KlingTokens, account: UpstreamAccount, collection: string, externalId: string, signal: AbortSignal, what: string, timeoutMs?: number): Promise<KlingLookup> {
  const byQuery = await lookUpBy('query', tokens, account, collection, externalId, signal, what, timeoutMs);
  if (rankOf(byQuery) <= 1) return byQuery;
  const inPath = await lookUpBy('path', tokens, account, collection, externalId, signal, what, timeoutMs);
  return rankOf(inPath) <= rankOf(byQuery) ? inPath : byQuery;
}

/** How much a lookup's answer tells (lower: more): found 0, blocked 1, unknown 2, absent 3, refused 4. */
function rankOf(lookup: KlingLookup): number {
  if (lookup.state === 'found') return 0;
  if (lookup.state === 'failed') return lookupBlocked(lookup.error) ? 1 : 4;
  return lookup.state === 'unknown' ? 2 : 3;
}

async function lookUpBy(form: LookupForm, tokens: KlingTokens, account: UpstreamAccount, collection: string, externalId: string, signal: AbortSignal, what: string, timeoutMs?: number): Promise<KlingLookup> {
  const path = form === 'query' ? `${collection}?external_task_id=${encodeURIComponent(externalId)}` : `${collection}/${encodeURIComponent(externalId)}`;
  let answer: KlingAnswer<{ task_id?: unknown; task_info?: { external_task_id?: unknown } }>;
  try {
    answer = await klingCall(tokens, account, { method: 'GET', path, timeoutMs }, signal, what);
  } catch (err) {
    if (signal.aborted) throw err;
    return { state: 'failed', error: asProviderError(err, `the upstream ${what} failed`) };
  }
  const outcome = outcomeOf(answer, what);
  const task = outcome.data;
  if (task?.task_info?.external_task_id === externalId && typeof task.task_id === 'string' && task.task_id !== '') return { state: 'found', taskId: task.task_id };
  if (outcome.ok) return { state: 'absent', error: new ProviderError('retryable', `the upstream ${what} answered without the task`, { upstreamStatus: answer.status }) };
  return { state: isUnknownTask(outcome.error) ? 'unknown' : 'failed', error: outcome.error };
}

/**
 * A failure once the task may exist, thrown as maybe accepted: the runner keeps the request off
 * other members, where a second task would be paid for too. A refusal of a query is no fault of
 * the client's request: retryable. `jobKept`: the task is known (its status was being asked) and
 * goes on: a later try collects it.
 */
export function possiblyAccepted(err: ProviderError, jobKept = false): ProviderError {
  const kind = err.kind === 'invalid_request' || err.kind === 'policy' || err.kind === 'failed' ? 'retryable' : err.kind;
  return err.with({ kind, maybeAccepted: true, jobKept });
}
