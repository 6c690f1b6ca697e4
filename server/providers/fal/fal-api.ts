/**
 * fal.ai's queue (upstream-apis.md §7.1, corrections §10.1), shared by the fal video and image
 * adapters. Every model on fal is one queue with the same wire; what differs per model is its input
 * and output JSON, which the catalog model's mapping says (kit/mapping.ts).
 *
 *   submit   POST {base}/{owner}/{app}[/{path}]              the mapped input → `{request_id, …, status: IN_QUEUE, queue_position}`
 *   status   GET  {base}/{owner}/{app}/requests/{id}/status  IN_QUEUE (queue_position) | IN_PROGRESS (logs) | COMPLETED (metrics)
 *   result   GET  {base}/{owner}/{app}/requests/{id}         the model's output JSON, or its error (422 `detail[]`, …)
 *   cancel   PUT  {base}/{owner}/{app}/requests/{id}/cancel  `{status: CANCELLATION_REQUESTED | ALREADY_COMPLETED | NOT_FOUND}`
 *
 * Status and result live under `owner/app` only, never the sub-path the submit went to (§10.1:
 * deeper paths answer 405); `workflows/` and `comfy/` endpoints keep their namespace (fal-js
 * `parseEndpointId`). The job id the gateway keeps is `{owner}/{app}/{request_id}`, so polls and a
 * deadline's cancel need nothing else.
 *
 * Errors: fal answers `{detail: …}`, a string or pydantic's list `[{loc, msg, type}]` (422). The
 * list is said in full to the operator (member health): with a mapping, a refused input is the
 * mapping's fault far more often than the client's, whose request the catalog already checked.
 * A `detail[].type` of `content_policy_violation` is fal's content checker: the request's fault.
 * 401/403 are the key, 404/405 the endpoint id, 429 (with Retry-After) a rate limit, 5xx retryable
 * (fal-js retries 429, 502, 503, 504; a 504 with `x-fal-request-timeout-type: user` is the request's
 * own start timeout, not retried).
 */
import { ProviderError, kindOfStatus, readJson, retryAfterMs, sanitizeMessage, upstreamFetch, upstreamUrl, type ProviderErrorKind, type UpstreamAccount, type UpstreamMapping, type UpstreamRequest, type UpstreamResponse } from '../kit.ts';

export function falAuth(account: UpstreamAccount): Record<string, string> {
  return { Authorization: `Key ${account.credentials.api_key ?? ''}` };
}

const NAMESPACES = ['workflows', 'comfy'];

/** `owner/app` (or `workflows/owner/app`) of an endpoint id: where its requests' status and result are. */
export function appOf(endpoint: string): string {
  const parts = endpoint.split('/');
  return parts.slice(0, NAMESPACES.includes(parts[0]!) ? 3 : 2).join('/');
}

/** The job id the gateway keeps: `{app}/{request_id}`. */
export function jobIdOf(endpoint: string, requestId: string): string {
  return `${appOf(endpoint)}/${requestId}`;
}

export function parseJobId(jobId: string): { app: string; requestId: string } {
  const cut = jobId.lastIndexOf('/');
  const app = jobId.slice(0, cut);
  if (cut <= 0 || !app.includes('/')) throw new ProviderError('failed', `'${jobId}' is not a fal request id`);
  return { app, requestId: jobId.slice(cut + 1) };
}

/** The model's mapping, or the member's misconfiguration (a catalog model sold on fal without one). */
export function mappingOf(job: { model: string; mapping?: UpstreamMapping }): UpstreamMapping {
  if (!job.mapping) {
    throw new ProviderError('misconfigured', `the catalog model '${job.model}' has no fal mapping, so a fal member cannot run it (set one: models set-mapping ${job.model} --provider fal --file <mapping.json>)`, { upstreamCode: 'no_mapping' });
  }
  return job.mapping;
}

export interface FalAnswer {
  status: number;
  headers: UpstreamResponse['headers'];
  body: unknown;
}

