/**
 * Image output size: table 2.8 of the product specification, the `size` parameter (`auto`, a table
 * value or a custom `WIDTHxHEIGHT`) and its interplay with `aspectRatio` + `resolution`.
 *
 * Pure: no I/O. Every rejection is a `400` {@link ApiError} of the contract (`ImageSize.yaml`).
 */
import type { ImageCapabilities, SizeTableName } from '../../catalog/capabilities.ts';
import { badRequest } from '../../errors.ts';

export type TableResolution = '1K' | '2K' | '4K';
export type TableAspectRatio = '1:1' | '3:2' | '2:3' | '16:9' | '9:16' | '4:3' | '3:4' | '21:9';

export interface PixelSize {
  width: number;
  height: number;
}

const TABLE_RATIOS: readonly TableAspectRatio[] = ['1:1', '3:2', '2:3', '16:9', '9:16', '4:3', '3:4', '21:9'];

/** One row of table 2.8: the `WxH` sizes in the table's column order. */
function tableRow(sizes: string): Record<TableAspectRatio, PixelSize> {
  const cells = sizes.split(' ').map((cell) => {
    const [width, height] = cell.split('x').map(Number) as [number, number];
    return { width, height };
  });
  return Object.fromEntries(TABLE_RATIOS.map((ratio, i) => [ratio, cells[i]!])) as Record<TableAspectRatio, PixelSize>;
}

/** Table 2.8 (reference sizes in pixels), exactly as published: columns 1:1, 3:2, 2:3, 16:9, 9:16, 4:3, 3:4, 21:9. */
export const SIZE_TABLE: Readonly<Record<TableResolution, Readonly<Record<TableAspectRatio, Readonly<PixelSize>>>>> = {
  '1K': tableRow('1248x1248 1248x832 832x1248 1248x704 704x1248 1248x944 944x1248 1248x528'),
  '2K': tableRow('2048x2048 2048x1360 1360x2048 2048x1152 1152x2048 2048x1536 1536x2048 2048x880'),
  '4K': tableRow('2880x2880 3520x2352 2352x3520 3840x2160 2160x3840 3312x2496 2496x3312 3840x1648'),
};

/** `W:H` -> pixels, parsed from `'1:1=1024x1024 2:3=832x1248 …'`. */
function ratioRow(cells: string): Readonly<Record<string, Readonly<PixelSize>>> {
  return Object.fromEntries(
    cells.split(' ').map((cell) => {
      const [ratio, size] = cell.split('=') as [string, string];
      const [width, height] = size.split('x').map(Number) as [number, number];
      return [ratio, { width, height }];
    }),
  );
}

const GEMINI_3_PRO_1K = ratioRow('1:1=1024x1024 2:3=848x1264 3:2=1264x848 3:4=896x1200 4:3=1200x896 4:5=928x1152 5:4=1152x928 9:16=768x1376 16:9=1376x768 21:9=1584x672');
/** gemini-3.1-flash-image-preview: the 3 Pro grid plus its four extreme ratios (§3.4, 1K). */
const GEMINI_31_FLASH_1K = { ...GEMINI_3_PRO_1K, ...ratioRow('1:4=512x2064 4:1=2064x512 1:8=352x2928 8:1=2928x352') };
const scaled = (row: Readonly<Record<string, PixelSize>>, k: number) =>
  Object.fromEntries(Object.entries(row).map(([ratio, { width, height }]) => [ratio, { width: width * k, height: height * k }]));

/**
 * Every pixel table an image model can use (`ImageCapabilities.sizeTable`): the product's reference
 * table 2.8, and Google's official tables for the Gemini image models (upstream-apis.md §3.4: what
 * the upstream really renders, so a client is told and billed for the true size). Gemini 3 Pro's 2K
 * and 4K rows are exactly 2x and 4x its 1K row in the official table; 2.5 Flash renders 1K only.
 * 3.1 Flash adds `1:4`, `4:1`, `1:8`, `8:1` (2K and 4K again 2x and 4x, §3.4) and a `512` tier
 * (§3.1; the Gemini API's `imageSize` takes `512`, `1K`, `2K`, `4K`). §3.4 has no `512` pixels:
 * ASSUMPTION, the 1K row halved (16:9 = 688x384), as 2K and 4K are exact multiples of it.
 * A Gemini table is the whole of what the model takes: a ratio or tier outside it is refused.
 */
