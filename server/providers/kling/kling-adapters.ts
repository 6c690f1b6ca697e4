/**
 * The `kling` adapters of a process: videos and images share one token cache, so that a member
 * signs one token per process whatever it serves.
 */
import { KlingTokens } from './kling-auth.ts';
import { KlingImageProvider } from './kling-image.provider.ts';
import { KlingVideoProvider } from './kling-video.provider.ts';

export function klingAdapters(videoPollIntervalMs?: number): { image: KlingImageProvider; video: KlingVideoProvider } {
  const tokens = new KlingTokens();
  return { video: new KlingVideoProvider({ pollIntervalMs: videoPollIntervalMs, tokens }), image: new KlingImageProvider({ tokens }) };
}
