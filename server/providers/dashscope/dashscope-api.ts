/**
 * Alibaba Cloud Model Studio's DashScope API as the `dashscope` adapter speaks it (upstream-apis.md
 * §10.5): a member's endpoint and options, and DashScope's errors as classified ProviderErrors.
 *
 * The member's `base_url` is a region's host — Singapore `https://dashscope-intl.aliyuncs.com` (the
 * default), Beijing `https://dashscope.aliyuncs.com`, US `https://dashscope-us.aliyuncs.com`, or a
 * workspace host `https://{WorkspaceId}.{ap-southeast-1|cn-beijing}.maas.aliyuncs.com` — with or
 * without the SDKs' `/api/v1`. Key, region and model must match: a key works only at the host of the
 * region whose console issued it, and each region serves its own models. Its options ride in the
 * same URL's query (the house's convention, as Ark's `?watermark=true`):
 *
 *   inline_media=true   input images go as base64 data URLs where the body takes them (the legacy
 *                       `img_url`, `first_frame_url`, `last_frame_url`) instead of signed Mediagate
 *                       URLs DashScope downloads: for a gateway DashScope cannot reach
 *   watermark=true      DashScope's "AI生成" mark (sent `false` otherwise: HappyHorse's default is on)
 *
 * Errors are `{request_id, code, message}` with an HTTP status; the code decides (one table), then
 * the status. DashScope sends no Retry-After (its SDKs read none); one a proxy adds is honoured.
 */
import { ProviderError, kindOfCode, kindOfStatus, readJson, retryAfterMs, sanitizeMessage, upstreamUrl, type CodeTable, type ProviderErrorKind, type UpstreamAccount, type UpstreamResponse } from '../kit.ts';
import type { UpstreamHeaders } from '../upstream-http.ts';

export interface DashScopeEndpoint {
  /** The member's host (and any path before `/api/v1`), without options. */
  baseUrl: string | null;
  inlineMedia: boolean;
  watermark: boolean;
}

export function dashscopeEndpoint(account: UpstreamAccount): DashScopeEndpoint {
  if (account.baseUrl === null) return { baseUrl: null, inlineMedia: false, watermark: false };
  const url = new URL(account.baseUrl);
  const flag = (name: string) => url.searchParams.get(name) === 'true';
  const endpoint = { inlineMedia: flag('inline_media'), watermark: flag('watermark') };
  url.search = '';
  // The SDKs' base (`…/api/v1`) works as well as the host.
  url.pathname = url.pathname.replace(/\/+$/, '').replace(/\/api\/v1$/, '');
  return { baseUrl: url.toString(), ...endpoint };
}

/** `path` (from `/api/v1/…`) on the member's host. */
export function dashscopeUrl(account: UpstreamAccount, path: string): string {
  return upstreamUrl({ ...account, baseUrl: dashscopeEndpoint(account).baseUrl }, path);
}

/** The origin the member's key belongs to (downloads send it nowhere else). */
export function dashscopeOrigin(account: UpstreamAccount): string {
  return new URL(dashscopeUrl(account, '/')).origin;
}

export function dashscopeAuth(account: UpstreamAccount): Record<string, string> {
  return { Authorization: `Bearer ${account.credentials.api_key ?? ''}` };
}

/** The region a host belongs to, in words an operator recognizes. */
export function regionOf(account: UpstreamAccount): string {
  const host = new URL(dashscopeUrl(account, '/')).host;
  if (host === 'dashscope.aliyuncs.com' || host.endsWith('.cn-beijing.maas.aliyuncs.com')) return `China (Beijing), ${host}`;
  if (host === 'dashscope-intl.aliyuncs.com' || host.endsWith('.ap-southeast-1.maas.aliyuncs.com')) return `Singapore, ${host}`;
  if (host === 'dashscope-us.aliyuncs.com') return `US (Virginia), ${host}`;
  return `the region of ${host}`;
}

/**
 * DashScope's codes (Model Studio's error-code table) as kinds; `*` matches the code and its dotted
 * continuations. What is left out is decided by the HTTP status (InternalError 500, ModelUnavailable
 * 503, RequestTimeOut 408: retryable; BadRequest.* 400: the request).
 */
export const DASHSCOPE_CODES: CodeTable = {
  InvalidApiKey: 'auth',
  AccessDenied: 'auth',
  'Workspace.AccessDenied': 'auth',
  WorkSpaceNotFound: 'auth',
  // The account may not use this model (not activated or purchased in its console).
  'Model.AccessDenied': 'model_not_open',
  'AccessDenied.Unpurchased': 'model_not_open',
  CommodityNotPurchased: 'model_not_open',
  ModelNotFound: 'misconfigured',
  // Billing: only the account's owner can change it.
  Arrearage: 'account_disabled',
  PrepaidBillOverdue: 'account_disabled',
  PostpaidBillOverdue: 'account_disabled',
  'AllocationQuota.FreeTierOnly': 'account_disabled',
  'Throttling*': 'rate_limited',
  LimitRequests: 'rate_limited',
  // "Allocated quota exceeded": a quota of the period, not a burst.
  'Throttling.AllocationQuota': 'quota_exhausted',
  'DataInspectionFailed*': 'policy',
  data_inspection_failed: 'policy',
  IPInfringementSuspect: 'policy',
  FaqRuleBlocked: 'policy',
  CustomRoleBlocked: 'policy',
  // `InvalidParameter.DataInspection` among them: the table's "media format is not supported or
  // incorrect", an input the client sent — unless its message says the download failed (`mediaDownloadFailed`).
  'InvalidParameter*': 'invalid_request',
  'BadRequest.InputDownloadFailed': 'misconfigured',
  UnsupportedOperation: 'invalid_request',
};