export const SIZE_TABLES: Readonly<Record<SizeTableName, Readonly<Record<string, Readonly<Record<string, Readonly<PixelSize>>>>>>> = {
  reference: SIZE_TABLE,
  'gemini-2.5-flash-image': {
    '1K': ratioRow('1:1=1024x1024 2:3=832x1248 3:2=1248x832 3:4=864x1184 4:3=1184x864 4:5=896x1152 5:4=1152x896 9:16=768x1344 16:9=1344x768 21:9=1536x672'),
  },
  'gemini-3-pro-image': { '1K': GEMINI_3_PRO_1K, '2K': scaled(GEMINI_3_PRO_1K, 2), '4K': scaled(GEMINI_3_PRO_1K, 4) },
  'gemini-3.1-flash-image': {
    '512': scaled(GEMINI_31_FLASH_1K, 0.5),
    '1K': GEMINI_31_FLASH_1K,
    '2K': scaled(GEMINI_31_FLASH_1K, 2),
    '4K': scaled(GEMINI_31_FLASH_1K, 4),
  },
};

/** Limits of a custom `WIDTHxHEIGHT` (§8 of the specification, `ImageSize.yaml`). */
export const CUSTOM_SIZE_LIMITS = {
  minEdge: 256,
  maxEdge: 3840,
  minPixels: 655_360,
  maxPixels: 8_294_400,
  maxAspectRatio: 3,
  edgeMultiple: 16,
} as const;

/**
 * Billing tier of a custom size, by pixel count: ≤ 1248×1248 px → `1K`, ≤ 2048×2048 px → `2K`, else
 * `4K` (the squares of table 2.8's 1K and 2K rows; every table value falls in its own row's tier).
 */
export const CUSTOM_TIER_MAX_PIXELS: readonly (readonly [TableResolution, number])[] = [
  ['1K', 1248 * 1248],
  ['2K', 2048 * 2048],
];

export type ParsedSize =
  | { kind: 'auto' }
  /** A value of table 2.8 (`TableResolution`/`TableAspectRatio`) or of the model's own table (any tier, e.g. `512`). */
  | { kind: 'table'; resolution: string; aspectRatio: string; width: number; height: number }
  /**
   * A custom `WIDTHxHEIGHT`. `tableRatio`: a table 2.8 value read as a custom size (on a model with
   * its own pixel table, {@link parseModelSize}): the ratio the table names for it, which an
   * `aspectRatio` may name too (`21:9` for 1248x528, 1.3 % off its width/height).
   */
  | { kind: 'custom'; width: number; height: number; tableRatio?: string };

export interface ResolvedImageSize {
  width: number;
  height: number;
  /** Billing tier: from the table for table sizes, by pixel count for custom sizes. */
  resolution: string;
  /**
   * `W:H` of the table row, or the reduced ratio of a custom size (e.g. `8:5` for 1024x640); on a
   * model with `customSizeRatios: offered`, the offered ratio its upstream is asked for.
   */
  aspectRatio: string;
  /** True for a custom `size` (rendered at exactly the requested pixels). */
  custom: boolean;
}

export interface ResolveImageSizeInput {
  size?: string;
  aspectRatio?: string;
  resolution?: string;
  /** Operator setting `IMAGE_SIZE_PARAM`: `reject` is the specification's variant A. */
  sizeParam: 'accept' | 'reject';
  caps: ImageCapabilities;
  /** An edit's first input image: kept as the output size when the request names none (rule 0). */
  inputSize?: PixelSize;
}

const TABLE_BY_SIZE: ReadonlyMap<string, { resolution: TableResolution; aspectRatio: TableAspectRatio }> = new Map(
  (Object.keys(SIZE_TABLE) as TableResolution[]).flatMap((resolution) =>
    (Object.keys(SIZE_TABLE[resolution]) as TableAspectRatio[]).map((aspectRatio) => {
      const { width, height } = SIZE_TABLE[resolution][aspectRatio];
      return [`${width}x${height}`, { resolution, aspectRatio }] as const;
    }),
  ),
);

const SIZE_PATTERN = /^([1-9][0-9]{0,4})x([1-9][0-9]{0,4})$/;
const RATIO_PATTERN = /^([1-9][0-9]*):([1-9][0-9]*)$/;