/** One call to the member's fal queue, its (short JSON) answer read whole. */
export async function falCall(
  account: UpstreamAccount,
  call: { method: 'GET' | 'POST' | 'PUT'; path: string; body?: { body: NonNullable<UpstreamRequest['body']>; length: number } },
  signal: AbortSignal,
  what: string,
): Promise<FalAnswer> {
  const headers: Record<string, string> = { ...falAuth(account), Accept: 'application/json' };
  if (call.body) {
    headers['content-type'] = 'application/json';
    headers['content-length'] = String(call.body.length);
  }
  // A streamed body cannot follow a redirect; fal answers where it is asked.
  const res = await upstreamFetch(upstreamUrl(account, call.path), { method: call.method, headers, body: call.body?.body ?? (call.method === 'PUT' ? '' : undefined), redirect: 'manual' }, signal, what);
  return { status: res.status, headers: res.headers, body: await readJson(res) };
}

/** fal's `detail` as one line: a string as it is, a pydantic list as `loc: msg` items. */
export function detailText(body: unknown): string | undefined {
  const detail = (body as { detail?: unknown } | undefined)?.detail;
  if (typeof detail === 'string') return detail;
  if (!Array.isArray(detail)) return undefined;
  const items = detail.map((d) => {
    const { loc, msg } = (d ?? {}) as { loc?: unknown; msg?: unknown };
    const where = Array.isArray(loc) ? loc.filter((p) => p !== 'body').join('.') : '';
    return `${where ? `${where}: ` : ''}${typeof msg === 'string' ? msg : 'invalid'}`;
  });
  return items.length ? items.join('; ') : undefined;
}

function detailTypes(body: unknown): string[] {
  const detail = (body as { detail?: unknown } | undefined)?.detail;
  return Array.isArray(detail) ? detail.map((d) => (d as { type?: unknown } | null)?.type).filter((t): t is string => typeof t === 'string') : [];
}

/**
 * A fal error answer as a ProviderError. `where` names the endpoint (for the operator); `what` the
 * call. A 422 (or 400) is the mapping's input refused: the member's configuration (`misconfigured`:
 * said in full in member health, the client gets a generic error), unless fal's content checker
 * refused it (`policy`).
 */
export function falError(answer: FalAnswer, what: string, where: string): ProviderError {
  const { status, headers, body } = answer;
  const said = sanitizeMessage(detailText(body), `HTTP ${status}`);
  const opts = { upstreamStatus: status, upstreamCode: headers.get('x-fal-error-type') ?? undefined };
  if (detailTypes(body).some((t) => t === 'content_policy_violation')) return new ProviderError('policy', `fal refused the request under its content policy (${said})`, opts);
  // fal's request errors (timeouts, runner failures, a cancelled request) name their type in a header: the request's end, not the member's.
  const errorType = headers.get('x-fal-error-type');
  if (errorType && status !== 429 && status !== 401 && status !== 403 && headers.get('x-fal-retryable') !== 'true') return new ProviderError('failed', `the fal request failed (${errorType}: ${said})`, opts);
  if (status === 422 || status === 400) return new ProviderError('misconfigured', `fal refused the input that the mapping made for ${where} (HTTP ${status}: ${said})`, opts);
  if (status === 504 && headers.get('x-fal-request-timeout-type') === 'user') return new ProviderError('failed', `the fal request did not start within its timeout (${said})`, opts);
  const kind: ProviderErrorKind = kindOfStatus(status);
  // fal locks an account without credit ("User is locked. Reason: Exhausted balance"): out until its owner tops it up.
  if (status === 403 && /locked|exhausted balance|balance/i.test(said)) return new ProviderError('account_disabled', `the fal account is locked (HTTP 403: ${said})`, opts);
  if (kind === 'auth') return new ProviderError('auth', `fal refused the member's API key (HTTP ${status}: ${said})`, opts);
  if (kind === 'misconfigured') return new ProviderError('misconfigured', `fal has no endpoint ${where} (HTTP ${status}: ${said})`, opts);
  if (status === 402) return new ProviderError('account_disabled', `the fal account cannot pay for requests (HTTP 402: ${said})`, opts);
  const wait = kind === 'rate_limited' ? retryAfterMs(headers) : undefined;
  return new ProviderError(kind, `the fal ${what} answered HTTP ${status} (${said})`, { ...opts, ...(wait !== undefined && { retryAfterMs: wait }) });
}
