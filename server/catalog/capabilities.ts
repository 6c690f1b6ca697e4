/**
 * Shapes of catalog_models.capabilities (jsonb), per kind. The admin API maps these to snake_case.
 */
export type FramesMode = 'none' | 'first-only' | 'first-and-optional-last';

export interface ImageCapabilities {
  resolutions: string[];
  aspectRatios: string[];
  outputFormats: ('png' | 'jpeg' | 'webp')[];
  supportsQuality: boolean;
  supportsTransparentBackground: boolean;
  maxN: number;
}

export interface VideoCapabilities {
  durations: number[];
  aspectRatios: string[];
  resolutions: string[];
  frames: FramesMode;
  referenceImages: { maxCount: number; configurable: boolean };
  audio: { supported: boolean; defaultEnabled: boolean };
}

export type BillingMode = 'per_second' | 'per_item';

export interface PriceRow {
  resolution: string;
  /** '' when the price is not quality-specific. */
  quality: string;
  mode: BillingMode;
  /** Micro-credits per unit (second or item). */
  unitPrice: number;
}

export interface CatalogModelDefinition {
  id: string;
  kind: 'image' | 'video';
  displayName: string;
  capabilities: ImageCapabilities | VideoCapabilities;
  prices: PriceRow[];
}