const invalidSize = (size: string, rule: string) => badRequest('invalid_size', `Invalid size '${size}': ${rule}.`, 'size');

function gcd(a: number, b: number): number {
  while (b) [a, b] = [b, a % b];
  return a;
}

/** Scales a size down (keeping its ratio, even edges) into the custom-size limits: edges ≤ 3840, pixels ≤ 8,294,400. */
export function fitWithinLimits(width: number, height: number, maxPixels: number = CUSTOM_SIZE_LIMITS.maxPixels, maxEdge: number = CUSTOM_SIZE_LIMITS.maxEdge): PixelSize {
  const scale = Math.min(1, maxEdge / Math.max(width, height), Math.sqrt(maxPixels / (width * height)));
  if (scale === 1) return { width, height };
  const even = (n: number) => Math.max(2, Math.floor((n * scale) / 2) * 2);
  return { width: even(width), height: even(height) };
}

/** Scales a size up (keeping its ratio, even edges) until its shorter edge is at least `minEdge`. */
function raiseToMinEdge(width: number, height: number, minEdge: number): PixelSize {
  const scale = minEdge / Math.min(width, height);
  if (scale <= 1) return { width, height };
  const even = (n: number) => Math.ceil((n * scale) / 2) * 2;
  return { width: even(width), height: even(height) };
}

const logRatio = (ratio: string) => {
  const [w, h] = ratio.split(':').map(Number) as [number, number];
  return Math.log(w / h);
};

/** The ratio of `ratios` nearest to `width`:`height` on a log scale (as the Kling and Gemini adapters snap). */
export function nearestRatio(width: number, height: number, ratios: readonly string[]): string | undefined {
  const target = Math.log(width / height);
  let best: string | undefined;
  for (const r of ratios) if (best === undefined || Math.abs(logRatio(r) - target) < Math.abs(logRatio(best) - target)) best = r;
  return best;
}

/** The model's own pixel table (Gemini's), or undefined for the reference table 2.8. */
function ownTable(caps: ImageCapabilities): Readonly<Record<string, Readonly<Record<string, Readonly<PixelSize>>>>> | undefined {
  return caps.sizeTable && caps.sizeTable !== 'reference' ? SIZE_TABLES[caps.sizeTable] : undefined;
}

/** A tier row's size at the ratio nearest to `width`:`height`: what the upstream renders for that size at that tier. */
function rowSizeNear(row: Readonly<Record<string, Readonly<PixelSize>>>, width: number, height: number): PixelSize {
  return row[nearestRatio(width, height, Object.keys(row))!]!;
}

/**
 * Most pixels a size billed at `tier` may have. The reference table: ≤ 1248×1248 px for `1K`,
 * ≤ 2048×2048 px for `2K` ({@link CUSTOM_TIER_MAX_PIXELS}), `4K` unbounded. A model's own table:
 * the tier's size at the nearest ratio, what its upstream renders at that tier, so an image is
 * rendered at least as large as it is delivered and only ever scaled down; at the table's largest
 * tier, up to the reference limit of that tier too (Gemini 2.5 Flash's only tier, 1K, keeps up to
 * 1248×1248 px, as it did on the reference thresholds). Undefined: unbounded.
 */
function tierMaxPixels(tier: string, width: number, height: number, caps: ImageCapabilities): number | undefined {
  const reference = CUSTOM_TIER_MAX_PIXELS.find(([t]) => t === tier)?.[1];
  const table = ownTable(caps);
  const row = table?.[tier];
  if (!table || !row) return reference;
  const px = rowSizeNear(row, width, height);
  const own = px.width * px.height;
  if (tier !== TIER_ORDER.filter((t) => table[t]).at(-1)) return own;
  return reference === undefined ? undefined : Math.max(own, reference);
}

/**
 * Billing tier of a custom size (or an edit's kept size): by pixel count on the reference table
 * ({@link customSizeTier}); on a model's own pixel table, the smallest tier whose size at the
 * nearest ratio has at least its pixels ({@link tierMaxPixels}), the tier its upstream is asked
 * for. Every table value lands in its own tier, so a kept size and a `size` of the same value are
 * billed alike.
 */
