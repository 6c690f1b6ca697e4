/**
 * The default prices of the shipped Seedance definitions (server/catalog/definitions/ark/) cover
 * what Ark bills for the video, whatever ratio and duration a client asks for: Ark bills output
 * tokens, width x height x frames / 1024 with 24 x seconds + 1 frames (upstream-apis.md §5.2: 1080p
 * 16:9 for 5 s is 246,840 completion tokens = 1920 x 1088 x 121 / 1024), at the list price per
 * million tokens each definition's notes state. Priced from the 16:9 size and 24 frames a second,
 * the 21:9 and 4:3 sizes and the extra frame were charged below cost.
 */
import { describe, expect, it } from 'vitest';
import { loadCatalogDefinitions } from '../../server/catalog/catalog-definitions.ts';

type SizeTable = Record<string, Record<string, [number, number]>>;

/** Output sizes of Seedance 1.0 (pro, pro fast, lite): §5.2's "Output pixel sizes" (the Volcengine tutorial). */
const SIZES_1_0: SizeTable = {
  '480p': { '16:9': [864, 480], '4:3': [736, 544], '1:1': [640, 640], '3:4': [544, 736], '9:16': [480, 864], '21:9': [960, 416] },
  '720p': { '16:9': [1248, 704], '4:3': [1120, 832], '1:1': [960, 960], '3:4': [832, 1120], '9:16': [704, 1248], '21:9': [1504, 640] },
  '1080p': { '16:9': [1920, 1088], '4:3': [1664, 1248], '1:1': [1440, 1440], '3:4': [1248, 1664], '9:16': [1088, 1920], '21:9': [2176, 928] },
};

/**
 * Output sizes of Seedance 1.5 pro, from the same table. Also 2.0's and 2.0 fast's (ASSUMPTION: the
 * reference has no 2.0 column; third-party copies of the 2.0 API list these very 480p and 720p sizes).
 */
const SIZES_1_5: SizeTable = {
  '480p': { '16:9': [864, 496], '4:3': [752, 560], '1:1': [640, 640], '3:4': [560, 752], '9:16': [496, 864], '21:9': [992, 432] },
  '720p': { '16:9': [1280, 720], '4:3': [1112, 834], '1:1': [960, 960], '3:4': [834, 1112], '9:16': [720, 1280], '21:9': [1470, 630] },
  '1080p': { '16:9': [1920, 1080], '4:3': [1664, 1248], '1:1': [1440, 1440], '3:4': [1248, 1664], '9:16': [1080, 1920], '21:9': [2206, 946] },
};

const sizesOf = (upstreamModel: string): SizeTable => (/seedance-1-0-/.test(upstreamModel) ? SIZES_1_0 : SIZES_1_5);

/** The tokens Ark bills for a video of `seconds` at 24 frames a second. */
const tokens = (width: number, height: number, seconds: number) => (width * height * (24 * seconds + 1)) / 1024;

/** USD (= credits) per token: the list price the notes state, per million tokens. */
function ratePerToken(notes: string): number {
  const m = /USD (\d+(?:\.\d+)?) per million tokens/.exec(notes);
  if (!m) throw new Error(`the notes state no list price per million tokens: ${notes}`);
  return Number(m[1]) / 1e6;
}

const definitions = loadCatalogDefinitions().filter((d) => d.provider === 'ark' && d.model.kind === 'video');

describe('Seedance default prices', () => {
  it('are checked for every shipped Seedance definition', () => {
    expect(definitions.map((d) => d.upstreamModel).sort()).toEqual([
      'dreamina-seedance-2-0-260128',
      'dreamina-seedance-2-0-fast-260128',
      'seedance-1-0-lite-i2v-250428',
      'seedance-1-0-lite-t2v-250428',
      'seedance-1-0-pro-250528',
      'seedance-1-0-pro-fast-251015',
      'seedance-1-5-pro-251215',
    ]);
  });

  it('count tokens as the reference\'s example does', () => {
    const [w, h] = SIZES_1_0['1080p']!['16:9']!;
    expect(tokens(w, h, 5)).toBe(246_840);
  });

  it.each(definitions.map((d) => [d.id, d] as const))('%s charges at least Ark\'s cost for every resolution, ratio and duration it offers', (_id, def) => {
    const caps = def.model.video!;
    const sizes = sizesOf(def.upstreamModel);
    const rate = ratePerToken(def.notes);
    expect(def.model.pricing.map((row) => row.resolution).sort()).toEqual([...caps.resolutions].sort());
    for (const row of def.model.pricing) {
      expect(row.mode).toBe('per_second');
      // The shortest duration costs the most a second (its extra frame is shared by fewest seconds).
      for (const seconds of caps.durations) {
        for (const ratio of caps.aspect_ratios) {
          const [w, h] = sizes[row.resolution]![ratio]!;
          const cost = tokens(w, h, seconds) * rate;
          expect(row.unit_price * seconds, `${row.resolution} ${ratio} ${seconds} s (${w}x${h}): cost ${cost.toFixed(6)}`).toBeGreaterThanOrEqual(cost);
        }
      }
    }
  });
});