/** What the account codes mean, said to the operator in member health. */
const ACCOUNT_REASONS: Record<string, string> = {
  Arrearage: 'the Alibaba Cloud account is in arrears (overdue payment)',
  PrepaidBillOverdue: "the Alibaba Cloud account's prepaid bill is overdue",
  PostpaidBillOverdue: "the Alibaba Cloud account's postpaid bill is overdue",
  'AllocationQuota.FreeTierOnly': "the account's free quota is used up and it is set to use the free tier only",
};

/**
 * `InvalidParameter.DataInspection` means what its message says (Alibaba's status-code table: "the
 * media format is not supported or incorrect", meaning varying with the message). Only the messages
 * about fetching the media — "Unable to download the media resource…", "Download the media resource
 * timed out…", "Failed to download multimodal content.", "Failed to find the requested media
 * resource…", "Don't have authorization to access the media resource…" — are about reaching this
 * gateway's signed URLs: the member's setup (see `inline_media`). The others ("The media format is
 * not supported or incorrect…", "Failed to decode the image…", "The image size is not supported…")
 * are about the image the client sent, and stay the request's.
 */
function mediaDownloadFailed(code: string | undefined, said: string): boolean {
  return code === 'BadRequest.InputDownloadFailed' || (code === 'InvalidParameter.DataInspection' && /download|timed out|timeout|media resource/i.test(said));
}

export interface DashScopeErrorBody {
  code?: unknown;
  message?: unknown;
}

export interface ErrorContext {
  /** The HTTP answer (absent: a failed task's error). */
  status?: number;
  headers?: UpstreamHeaders;
  /** The model asked for, for messages about it. */
  model?: string;
}

/**
 * Classifies a DashScope error: the code decides, then the status; what neither explains is
 * retryable. An unknown model is DashScope's InvalidParameter "Model not exist." (400, or 404 in some
 * reports): the member's region does not serve it, which member health says in those words.
 */
export function dashscopeErrorOf(account: UpstreamAccount, error: DashScopeErrorBody | undefined, what: string, ctx: ErrorContext = {}): ProviderError {
  const code = typeof error?.code === 'string' && error.code !== '' ? error.code : undefined;
  const { status, headers } = ctx;
  const said = sanitizeMessage(error?.message, '');
  const tag = [status !== undefined && `HTTP ${status}`, code].filter(Boolean).join(' ');
  const opts = (kind: ProviderErrorKind) => {
    const wait = kind === 'rate_limited' || kind === 'quota_exhausted' ? (headers ? retryAfterMs(headers) : undefined) : undefined;
    return { ...(wait !== undefined && { retryAfterMs: wait }), upstreamStatus: status, upstreamCode: code };
  };
  if (/^model not exist/i.test(said) && (code === undefined || code.startsWith('InvalidParameter') || code === 'ModelNotFound')) {
    const model = ctx.model ? `'${ctx.model}'` : 'the model';
    return new ProviderError('misconfigured', `DashScope has no model ${model} in ${regionOf(account)} (${tag}: ${said}); models, API keys and base URLs are per region: serve it from a member of a region that has it, or fix the member's model map`, opts('misconfigured'));
  }
  // An unknown code in a 2xx answer (a proxy's habit) is no verdict on the request: that status says
  // nothing of the error (kindOfStatus(200) would blame the request), like a failed task's, which has none.
  const statusSaysNothing = status === undefined || (status >= 200 && status < 300);
  const kind: ProviderErrorKind = mediaDownloadFailed(code, said) ? 'misconfigured' : (kindOfCode(DASHSCOPE_CODES, code) ?? (statusSaysNothing ? 'retryable' : kindOfStatus(status)));
  const reason = said || `the upstream ${what} failed${tag ? ` with ${tag}` : ''}`;
  let message: string;
  switch (kind) {
    case 'auth':
      // DashScope's own words only (they never quote the key); a key of another region is refused as invalid.
      message =
        code === 'InvalidApiKey'
          ? `DashScope refused the member's API key (${tag}: ${said || 'invalid'}); a key works only in the region whose console issued it: check that the key belongs to ${regionOf(account)}`
          : `DashScope refused the member's credentials (${tag}: ${said || 'access denied'})`;
      break;
    case 'account_disabled':
      message = `${ACCOUNT_REASONS[code!] ?? 'the Alibaba Cloud account cannot take work'} (${tag}: ${said})`;
      break;
    case 'model_not_open':
      message = `the DashScope account may not use ${ctx.model ? `model '${ctx.model}'` : 'this model'}: activate or purchase it in the Model Studio console of ${regionOf(account)} (${tag}: ${said})`;
      break;
    case 'misconfigured':
      message =
        mediaDownloadFailed(code, said)
          ? `DashScope could not download the task's input images from this gateway (${tag}: ${said}); make PUBLIC_BASE_URL (or the S3 store's URLs) reachable from Alibaba Cloud, or set ?inline_media=true on the member's base URL`
          : `${reason} (${tag}); check the member's base URL and model map`;
      break;
    default:
      message = reason;
  }
  return new ProviderError(kind, message, opts(kind));
}

/** Classifies an error answer of a DashScope call. */
export async function dashscopeError(account: UpstreamAccount, res: UpstreamResponse, what: string, model?: string): Promise<ProviderError> {
  const body = (await readJson(res)) as DashScopeErrorBody | undefined;
  return dashscopeErrorOf(account, typeof body === 'object' && body !== null ? body : undefined, what, { status: res.status, headers: res.headers, model });
}
