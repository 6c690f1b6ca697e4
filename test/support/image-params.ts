import type { ImageParams } from '../../server/providers/types.ts';

/** An image job's parameters as image-request.ts resolves them (1024x1024 png, `auto` quality asked for at `high`), with `overrides`. */
export function imageParams(overrides: Partial<ImageParams> = {}): ImageParams {
  return {
    width: 1024,
    height: 1024,
    resolution: '1K',
    aspectRatio: '1:1',
    quality: 'auto',
    background: 'auto',
    transparent: false,
    outputFormat: 'png',
    outputCompression: undefined,
    responseFormat: 'b64_json',
    partialImages: 0,
    requestedSize: 'auto',
    ...overrides,
    // As image-request.ts resolves it: `auto` is billed, and asked for, at `high`.
    resolvedQuality: overrides.resolvedQuality ?? (overrides.quality === undefined || overrides.quality === 'auto' ? 'high' : overrides.quality),
  };
}
