/**
 * Downloading a finished job's output into the media store, streamed. Upstreams hand out the output
 * as a URL — signed and expiring (Ark 24 h, Kling's CDN), or on the upstream's own origin that wants
 * the key (Veo's files endpoint, which redirects to storage). Redirects are followed by
 * `upstreamFetch` (`anywhere`): credentials go only to `authOrigin`, never to the storage host a
 * redirect names. A gone output
 * (404 or 410, or 403 from a storage host) is a permanent failure; another 4xx of a storage host too.
 * An answer that is not an MP4 video (a page or an error served with 200, an empty body) is a
 * retryable one (`contentOf`).
 */
import { ProviderError } from '../provider-error.ts';
import type { VideoContent } from '../types.ts';
import { contentOf, upstreamFetch, type UpstreamResponse } from '../upstream-http.ts';

export interface DownloadOptions {
  /** Headers that carry credentials; sent only to `authOrigin`. */
  authHeaders?: Record<string, string>;
  /** The origin the credentials belong to (default: none, nothing is sent with credentials). */
  authOrigin?: string;
  /** How the upstream's own error answers (from `authOrigin`) are classified. */
  upstreamError: (res: UpstreamResponse, what: string) => Promise<ProviderError>;
  /** Said when the link is gone (default: the upstream's output link expired). */
  expiredMessage?: string;
}

export async function downloadOutput(url: string, signal: AbortSignal, opts: DownloadOptions): Promise<VideoContent> {
  const sendsCredentials = opts.authOrigin !== undefined && new URL(url).origin === opts.authOrigin;
  const res = await upstreamFetch(url, { headers: sendsCredentials ? opts.authHeaders : undefined, redirect: 'anywhere' }, signal, 'video download');
  if (res.ok) return contentOf(res);
  const own = opts.authOrigin !== undefined && new URL(res.url).origin === opts.authOrigin;
  // The output is gone (expired, or a link the upstream signed no longer works): retrying cannot
  // help. A 404 is that on any host (submit and poll already proved the member's base URL).
  if (res.status === 404 || res.status === 410 || (!own && res.status === 403)) {
    res.discard();
    throw new ProviderError('failed', opts.expiredMessage ?? "the upstream's link to the video expired before it was downloaded", { upstreamStatus: res.status });
  }
  if (!own && res.status < 500 && res.status !== 429) {
    res.discard();
    throw new ProviderError('failed', `the upstream's video link answered HTTP ${res.status}`, { upstreamStatus: res.status });
  }
  throw await opts.upstreamError(res, 'video download');
}
