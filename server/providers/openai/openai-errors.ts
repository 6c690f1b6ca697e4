/**
 * OpenAI's error envelope (`{"error":{"message","type","param","code"}}`, upstream-apis.md §1.5)
 * as a classified ProviderError; shared by the images and videos adapters and by any
 * OpenAI-compatible gateway (which may answer with a bare string `error` or `message`, or HTML).
 */
import { ProviderError, type ProviderErrorKind } from '../provider-error.ts';
import { kindOfStatus, readJson, retryAfterMs, sanitizeMessage, type UpstreamHeaders, type UpstreamResponse } from '../upstream-http.ts';

const POLICY_CODES = new Set(['moderation_blocked', 'content_policy_violation', 'content_filter', 'safety_violation']);

interface OpenAIErrorBody {
  error?: { message?: unknown; type?: unknown; code?: unknown; param?: unknown } | string;
  message?: unknown;
}

/** Classifies an OpenAI(-compatible) error answer: what the gateway does next depends on its kind. */
export async function openaiError(res: UpstreamResponse, what: string): Promise<ProviderError> {
  return openaiErrorOf(await readJson(res), what, { status: res.status, headers: res.headers });
}

/**
 * The same classification for an error body however it arrived: an HTTP answer (`status`, `headers`)
 * or a stream frame (`event: error`, or a data JSON with `error`, §1.4), which has no status of its
 * own. Without a status the code and type decide; what they do not explain counts as retryable (a
 * stream that broke off after the upstream accepted the request is the upstream's failure).
 */
export function openaiErrorOf(body: unknown, what: string, answer: { status?: number; headers?: UpstreamHeaders } = {}): ProviderError {
  const parsed = (typeof body === 'object' && body !== null ? body : undefined) as OpenAIErrorBody | undefined;
  const envelope = typeof parsed?.error === 'object' && parsed.error !== null ? parsed.error : undefined;
  const code = typeof envelope?.code === 'string' ? envelope.code : undefined;
  const type = typeof envelope?.type === 'string' ? envelope.type : undefined;
  const rawMessage = envelope?.message ?? (typeof parsed?.error === 'string' ? parsed.error : parsed?.message);
  const { status, headers } = answer;
  let kind: ProviderErrorKind = status === undefined ? kindOfCode(code, type) : kindOfStatus(status);
  // The account's spending: a 429 `insufficient_quota`, or a 400 `billing_hard_limit_reached`
  // (type `invalid_request_error`, but nothing the client sent: the owner's monthly limit).
  if (code === 'insufficient_quota' || type === 'insufficient_quota' || code === 'billing_hard_limit_reached') kind = 'quota_exhausted';
  // "Your account is not active, please check your billing details": only its owner can change that.
  else if (code === 'billing_not_active' || type === 'billing_not_active') kind = 'account_disabled';
  else if ((code && POLICY_CODES.has(code)) || type === 'image_generation_user_error') kind = 'policy';
  // `x-should-retry` overrides the status, as in the SDK (§1.5): false makes a 5xx final (still
  // the upstream's failure, never the client's), true makes a refusal worth another try (another
  // member, or later).
  else if (headers?.get('x-should-retry') === 'false' && kind === 'retryable') kind = 'failed';
  else if (headers?.get('x-should-retry') === 'true' && kind === 'invalid_request') kind = 'retryable';
  // The model id comes from the member's model map, not from the client: refusing it is the
  // member's configuration (as a 404 for an unknown model or path is).
  else if (kind === 'invalid_request' && envelope?.param === 'model') kind = 'misconfigured';
  const http = status === undefined ? '' : ` (HTTP ${status})`;
  // Never pass on what an auth failure said: it quotes part of the key.
  const message =
    kind === 'auth'
      ? `the upstream refused the account's credentials${http}`
      : sanitizeMessage(rawMessage, status === undefined ? `the upstream ${what} failed` : `the upstream ${what} failed with HTTP ${status}`);
  return new ProviderError(kind, message, { retryAfterMs: headers ? retryAfterMs(headers) : undefined, upstreamStatus: status, upstreamCode: code });
}

/** The kind an error code or type means when no HTTP status says more (a stream error frame). */
function kindOfCode(code: string | undefined, type: string | undefined): ProviderErrorKind {
  if (code === 'invalid_api_key' || type === 'authentication_error' || type === 'permission_error') return 'auth';
  if (code === 'rate_limit_exceeded' || type === 'requests' || type === 'tokens') return 'rate_limited';
  if (type === 'invalid_request_error') return 'invalid_request';
  return 'retryable';
}
