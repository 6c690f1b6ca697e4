/**
 * Shapes of catalog_models.capabilities (jsonb), per kind. The admin API maps these to snake_case.
 */
export type FramesMode = 'none' | 'first-only' | 'first-and-optional-last';

/** Pixel tables an image model can use (`SIZE_TABLES` in image-size.ts): the product's reference table, or an upstream's official one. */
export type SizeTableName = 'reference' | 'gemini-2.5-flash-image' | 'gemini-3-pro-image' | 'gemini-3.1-flash-image';

export interface ImageCapabilities {
  resolutions: string[];
  aspectRatios: string[];
  outputFormats: ('png' | 'jpeg' | 'webp')[];
  supportsQuality: boolean;
  supportsTransparentBackground: boolean;
  maxN: number;
  /** Where `resolution` + `aspectRatio` get their pixels (default: the reference table 2.8). */
  sizeTable?: SizeTableName;
  /** Most input images of an edit, a mask counting as one; default: only the server's limit (16 images). */
  maxInputImages?: number;
  /**
   * An upstream image of another size than the resolved one: resized to exactly the resolved size
   * (`exact`, the default: the contract's promise) or returned at the upstream's native size.
   */
  resize?: ImageResize;
  /**
   * Whether the model edits (`POST /v1/images/edits`): `false` on a prompt-only model, whose edit
   * is refused (`400 edits_not_supported`) before anything is held. Absent: it edits, the default
   * of rows created before this was recorded and of models created without it. Stored only when
   * `false`.
   */
  edits?: false;
  /**
   * Which ratios a custom `size` or an edit's kept input size may have: any (`any`, the default:
   * the upstream takes a width and height) or only the model's `aspectRatios` (`offered`: the
   * upstream takes an `aspect_ratio` from a fixed list, as Replicate's FLUX and Ideogram do).
   * Stored only when `offered`.
   */
  customSizeRatios?: 'offered';
  /** Shortest and longest edge in pixels the upstream renders (fal's Seedream: 1024–4096); absent: the custom-size limits only. */
  minEdge?: number;
  maxEdge?: number;
}

export type ImageResize = 'exact' | 'native';

/**
 * A duration rule that applies only in some combinations: when the request has one of
 * `resolutions`, a last frame (`lastFrame`) or reference images (`referenceImages`), its duration
 * must be one of `durations` (Veo: 8 s with 1080p/4k, a last frame or reference images).
 */
export interface DurationConstraint {
  resolutions?: string[];
  lastFrame?: boolean;
  referenceImages?: boolean;
  durations: number[];
}

export interface VideoCapabilities {
  durations: number[];
  aspectRatios: string[];
  resolutions: string[];
  frames: FramesMode;
  /**
   * `ceiling`: the most a configurable `maxCount` may be raised to, the `maxCount` the model was
   * created with (what its upstream takes); absent on rows created before it was recorded, where
   * the current `maxCount` is the ceiling.
   */
  referenceImages: { maxCount: number; configurable: boolean; ceiling?: number };
  /** `alwaysOn`: the model always generates audio (Veo 3); `generate_audio: false` is refused. */
  audio: { supported: boolean; defaultEnabled: boolean; alwaysOn?: boolean };
  durationConstraints?: DurationConstraint[];
}

/** The constraints a request of this shape falls under (each names its condition, for messages). */
export function durationConstraintsFor(caps: VideoCapabilities, req: { resolution: string; hasLastFrame: boolean; referenceImages: number }): { rule: string; durations: number[] }[] {
  const out: { rule: string; durations: number[] }[] = [];
  for (const c of caps.durationConstraints ?? []) {
    if (c.resolutions?.includes(req.resolution)) out.push({ rule: `resolution ${req.resolution}`, durations: c.durations });
    if (c.lastFrame && req.hasLastFrame) out.push({ rule: 'a last frame', durations: c.durations });
    if (c.referenceImages && req.referenceImages > 0) out.push({ rule: 'reference images', durations: c.durations });
  }
  return out;
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