function sizeTier(width: number, height: number, caps: ImageCapabilities): string {
  const table = ownTable(caps);
  if (table) {
    for (const tier of TIER_ORDER) {
      if (!table[tier]) continue;
      const max = tierMaxPixels(tier, width, height, caps);
      if (max === undefined || width * height <= max) return tier;
    }
  }
  return customSizeTier(width, height);
}

/** The offered ratio a custom size has (within 1 %, as `aspectRatio` is matched against a custom size), or undefined. */
function offeredRatioOf(width: number, height: number, ratios: readonly string[]): string | undefined {
  const near = nearestRatio(width, height, ratios.filter((r) => RATIO_PATTERN.test(r)));
  return near !== undefined && Math.abs(width / height / Math.exp(logRatio(near)) - 1) <= 0.01 ? near : undefined;
}

/** The edges a model's upstream renders: the custom-size limits narrowed by the model's own (`minEdge`, `maxEdge`). */
function edgeRange(caps: ImageCapabilities): { min: number; max: number } {
  return { min: caps.minEdge ?? 1, max: Math.min(CUSTOM_SIZE_LIMITS.maxEdge, caps.maxEdge ?? Infinity) };
}

/** The reduced `W:H` ratio of a pixel size. */
export function ratioOf(width: number, height: number): string {
  const g = gcd(width, height);
  return `${width / g}:${height / g}`;
}

/** Every tier, smallest first (`512` exists only in gemini-3.1-flash-image's table). */
const TIER_ORDER: readonly string[] = ['512', '1K', '2K', '4K'];

/**
 * Rule 0: an edit that names no size keeps its first input's size, scaled down into the custom-size
 * limits (and into the model's own edges, `minEdge`/`maxEdge`, scaled up to its shortest edge),
 * billed at the tier a `size` of that value gets ({@link sizeTier}). On a model that does not offer that tier: the smallest larger tier
 * it offers (the output keeps the input's size: the model sells nothing cheaper), else its largest
 * tier, the size scaled down to that tier's pixels (the model makes nothing larger). Never a tier
 * the output's pixels do not fit. On a model whose upstream takes only its offered ratios
 * (`customSizeRatios: offered`) the upstream is asked for the nearest of them, and the answer is
 * resized to the kept size as any other size is.
 */
function keepInputSize(input: PixelSize, caps: ImageCapabilities): ResolvedImageSize {
  const edges = edgeRange(caps);
  let { width, height } = fitWithinLimits(input.width, input.height, CUSTOM_SIZE_LIMITS.maxPixels, edges.max);
  ({ width, height } = raiseToMinEdge(width, height, edges.min));
  const tier = sizeTier(width, height, caps);
  const offeredTiers = TIER_ORDER.filter((t) => caps.resolutions.includes(t));
  let billed = offeredTiers.find((t) => TIER_ORDER.indexOf(t) >= TIER_ORDER.indexOf(tier));
  if (billed === undefined) {
    billed = offeredTiers.at(-1);
    if (billed === undefined) throw badRequest('unsupported_resolution', 'This model offers no resolution.', 'resolution');
    const max = tierMaxPixels(billed, width, height, caps);
    if (max !== undefined) ({ width, height } = fitWithinLimits(width, height, max, edges.max));
  }
  if (Math.min(width, height) < edges.min || Math.max(width, height) > edges.max || width * height > CUSTOM_SIZE_LIMITS.maxPixels) {
    throw badRequest(
      'invalid_size',
      `The first input image is ${input.width}x${input.height}; kept as the output size it cannot be rendered by this model (each edge ${edges.min} to ${edges.max} px). Name a 'size', or 'aspectRatio' + 'resolution'.`,
      'size',
    );
  }
  const aspectRatio = caps.customSizeRatios === 'offered' ? (nearestRatio(width, height, caps.aspectRatios) ?? ratioOf(width, height)) : ratioOf(width, height);
  return { width, height, resolution: billed, aspectRatio, custom: true };
}

/** Billing tier of a custom size (see {@link CUSTOM_TIER_MAX_PIXELS}). */
export function customSizeTier(width: number, height: number): TableResolution {
  const pixels = width * height;
  for (const [tier, max] of CUSTOM_TIER_MAX_PIXELS) if (pixels <= max) return tier;
  return '4K';
}

/**
 * Parses a `size` value: `auto`, a table 2.8 value, or a custom `WIDTHxHEIGHT` within the limits
 * (each edge 256–3840 px, total pixels 655,360–8,294,400, aspect ratio at most 3:1, both edges
 * multiples of 16). Anything else is `400 invalid_size` (param `size`), naming the violated rule.
 */
