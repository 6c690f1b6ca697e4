/**
 * ModelArk's errors (upstream-apis.md §5.3) as classified ProviderErrors, for the Seedream and
 * Seedance adapters. The envelope is OpenAI-like, `{"error":{"code","message","param","type"}}`, and
 * the `code` says more than the HTTP status: a 404 is a wrong model (`InvalidEndpointOrModel.NotFound`)
 * or a model the account has not activated (`ModelNotOpen`), a 403 an overdue account. Ark documents
 * no rate-limit headers (its SDK reads none), so a 429 cools the member by the pool's own backoff
 * unless a proxy in front of Ark sent a Retry-After, which is honoured.
 */
import { ProviderError, kindOfCode, kindOfStatus, readJson, retryAfterMs, sanitizeMessage, type CodeTable, type ProviderErrorKind, type UpstreamResponse } from '../kit.ts';
import type { UpstreamHeaders } from '../upstream-http.ts';

/** Content-policy codes, each with its dotted reasons (`InputImageSensitiveContentDetected.PrivacyInformation`). */
const SENSITIVE = ['SensitiveContentDetected', 'InputTextSensitiveContentDetected', 'InputImageSensitiveContentDetected', 'InputVideoSensitiveContentDetected', 'InputAudioSensitiveContentDetected', 'OutputTextSensitiveContentDetected', 'OutputImageSensitiveContentDetected', 'OutputVideoSensitiveContentDetected', 'OutputAudioSensitiveContentDetected',
  // The risk-control family of Volcengine's general error-code table (400): the same refusal under
  // another name. Without them, such a code in a per-image error (no HTTP status) would be retried.
  'InputTextRiskDetection', 'InputImageRiskDetection', 'OutputTextRiskDetection', 'OutputImageRiskDetection'];

/** Ark's codes (§5.3, §10.3) as kinds; `*` matches the code itself and any continuation. */
export const ARK_CODES: CodeTable = {
  // The account has not activated the model: only its owner can (§10.3); other models keep working.
  ModelNotOpen: 'model_not_open',
  AuthenticationError: 'auth',
  'AccessDenied*': 'auth',
  AccountOverdueError: 'account_disabled',
  'OperationDenied.ServiceOverdue': 'account_disabled',
  'RateLimitExceeded*': 'rate_limited',
  ModelAccountRpmRateLimitExceeded: 'rate_limited',
  ModelAccountTpmRateLimitExceeded: 'rate_limited',
  ModelAccountIpmRateLimitExceeded: 'rate_limited',
  AccountRateLimitExceeded: 'rate_limited',
  ServerOverloaded: 'rate_limited',
  RequestBurstTooFast: 'rate_limited',
  InflightBatchsizeExceeded: 'rate_limited',
  QuotaExceeded: 'quota_exhausted',
  ...Object.fromEntries(SENSITIVE.map((code) => [`${code}*`, 'policy' as const])),
  'InvalidParameter*': 'invalid_request',
  'MissingParameter*': 'invalid_request',
  // The member's model map names a model or endpoint this base URL does not serve.
  'InvalidEndpointOrModel*': 'misconfigured',
  // 400 "the endpoint is closed or temporarily unavailable: retry later or ask its owner" (the
  // error-code table): the member's endpoint, not the request. Another member may serve it.
  'InvalidEndpoint.ClosedEndpoint': 'misconfigured',
  UnsupportedModel: 'misconfigured',
  ResourceNotFound: 'misconfigured',
  InternalServiceError: 'retryable',
  ServiceUnavailable: 'retryable',
};

export interface ArkErrorBody {
  code?: unknown;
  message?: unknown;
  param?: unknown;
  type?: unknown;
}

/**
 * Classifies an Ark error, as an HTTP answer (`status`, `headers`) or without one (an error item of
 * `data[]`, a failed stream event): the code decides, then the status; what neither explains is
 * retryable. A refusal of the `model` parameter is the member's configuration (its model map), not
 * the client's request.
 */
export function arkErrorOf(error: ArkErrorBody | undefined, what: string, answer: { status?: number; headers?: UpstreamHeaders } = {}): ProviderError {
  const code = typeof error?.code === 'string' && error.code !== '' ? error.code : undefined;
  const { status, headers } = answer;
  let kind: ProviderErrorKind = kindOfCode(ARK_CODES, code) ?? (status === undefined ? 'retryable' : kindOfStatus(status));
  if (kind === 'invalid_request' && error?.param === 'model') kind = 'misconfigured';
  const http = status === undefined ? '' : `HTTP ${status}`;
  const said = [http, code].filter(Boolean).join(' ');
  // Never pass on what an auth failure said (it may quote the key); the rest is sanitized.
  const message =
    kind === 'auth'
      ? `the upstream refused the account's credentials${said ? ` (${said})` : ''}`
      : sanitizeMessage(error?.message, `the upstream ${what} failed${said ? ` with ${said}` : ''}`);
  return new ProviderError(kind, message, { retryAfterMs: headers ? retryAfterMs(headers) : undefined, upstreamStatus: status, upstreamCode: code });
}

/** Classifies an error answer of an Ark call. */
export async function arkError(res: UpstreamResponse, what: string): Promise<ProviderError> {
  const body = (await readJson(res)) as { error?: ArkErrorBody } | undefined;
  return arkErrorOf(typeof body?.error === 'object' && body.error !== null ? body.error : undefined, what, { status: res.status, headers: res.headers });
}

