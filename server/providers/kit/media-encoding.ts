/**
 * A task's media inputs (`MediaInput`: stored by the gateway, opened as streams) in the forms
 * upstreams take them, never read whole into memory:
 *
 *   inlineBase64   bare base64 inside a JSON body (Veo `bytesBase64Encoded`, Kling `image`)
 *   dataUrl        `data:<type>;base64,…` inside a JSON body (Ark `image_url.url`, Seedream `image`)
 *   signedUrl      a short-lived signed Mediagate URL the upstream fetches (DashScope, fal, …)
 *
 * The first two are `Base64Source`s: `jsonStream` writes their base64 while the body is sent.
 */
import { Base64Source } from '../../lib/base64-json.ts';
import type { MediaInput } from '../types.ts';

export function inlineBase64(input: MediaInput): Base64Source {
  return new Base64Source(() => input.open(), input.bytes);
}

export function dataUrl(input: MediaInput): Base64Source {
  return new Base64Source(() => input.open(), input.bytes, `data:${input.contentType};base64,`);
}

/** An hour: long enough for an upstream's queue to fetch an input of a job without a lifetime. */
const MIN_URL_TTL_SECONDS = 3600;
/** The longest an S3 presigned URL lives (SigV4: 7 days); TASK_MAX_LIFETIME_SECONDS stops there too. */
const MAX_URL_TTL_SECONDS = 7 * 86_400;

/**
 * A URL the upstream fetches the input from when its job starts, which may be as late as the
 * task's deadline (`until`: a job queued that long, up to TASK_MAX_LIFETIME_SECONDS): valid until
 * then, at least an hour, at most 7 days. A link that expired first would fail the job as the
 * member's fault (fal's `file_download_error`).
 */
export function signedUrl(input: MediaInput, until?: Date, now = Date.now()): Promise<string> {
  const left = until ? Math.ceil((until.getTime() - now) / 1000) : 0;
  return input.url(Math.min(MAX_URL_TTL_SECONDS, Math.max(MIN_URL_TTL_SECONDS, left)));
}
