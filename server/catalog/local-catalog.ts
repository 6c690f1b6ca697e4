/**
 * The built-in `local` provider's models, seeded on an empty database. Together the video models
 * cover both billing modes, both audio defaults, every frames mode and a configurable
 * reference-image limit; the image models cover quality and non-quality pricing.
 */
import type { CatalogModelDefinition, PriceRow } from './capabilities.ts';
import { MICRO } from '../lib/money.ts';

const IMAGE_RATIOS = ['1:1', '3:2', '2:3', '16:9', '9:16', '4:3', '3:4', '21:9'];
const credits = (n: number) => Math.round(n * MICRO);

function imagePrices(byResolution: Record<string, number>, qualities: string[] = ['']): PriceRow[] {
  const factor: Record<string, number> = { '': 1, low: 0.5, medium: 1, high: 2 };
  return Object.entries(byResolution).flatMap(([resolution, price]) =>
    qualities.map((quality) => ({ resolution, quality, mode: 'per_item' as const, unitPrice: credits(price * (factor[quality] ?? 1)) })),
  );
}

export const LOCAL_MODELS: CatalogModelDefinition[] = [
  {
    id: 'local-image-1',
    kind: 'image',
    displayName: 'Local Image 1',
    capabilities: {
      resolutions: ['1K', '2K', '4K'],
      aspectRatios: IMAGE_RATIOS,
      outputFormats: ['png', 'jpeg', 'webp'],
      supportsQuality: false,
      supportsTransparentBackground: false,
      maxN: 10,
    },
    prices: imagePrices({ '1K': 1, '2K': 2, '4K': 4 }),
  },
  {
    id: 'local-image-pro',
    kind: 'image',
    displayName: 'Local Image Pro (quality tiers, transparency)',
    capabilities: {
      resolutions: ['1K', '2K', '4K'],
      aspectRatios: IMAGE_RATIOS,
      outputFormats: ['png', 'jpeg', 'webp'],
      supportsQuality: true,
      supportsTransparentBackground: true,
      maxN: 10,
    },
    // `quality: auto` (or none) is billed at the `high` row (see the contract's pricing rules).
    prices: imagePrices({ '1K': 2, '2K': 4, '4K': 8 }, ['low', 'medium', 'high']),
  },
  {
    id: 'local-video-1',
    kind: 'video',
    displayName: 'Local Video 1 (per second, first and last frame)',
    capabilities: {
      durations: [2, 4, 6, 8],
      aspectRatios: ['16:9', '9:16', '1:1'],
      resolutions: ['360p', '480p', '720p'],
      frames: 'first-and-optional-last',
      referenceImages: { maxCount: 10, configurable: true, ceiling: 10 },
      audio: { supported: true, defaultEnabled: false },
    },
    prices: [
      { resolution: '360p', quality: '', mode: 'per_second', unitPrice: credits(0.05) },
      { resolution: '480p', quality: '', mode: 'per_second', unitPrice: credits(0.08) },
      { resolution: '720p', quality: '', mode: 'per_second', unitPrice: credits(0.12) },
    ],
  },
  {
    id: 'local-video-audio',
    kind: 'video',
    displayName: 'Local Video Audio (per clip, first frame, audio on by default)',
    capabilities: {
      durations: [4, 8],
      aspectRatios: ['16:9', '9:16'],
      resolutions: ['480p', '720p'],
      frames: 'first-only',
      referenceImages: { maxCount: 3, configurable: false },
      audio: { supported: true, defaultEnabled: true },
    },
    prices: [
      { resolution: '480p', quality: '', mode: 'per_item', unitPrice: credits(1) },
      { resolution: '720p', quality: '', mode: 'per_item', unitPrice: credits(1.5) },
    ],
  },
  {
    id: 'local-video-lite',
    kind: 'video',
    displayName: 'Local Video Lite (text only, no audio)',
    capabilities: {
      durations: [2, 4],
      aspectRatios: ['16:9', '1:1'],
      resolutions: ['360p'],
      frames: 'none',
      referenceImages: { maxCount: 2, configurable: false },
      audio: { supported: false, defaultEnabled: false },
    },
    prices: [{ resolution: '360p', quality: '', mode: 'per_second', unitPrice: credits(0.02) }],
  },
];
