/**
 * Google's error envelope (google.rpc.Status as JSON, upstream-apis.md §3.6) as a classified
 * ProviderError; shared by the Gemini image and Veo adapters.
 *
 *   {"error":{"code":429,"message":"…","status":"RESOURCE_EXHAUSTED","details":[
 *     {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"…PerDay…"}]},
 *     {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"58s"}]}}
 *
 * The rate-limit signal is `RetryInfo.retryDelay` in the body, not a Retry-After header (read both).
 * A `quotaId` with `PerDay` is a daily quota: the member cools down for at least an hour
 * (`quota_exhausted`) instead of the per-minute wait (`rate_limited`); so does a project whose
 * prepaid credit is used up (402, or 429 "prepayment credits are depleted"). An invalid API key
 * comes as 400 INVALID_ARGUMENT with reason API_KEY_INVALID: that is a credential error, not a bad
 * request. 400 FAILED_PRECONDITION (billing not enabled, the region or the model not open to the
 * project) is the account's state (`account_disabled`), not the client's request.
 */
import { ProviderError, type ProviderErrorKind } from '../provider-error.ts';
import { kindOfStatus, readJson, retryAfterMs, sanitizeMessage, type UpstreamHeaders, type UpstreamResponse } from '../upstream-http.ts';

/** Least cooldown of a member whose daily quota is used up. */
export const DAILY_QUOTA_COOLDOWN_MS = 60 * 60_000;

interface GoogleDetail {
  '@type'?: unknown;
  retryDelay?: unknown;
  reason?: unknown;
  violations?: { quotaId?: unknown }[];
}
interface GoogleStatus {
  code?: unknown;
  message?: unknown;
  status?: unknown;
  details?: GoogleDetail[];
}

/** `"58s"`, `"1.5s"` (a protobuf Duration in JSON) in milliseconds. */
export function durationMs(value: unknown): number | undefined {
  if (typeof value !== 'string') return undefined;
  const m = /^(\d+(?:\.\d+)?)s$/.exec(value.trim());
  return m ? Math.round(Number(m[1]) * 1000) : undefined;
}

/** Classifies a Google error status; `httpStatus` when it came as an HTTP answer. */
export function googleErrorOf(error: GoogleStatus | undefined, what: string, httpStatus?: number, headers?: UpstreamHeaders): ProviderError {
  const status = typeof error?.status === 'string' ? error.status : undefined;
  const details = Array.isArray(error?.details) ? error.details : [];
  const typeOf = (d: GoogleDetail) => (typeof d['@type'] === 'string' ? d['@type'] : '');
  const retryDelay = durationMs(details.find((d) => typeOf(d).endsWith('google.rpc.RetryInfo'))?.retryDelay);
  const quotaIds = details.filter((d) => typeOf(d).endsWith('google.rpc.QuotaFailure')).flatMap((d) => (d.violations ?? []).map((v) => String(v.quotaId ?? '')));
  const keyInvalid = details.some((d) => d.reason === 'API_KEY_INVALID') || /api key not valid/i.test(String(error?.message ?? ''));
  const code = httpStatus ?? (typeof error?.code === 'number' ? error.code : undefined);
  let kind: ProviderErrorKind = code === undefined ? 'retryable' : kindOfStatus(code);
  let wait = retryDelay ?? (headers ? retryAfterMs(headers) : undefined);
  if (keyInvalid || status === 'UNAUTHENTICATED' || status === 'PERMISSION_DENIED') kind = 'auth';
  else if (code === 402 || /prepayment credits are depleted/i.test(String(error?.message ?? ''))) {
    // The project's prepaid credit is used up (429 RESOURCE_EXHAUSTED "Your prepayment credits are
    // depleted", 402 since Google's change of 2026): its owner must top it up, not a short wait.
    kind = 'quota_exhausted';
    wait = Math.max(wait ?? 0, DAILY_QUOTA_COOLDOWN_MS);
  } else if (status === 'RESOURCE_EXHAUSTED' || code === 429) {
    if (quotaIds.some((id) => /PerDay/i.test(id))) {
      kind = 'quota_exhausted';
      wait = Math.max(wait ?? 0, DAILY_QUOTA_COOLDOWN_MS);
    } else kind = 'rate_limited';
  } else if (status === 'NOT_FOUND') kind = 'misconfigured';
  else if (status === 'INVALID_ARGUMENT') kind = 'invalid_request';
  // The project's state, not the request: "free tier is not available in your country, please
  // enable billing", a model behind an allowlist or an organization policy. Another member may serve it.
  else if (status === 'FAILED_PRECONDITION') kind = 'account_disabled';
  else if (status === 'UNAVAILABLE' || status === 'INTERNAL' || status === 'DEADLINE_EXCEEDED') kind = 'retryable';
  const message =
    kind === 'auth'
      ? `the upstream refused the account's credentials (${status ?? `HTTP ${code}`})`
      : sanitizeMessage(error?.message, `the upstream ${what} failed${code ? ` with ${status ?? `HTTP ${code}`}` : ''}`);
  return new ProviderError(kind, message, { ...(wait !== undefined && { retryAfterMs: wait }), ...(code !== undefined && { upstreamStatus: code }), ...(status && { upstreamCode: status }) });
}

/** Classifies an error answer of a Gemini API call. */
export async function googleError(res: UpstreamResponse, what: string): Promise<ProviderError> {
  const body = (await readJson(res)) as { error?: GoogleStatus } | undefined;
  return googleErrorOf(body?.error, what, res.status, res.headers);
}
