/**
 * What each Seedream version takes as `size` (upstream-apis.md §5.1), and the size the adapter asks
 * for to deliver the pixels a client was promised (the product's size table or a custom size).
 *
 *   4.0        tiers 1K, 2K, 4K; WxH of 921,600 to 16,777,216 pixels
 *   4.5        tiers 2K, 4K;     WxH of 3,686,400 to 16,777,216 pixels
 *   5.0 lite   tiers 2K, 3K;     WxH of 3,686,400 to 10,404,496 pixels; `output_format` png or jpeg
 *
 * (Comfy-Org/docs' router schema gives 4.0's floor as 1024x1024 and 5.0 lite's ceiling as ~3072x3072;
 * the official 1K and 3K tables hold sizes outside both, so the reference's figures stand.)
 *
 * The size asked for, in order: the promised size itself when the version takes it (the answer then
 * needs no resampling); else the official recommended size of that ratio (§5.1's tables, the
 * doc's swapped 4:3/3:4 and 3:2/2:3 put right) at the smallest tier of the version at least as
 * large, or its largest; else (a custom ratio no table has) the promised size scaled into the
 * version's pixel range. The adapter then resizes the answer to the promised size (fitImage).
 * Model ids are matched without Volcengine's `doubao-` prefix; an endpoint id (`ep-…`) or an
 * unknown model gets what all three versions take.
 */

export interface SeedreamVersion {
  name: string;
  minPixels: number;
  maxPixels: number;
  /** Official recommended sizes, by tier and ratio, smallest tier first. */
  tiers: readonly string[];
  /** `output_format: png` (5.0 lite; 4.x always answer JPEG). */
  png: boolean;
}

/** Ratio → `WxH` per tier, landscape wider than tall. */
const TABLES: Readonly<Record<string, Readonly<Record<string, string>>>> = {
  '1K': { '1:1': '1024x1024', '4:3': '1152x864', '3:4': '864x1152', '16:9': '1280x720', '9:16': '720x1280', '3:2': '1248x832', '2:3': '832x1248', '21:9': '1512x648' },
  '2K': { '1:1': '2048x2048', '4:3': '2304x1728', '3:4': '1728x2304', '16:9': '2848x1600', '9:16': '1600x2848', '3:2': '2496x1664', '2:3': '1664x2496', '21:9': '3136x1344' },
  '3K': { '1:1': '3072x3072', '4:3': '3456x2592', '3:4': '2592x3456', '16:9': '4096x2304', '9:16': '2304x4096', '3:2': '3744x2496', '2:3': '2496x3744', '21:9': '4704x2016' },
  '4K': { '1:1': '4096x4096', '4:3': '4704x3520', '3:4': '3520x4704', '16:9': '5504x3040', '9:16': '3040x5504', '3:2': '4992x3328', '2:3': '3328x4992', '21:9': '6240x2656' },
};

const V4_0: SeedreamVersion = { name: 'Seedream 4.0', minPixels: 921_600, maxPixels: 16_777_216, tiers: ['1K', '2K', '4K'], png: false };
const V4_5: SeedreamVersion = { name: 'Seedream 4.5', minPixels: 3_686_400, maxPixels: 16_777_216, tiers: ['2K', '4K'], png: false };
const V5_0_LITE: SeedreamVersion = { name: 'Seedream 5.0 lite', minPixels: 3_686_400, maxPixels: 10_404_496, tiers: ['2K', '3K'], png: true };
/** What every version takes: an endpoint id or an unknown model. */
const COMMON: SeedreamVersion = { name: 'Seedream', minPixels: 3_686_400, maxPixels: 10_404_496, tiers: ['2K'], png: false };

export function seedreamVersion(model: string): SeedreamVersion {
  const id = model.replace(/^doubao-/, '');
  if (id.startsWith('seedream-4-0')) return V4_0;
  if (id.startsWith('seedream-4-5')) return V4_5;
  if (/^seedream-5-0-\d/.test(id)) return V5_0_LITE;
  return COMMON;
}

const accepts = (v: SeedreamVersion, width: number, height: number) =>
  width * height >= v.minPixels && width * height <= v.maxPixels && Math.max(width / height, height / width) <= 16;

/** The `size` to ask `version` for to deliver `width`x`height` of `aspectRatio` (see above). */
export function seedreamSize(version: SeedreamVersion, width: number, height: number, aspectRatio: string): string {
  if (accepts(version, width, height)) return `${width}x${height}`;
  const sized = version.tiers.map((tier) => TABLES[tier]![aspectRatio]).filter((s): s is string => s !== undefined);
  if (sized.length > 0) return sized.find((s) => pixels(s) >= width * height) ?? sized.at(-1)!;
  const up = width * height < version.minPixels;
  const k = Math.sqrt((up ? version.minPixels : version.maxPixels) / (width * height));
  const round = up ? Math.ceil : Math.floor;
  return `${round(width * k)}x${round(height * k)}`;
}

function pixels(size: string): number {
  const [w, h] = size.split('x').map(Number) as [number, number];
  return w * h;
}
