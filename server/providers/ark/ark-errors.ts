/**
 * ModelArk's errors (upstream-apis.md §5.3) as classified ProviderErrors, for the Seedream and
 * Seedance adapters. The envelope is OpenAI-like, `{"error":{"code","message","param","type"}}`, and
 * the `code` says more than the HTTP status: a 404 is a wrong model (`InvalidEndpointOrModel.NotFound`)
 * or a model the account has not activated (`ModelNotOpen`), a 403 an overdue account. Ark documents
 * no rate-limit headers (its SDK reads none), so a 429 cools the member by the pool's own backoff
 * unless a proxy in front of Ark sent a Retry-After, which is honoured.
 *
 * Beyond §5.3, codes of Volcengine's Ark error-code table (https://www.volcengine.com/docs/82379/1299023,
 * "推理错误码"), quoted where they are classified below.
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
  // 429 QuotaExceeded has three meanings in the table: the default is the common one, a wait (see
  // quotaExceededKind for the other two).
  QuotaExceeded: 'rate_limited',
  // 429 "Your account [%s] has reached the set inference limit for the [%s] model, and the model
  // service has been paused. To continue using this model, please visit the Model Activation page
  // to adjust or close the "Safe Experience Mode"": one model, until its owner changes the limit —
  // no wait ends it, and the member's other models keep working.
  SetLimitExceeded: 'model_not_open',
  // 403 "Operation is denied because the model service is unavailable, please go to the Volcano Ark
  // console activation management page to activate the corresponding model service" (模型服务不可用):
  // ModelNotOpen's remedy, so one model, not the member's credentials.
  'OperationDenied.ServiceNotOpen': 'model_not_open',
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
  // 400 "Internal error.ARKRequest ID:…;CSDRequestId:…;CSDcode:{};CSDmessage:{}", 火山引擎风险识别产品请求失败
  // (Volcengine's risk-detection service failed): Ark's own fault under a 400, not a refusal of the
  // request; another try, or another member, may pass.
  ContentSecurityDetectionError: 'retryable',
};

/**
 * The kind of a 429 QuotaExceeded, by its message (the code is the same for all three rows of the
 * table):
 *   "Your account [%s] has exhausted its free trial quota for the [%s] model" — one model; the
 *     table's remedy is ModelNotOpen's (activate the model service in the console), so the member
 *     leaves that model until an admin changes it, and keeps its other models;
 *   "You have exceeded the 5-hour/weekly/monthly usage quota. It will reset at {{reset_time}}" — the
 *     whole account for hours or more: quota_exhausted (the member's longer cooldown);
 *   "The request has exceeded the quota" (当前账号处于排队中状态的任务数已超过限制，请稍后重试: too many
 *     queued tasks, retry later), or any other wording — a wait: rate_limited, the pool's backoff.
 */
function quotaExceededKind(message: unknown): ProviderErrorKind {
  const text = typeof message === 'string' ? message : '';
  if (/free trial quota/i.test(text)) return 'model_not_open';
  if (/usage quota/i.test(text)) return 'quota_exhausted';
  return 'rate_limited';
}

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
  let kind: ProviderErrorKind = code === 'QuotaExceeded' ? quotaExceededKind(error?.message) : (kindOfCode(ARK_CODES, code) ?? (status === undefined ? 'retryable' : kindOfStatus(status)));
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

