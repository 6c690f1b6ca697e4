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
 * Results: a model's output JSON, its media as links to fal's CDN or, with `sync_mode` (on by
 * default on some endpoints), inline as data URLs: megabytes an image, read as media
 * (readJsonWithMedia), never as a short answer.
 *
 * Errors: fal answers `{detail: …}`, a string or pydantic's list `[{loc, msg, type, url?, ctx?}]`
 * (422). A list is classified by its types (`falError`): fal's content checker is the request's
 * fault, a refusal of the client's media (too small, unreadable, …) the client's, told fal's
 * words; anything else is said in full to the operator (member health): with a mapping, a refused
 * input is the mapping's fault far more often than the client's, whose request the catalog
 * already checked. 401/403 are the key, 404/405 the endpoint id, 429 (with Retry-After) a rate
 * limit, 5xx retryable (fal-js retries 429, 502, 503, 504; a 504 with
 * `x-fal-request-timeout-type: user` is the request's own start timeout, not retried). The result
 * of a request that has ended is read differently: fal's error body in it is the request's end,
 * whatever its status (`falFailure`); only a bare 429 or 5xx of fal's edge is asked again.
 */
import { ProviderError, kindOfStatus, readJson, retryAfterMs, sanitizeMessage, upstreamFetch, upstreamUrl, type ProviderErrorKind, type UpstreamAccount, type UpstreamMapping, type UpstreamRequest, type UpstreamResponse } from '../kit.ts';
import { readJsonWithMedia, type InlineMedia } from '../upstream-http.ts';

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
  /** The media of the data URLs a result held, by the token in their place in `body` (readJsonWithMedia). */
  media: ReadonlyMap<string, InlineMedia>;
}

const NO_MEDIA: ReadonlyMap<string, InlineMedia> = new Map();

/**
 * One call to the member's fal queue, its answer read whole: a short JSON answer, or with
 * `read: 'media'` a result whose media may be inline (a 2xx answer; an error answer is short).
 */
