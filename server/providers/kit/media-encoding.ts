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

/** Long enough for an upstream's queue to fetch it (default one hour). */
export function signedUrl(input: MediaInput, minTtlSeconds = 3600): Promise<string> {
  return input.url(minTtlSeconds);
}
