/**
 * OpenAI's error envelope (`{"error":{"message","type","param","code"}}`, upstream-apis.md §1.5)
 * as a classified ProviderError; shared by the images and videos adapters and by any
 * OpenAI-compatible gateway (which may answer with a bare string `error` or `message`, or HTML).
 */
import { ProviderError, type ProviderErrorKind } from '../provider-error.ts';
import { kindOfStatus, readJson, retryAfterMs, sanitizeMessage } from '../upstream-http.ts';

const POLICY_CODES = new Set(['moderation_blocked', 'content_policy_violation', 'content_filter', 'safety_violation']);

interface OpenAIErrorBody {
  error?: { message?: unknown; type?: unknown; code?: unknown; param?: unknown } | string;
  message?: unknown;
}

/** Classifies an OpenAI(-compatible) error answer: what the gateway does next depends on its kind. */
export async function openaiError(res: Response, what: string): Promise<ProviderError> {
  const body = (await readJson(res)) as OpenAIErrorBody | undefined;
  const envelope = typeof body?.error === 'object' && body.error !== null ? body.error : undefined;
  const code = typeof envelope?.code === 'string' ? envelope.code : undefined;
  const type = typeof envelope?.type === 'string' ? envelope.type : undefined;
  const rawMessage = envelope?.message ?? (typeof body?.error === 'string' ? body.error : body?.message);
  let kind: ProviderErrorKind = kindOfStatus(res.status);
  if (code === 'insufficient_quota' || type === 'insufficient_quota') kind = 'quota_exhausted';
  else if ((code && POLICY_CODES.has(code)) || type === 'image_generation_user_error') kind = 'policy';
  else if (res.headers.get('x-should-retry') === 'false' && kind === 'retryable') kind = 'invalid_request';
  // Never pass on what an auth failure said: it quotes part of the key.
  const message =
    kind === 'auth'
      ? `the upstream refused the account's credentials (HTTP ${res.status})`
      : sanitizeMessage(rawMessage, `the upstream ${what} failed with HTTP ${res.status}`);
  return new ProviderError(kind, message, { retryAfterMs: retryAfterMs(res.headers), upstreamStatus: res.status, upstreamCode: code });
}