export async function falCall(
  account: UpstreamAccount,
  call: { method: 'GET' | 'POST' | 'PUT'; path: string; body?: { body: NonNullable<UpstreamRequest['body']>; length: number }; headers?: Record<string, string> },
  signal: AbortSignal,
  what: string,
  read: 'json' | 'media' = 'json',
): Promise<FalAnswer> {
  const headers: Record<string, string> = { ...falAuth(account), Accept: 'application/json', ...call.headers };
  if (call.body) {
    headers['content-type'] = 'application/json';
    headers['content-length'] = String(call.body.length);
  }
  // A streamed body cannot follow a redirect; fal answers where it is asked.
  const res = await upstreamFetch(upstreamUrl(account, call.path), { method: call.method, headers, body: call.body?.body ?? (call.method === 'PUT' ? '' : undefined), redirect: 'manual' }, signal, what);
  if (read === 'media' && res.ok) return { status: res.status, headers: res.headers, ...(await readJsonWithMedia(res, what)) };
  return { status: res.status, headers: res.headers, body: await readJson(res), media: NO_MEDIA };
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

/** The items of a pydantic `detail` list (none for a string or anything else). */
function detailItems(body: unknown): { type?: unknown; msg?: unknown }[] {
  const detail = (body as { detail?: unknown } | undefined)?.detail;
  return Array.isArray(detail) ? detail.map((d) => (d && typeof d === 'object' ? (d as { type?: unknown; msg?: unknown }) : {})) : [];
}

/**
 * fal's model error types about the content of an input (an image, a video, an audio, an
 * archive), not its place or shape in the request: what the client sent, which the catalog's
 * rules cannot see (pixels, duration, format, a face). Checked against fal's "Model Errors" page
 * (docs.fal.ai/errors, fal.ai/docs/documentation/model-apis/errors; its copy of 2025-10-27 lists
 * internal_server_error, generation_timeout, downstream_service_error,
 * downstream_service_unavailable, content_policy_violation, image_too_small, image_too_large,
 * image_load_error, file_download_error, face_detection_error, file_too_large, greater_than,
 * greater_than_equal, less_than, less_than_equal, multiple_of, sequence_too_short,
 * sequence_too_long, one_of, feature_not_supported, invalid_archive,
 * archive_file_count_below_minimum, archive_file_count_exceeds_maximum, audio_duration_too_long,
 * audio_duration_too_short, unsupported_audio_format, unsupported_image_format,
 * unsupported_video_format, video_duration_too_long, video_duration_too_short). Not here, so the
 * operator's: the schema types (greater_than…, one_of, sequence_*, feature_not_supported, and
 * pydantic's missing, enum, …: the mapping's values), `file_download_error` (fal could not fetch
 * the signed URL the gateway gave it: PUBLIC_BASE_URL, or the media store), and any type not listed.
 */
const INPUT_CONTENT_TYPES: ReadonlySet<string> = new Set([
  'image_too_small',
  'image_too_large',
  'image_load_error',
  'face_detection_error',
  'file_too_large',
  'invalid_archive',
  'archive_file_count_below_minimum',
  'archive_file_count_exceeds_maximum',
  'audio_duration_too_long',
  'audio_duration_too_short',
  'video_duration_too_long',
  'video_duration_too_short',
  'unsupported_audio_format',
  'unsupported_image_format',
  'unsupported_video_format',
]);

/**
 * A fal error answer as a ProviderError. `where` names the endpoint (for the operator); `what` the
 * call. fal's content checker refusing the request is `policy`; a refusal whose every item is
 * about the client's media is the client's (`invalid_request`, with fal's messages: they say what
 * to change, "Minimum dimensions are 300x300 pixels"); any other 422 (or 400) is the mapping's
 * input refused: the member's configuration (`misconfigured`: said in full in member health, the
 * client gets a generic error).
 */
export function falError(answer: Pick<FalAnswer, 'status' | 'headers' | 'body'>, what: string, where: string): ProviderError {
  const { status, headers, body } = answer;
  const said = sanitizeMessage(detailText(body), `HTTP ${status}`);
  const opts = { upstreamStatus: status, upstreamCode: headers.get('x-fal-error-type') ?? undefined };
  const items = detailItems(body);
  if (items.some((d) => d.type === 'content_policy_violation')) return new ProviderError('policy', `fal refused the request under its content policy (${said})`, opts);
  if (items.length > 0 && items.every((d) => typeof d.type === 'string' && INPUT_CONTENT_TYPES.has(d.type))) {
    // fal's own words, without the field: `loc` names the mapping's field (`image_url`), not the client's (`firstFrame`).
    const msgs = items.map((d) => (typeof d.msg === 'string' ? d.msg.trim() : '')).filter((m) => m !== '');
    return new ProviderError('invalid_request', sanitizeMessage(msgs.join('; '), 'fal could not use an input of the request'), { upstreamStatus: status, upstreamCode: String(items[0]!.type) });
  }
  // A partner service fal relies on failed: neither the request's fault nor the member's.
  if (items.length > 0 && items.every((d) => d.type === 'downstream_service_error')) {
    const kind = headers.get('x-fal-retryable') === 'true' ? 'retryable' : 'failed';
    return new ProviderError(kind, `a service fal relies on failed (${said})`, { upstreamStatus: status, upstreamCode: 'downstream_service_error' });
  }
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

/**
 * The failure that the result of a finished request answers, or undefined for a bare error answer
 * (fal's edge failing, a rate limit: a read that may pass). fal's own error body says the request
 * ended: a model error's typed `detail[]` with `X-Fal-Retryable` (500 internal_server_error, 504
 * generation_timeout, 500 downstream_service_unavailable: docs.fal.ai/errors), a request error's
 * `error_type` / `X-Fal-Error-Type` (503 runner_disconnected, …). Such a result answers the same
 * every time it is read, whatever its status and whether fal says a new request may fare better
 * (`X-Fal-Retryable: true`): reading it again until the task's deadline would only lose fal's reason.
 */
export function falFailure(answer: Pick<FalAnswer, 'status' | 'headers' | 'body'>): ProviderError | undefined {
  const { status, headers, body } = answer;
  if (status === 429) return undefined;
  const typed = detailItems(body).find((d) => typeof d.type === 'string')?.type as string | undefined;
  const bodyType = (body as { error_type?: unknown } | undefined)?.error_type;
  const type = typed ?? (typeof bodyType === 'string' ? bodyType : undefined) ?? headers.get('x-fal-error-type') ?? undefined;
  if (type === undefined && headers.get('x-fal-retryable') !== 'false') return undefined;
  const said = sanitizeMessage(detailText(body), `HTTP ${status}`);
  return new ProviderError('failed', `the fal request failed (${type ? `${type}: ` : ''}${said})`, { upstreamStatus: status, upstreamCode: type });
}
