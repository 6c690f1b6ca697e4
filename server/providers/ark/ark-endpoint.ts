/**
 * A member's ModelArk endpoint. Its `base_url` picks the platform and region (upstream-apis.md §5):
 * BytePlus `https://ark.ap-southeast.bytepluses.com/api/v3` (the default) or
 * `https://ark.eu-west.bytepluses.com/api/v3` (images only), Volcengine
 * `https://ark.cn-beijing.volces.com/api/v3` (whose model ids carry `doubao-`: the member's model
 * map names them).
 *
 * The member's one Ark option rides in the same URL's query, so that it is set, shown and changed
 * with the member like its base URL (no credential to hide, no other field to add):
 * `?watermark=true` asks Seedream and Seedance for their "AI generated" mark. Without it the
 * adapters send `watermark: false` explicitly — Seedream's own default is true (§5.1).
 */
import { upstreamUrl, type UpstreamAccount } from '../kit.ts';

export interface ArkEndpoint {
  /** The member's base URL without its query (null: the provider's default). */
  baseUrl: string | null;
  watermark: boolean;
}

export function arkEndpoint(account: UpstreamAccount): ArkEndpoint {
  if (account.baseUrl === null) return { baseUrl: null, watermark: false };
  const url = new URL(account.baseUrl);
  const watermark = url.searchParams.get('watermark') === 'true';
  url.search = '';
  return { baseUrl: url.toString(), watermark };
}

/** The URL of `path` on the member's endpoint. */
export function arkUrl(account: UpstreamAccount, path: string): string {
  return upstreamUrl({ ...account, baseUrl: arkEndpoint(account).baseUrl }, path);
}

/** The origin the member's API key belongs to (downloads send it nowhere else). */
export function arkOrigin(account: UpstreamAccount): string {
  return new URL(arkUrl(account, '/')).origin;
}

export function arkAuth(account: UpstreamAccount): Record<string, string> {
  return { Authorization: `Bearer ${account.credentials.api_key ?? ''}` };
}