export function parseSize(size: string): ParsedSize {
  if (size === 'auto') return { kind: 'auto' };
  const m = SIZE_PATTERN.exec(size);
  if (!m) throw invalidSize(size, "expected 'auto' or WIDTHxHEIGHT in pixels, e.g. '2048x1152'");
  const width = Number(m[1]);
  const height = Number(m[2]);
  const row = TABLE_BY_SIZE.get(`${width}x${height}`);
  if (row) return { kind: 'table', ...row, width, height };
  checkCustomSize(size, width, height);
  return { kind: 'custom', width, height };
}

/** Refuses a custom size outside the limits ({@link CUSTOM_SIZE_LIMITS}), naming the violated rule. */
function checkCustomSize(size: string, width: number, height: number): void {
  const L = CUSTOM_SIZE_LIMITS;
  if (width < L.minEdge || width > L.maxEdge || height < L.minEdge || height > L.maxEdge) {
    throw invalidSize(size, `each edge must be ${L.minEdge} to ${L.maxEdge} px`);
  }
  const pixels = width * height;
  if (pixels < L.minPixels || pixels > L.maxPixels) {
    throw invalidSize(size, `total pixels must be 655,360 to 8,294,400 (got ${pixels.toLocaleString('en-US')})`);
  }
  if (Math.max(width, height) / Math.min(width, height) > L.maxAspectRatio) {
    throw invalidSize(size, `aspect ratio must be at most ${L.maxAspectRatio}:1`);
  }
  if (width % L.edgeMultiple !== 0 || height % L.edgeMultiple !== 0) {
    throw invalidSize(size, `both edges must be multiples of ${L.edgeMultiple}`);
  }
}

/** A `size` that is a value of the model's own (non-reference) pixel table. */
function modelTableSize(size: string, table: SizeTableName | undefined): ParsedSize | undefined {
  if (!table || table === 'reference') return undefined;
  for (const [resolution, row] of Object.entries(SIZE_TABLES[table])) {
    for (const [aspectRatio, px] of Object.entries(row)) {
      if (`${px.width}x${px.height}` === size) return { kind: 'table', resolution, aspectRatio, width: px.width, height: px.height };
    }
  }
  return undefined;
}

/**
 * Parses a `size` for a model: a value of its own pixel table (Gemini's) is that tier and ratio. On
 * a model with its own table, a table 2.8 value that is not also one of the model's is a custom
 * size (every table 2.8 value is within the custom-size limits): billed by {@link sizeTier}, at the
 * tier whose upstream size holds at least its pixels, as a custom size or a kept size of the same
 * pixels is, and only ever scaled down. 1248x1248 (table 2.8's 1K 1:1) on Gemini 3.1 Flash, whose
 * 1K renders 1024x1024, is 2K, as 1232x1232 is; read as table 2.8's 1K it was billed 1K and the
 * 1024x1024 answer scaled up.
 */
function parseModelSize(size: string, caps: ImageCapabilities): ParsedSize {
  const own = modelTableSize(size, caps.sizeTable);
  if (own) return own;
  const parsed = parseSize(size);
  if (parsed.kind !== 'table' || !ownTable(caps)) return parsed;
  checkCustomSize(size, parsed.width, parsed.height);
  return { kind: 'custom', width: parsed.width, height: parsed.height, tableRatio: parsed.aspectRatio };
}

function parseRatio(ratio: string): number | undefined {
  const m = RATIO_PATTERN.exec(ratio);
  return m ? Number(m[1]) / Number(m[2]) : undefined;
}

/**
 * Pixel size of a tier and ratio: the table value, or (for a ratio outside table 2.8 offered by a
 * model on the reference table) one derived from the tier's square area, edges multiples of 16 and
 * at most 3840 px. An upstream's own table (Gemini) lists everything that model takes: a tier or
 * ratio outside it is refused, before anything is held or sent.
 */
function tableSize(resolution: string, aspectRatio: string, table: SizeTableName = 'reference'): PixelSize {
  const tiers = SIZE_TABLES[table] as Record<string, Record<string, PixelSize> | undefined>;
  const row = tiers[resolution];
  if (!row) {
    const offered = table === 'reference' ? '' : ` (the ${table} pixel table has: ${Object.keys(tiers).join(', ')})`;
    throw badRequest('unsupported_resolution', `Resolution '${resolution}' has no pixel size${offered}.`, 'resolution');
  }
  const exact = row[aspectRatio];
  if (exact) return { width: exact.width, height: exact.height };
  if (table !== 'reference') {
    throw badRequest(
      'unsupported_aspect_ratio',
      `Aspect ratio '${aspectRatio}' is not supported by this model (the ${table} pixel table has: ${Object.keys(row).join(', ')}).`,
      'aspectRatio',
    );
  }
  const r = parseRatio(aspectRatio);
  const square = row['1:1'];
  if (r === undefined || !square) {
    throw badRequest('unsupported_aspect_ratio', `Aspect ratio '${aspectRatio}' has no pixel size.`, 'aspectRatio');
  }
  const area = square.width * square.height;
  let width = Math.sqrt(area * r);
  let height = width / r;
  const scale = Math.min(1, 3840 / Math.max(width, height));
  width = Math.max(16, Math.round((width * scale) / 16) * 16);
  height = Math.max(16, Math.round((height * scale) / 16) * 16);
  return { width, height };
}

/**
 * Decides the output size of an image request. Rules, in order:
 * 0. an edit (`inputSize`) with no `size` (or `auto`), `aspectRatio` or `resolution` keeps its
 *    first input's size ({@link keepInputSize}: billed at the tier a `size` of that value gets, or
 *    the nearest tier the model offers), once rule 1 has passed;
 * 1. any `size` (`auto` included, an edit's too) while the operator set `IMAGE_SIZE_PARAM=reject`
 *    (variant A) → `400 size_not_accepted`;
 * 2. a `resolution` the model does not offer → `400 unsupported_resolution` (param `resolution`);
 * 3. an `aspectRatio` the model does not offer → `400 unsupported_aspect_ratio` (param `aspectRatio`);
 * 4. a malformed or out-of-limits `size` → `400 invalid_size` (see {@link parseSize}); on a model
 *    with its own pixel table, a table 2.8 value it lacks is a custom size ({@link parseModelSize});
 * 5. a table size with an `aspectRatio` or `resolution` other than its own → `400 size_conflict`;
 *    a custom size with an `aspectRatio` more than 1 % off its width/height (and not the ratio
 *    table 2.8 names for it), or with a `resolution` other than its billing tier → `400
 *    size_conflict` (all param `size`);
 * 6. a table size whose tier or ratio the model does not offer, or a custom size whose billing tier
 *    the model does not offer (or, with `customSizeRatios: offered`, that is not within 1 % of an
 *    offered ratio) → `400 unsupported_resolution` / `unsupported_aspect_ratio` (param `size`);
 *    a custom size with an edge outside the model's `minEdge`–`maxEdge` → `400 invalid_size`;
 * 7. defaults (no `size` or `auto`): nothing given → the model's first resolution and `1:1` (the
 *    model's first ratio when it lacks `1:1`); only a resolution → `1:1`; only a ratio → the model's
 *    first resolution.
 *
 * Decision (custom sizes): a custom `WIDTHxHEIGHT` is rendered at exactly the requested pixels and
 * billed by pixel count: ≤ 1248×1248 px (1,557,504) → `1K`, ≤ 2048×2048 px (4,194,304) → `2K`,
 * otherwise `4K`. These thresholds are the squares of table 2.8's 1K and 2K rows, so every table
 * value would land in its own row's tier under the same rule. The contract (`ImageSize.yaml`)
 * accepts custom sizes but prices by tier; this is how a custom size maps to a tier. A model with
 * its own pixel table (Gemini) bills it at the smallest tier that renders at least its pixels
 * ({@link sizeTier}): the tier its upstream is asked for.
 */
export function resolveImageSize(input: ResolveImageSizeInput): ResolvedImageSize {
  const { size, aspectRatio, resolution, caps } = input;
  if (size !== undefined && input.sizeParam === 'reject') {
    throw badRequest(
      'size_not_accepted',
      "The 'size' parameter is not accepted by this server; use 'aspectRatio' + 'resolution' instead.",
      'size',
    );
  }
  if (input.inputSize && (size === undefined || size === 'auto') && aspectRatio === undefined && resolution === undefined) {
    return keepInputSize(input.inputSize, caps);
  }
  if (resolution !== undefined && !caps.resolutions.includes(resolution)) {
    throw badRequest(
      'unsupported_resolution',
      `Resolution '${resolution}' is not supported by this model (supported: ${caps.resolutions.join(', ')}).`,
      'resolution',
    );
  }
  if (aspectRatio !== undefined && !caps.aspectRatios.includes(aspectRatio)) {
    throw badRequest(
      'unsupported_aspect_ratio',
      `Aspect ratio '${aspectRatio}' is not supported by this model (supported: ${caps.aspectRatios.join(', ')}).`,
      'aspectRatio',
    );
  }

  const parsed: ParsedSize = size === undefined ? { kind: 'auto' } : parseModelSize(size, caps);
  if (parsed.kind === 'table') {
    if (aspectRatio !== undefined && aspectRatio !== parsed.aspectRatio) {
      throw badRequest('size_conflict', `Size '${size}' is ${parsed.aspectRatio}, not aspect ratio '${aspectRatio}'.`, 'size');
    }
    if (resolution !== undefined && resolution !== parsed.resolution) {
      throw badRequest('size_conflict', `Size '${size}' is resolution ${parsed.resolution}, not '${resolution}'.`, 'size');
    }
    if (!caps.resolutions.includes(parsed.resolution)) {
      throw badRequest('unsupported_resolution', `Size '${size}' is resolution ${parsed.resolution}, which this model does not support.`, 'size');
    }
    if (!caps.aspectRatios.includes(parsed.aspectRatio)) {
      throw badRequest('unsupported_aspect_ratio', `Size '${size}' is aspect ratio ${parsed.aspectRatio}, which this model does not support.`, 'size');
    }
    return { width: parsed.width, height: parsed.height, resolution: parsed.resolution, aspectRatio: parsed.aspectRatio, custom: false };
  }

  if (parsed.kind === 'custom') {
    const { width, height } = parsed;
    const tier = sizeTier(width, height, caps);
    if (aspectRatio !== undefined && aspectRatio !== parsed.tableRatio) {
      const r = parseRatio(aspectRatio);
      if (r === undefined || Math.abs(width / height / r - 1) > 0.01) {
        throw badRequest('size_conflict', `Size '${size}' does not have aspect ratio '${aspectRatio}'.`, 'size');
      }
    }
    if (resolution !== undefined && resolution !== tier) {
      throw badRequest('size_conflict', `Size '${size}' is billed as resolution ${tier}, not '${resolution}'.`, 'size');
    }
    if (!caps.resolutions.includes(tier)) {
      throw badRequest('unsupported_resolution', `Size '${size}' is billed as resolution ${tier}, which this model does not support.`, 'size');
    }
    // An upstream taking an aspect ratio from a fixed list (Replicate's FLUX, Ideogram) is asked for
    // the offered ratio the size has, the answer resized to the size; a ratio it lacks is refused
    // here: the upstream would answer 422, which reads as the member's misconfiguration.
    let ratio = ratioOf(width, height);
    if (caps.customSizeRatios === 'offered') {
      const offered = offeredRatioOf(width, height, caps.aspectRatios);
      if (offered === undefined) {
        throw badRequest(
          'unsupported_aspect_ratio',
          `Size '${size}' is aspect ratio ${ratio}, which this model does not support: a custom size must have one of its aspect ratios (${caps.aspectRatios.join(', ')}).`,
          'size',
        );
      }
      ratio = offered;
    }
    const edges = edgeRange(caps);
    if (Math.min(width, height) < edges.min || Math.max(width, height) > edges.max) {
      throw invalidSize(size!, `this model renders each edge at ${edges.min} to ${edges.max} px`);
    }
    return { width, height, resolution: tier, aspectRatio: ratio, custom: true };
  }

  const res = resolution ?? caps.resolutions[0];
  const ratio = aspectRatio ?? (caps.aspectRatios.includes('1:1') || caps.aspectRatios.length === 0 ? '1:1' : caps.aspectRatios[0]);
  if (res === undefined || ratio === undefined) {
    throw badRequest('unsupported_resolution', 'This model offers no resolution.', 'resolution');
  }
  const px = tableSize(res, ratio, caps.sizeTable);
  return { width: px.width, height: px.height, resolution: res, aspectRatio: ratio, custom: false };
}
