import { describe, expect, it } from 'vitest';
import type { ImageCapabilities } from '../../server/catalog/capabilities.ts';
import type { ApiError } from '../../server/errors.ts';
import {
  customSizeTier,
  parseSize,
  resolveImageSize,
  SIZE_TABLE,
  type ResolveImageSizeInput,
  type TableAspectRatio,
  type TableResolution,
} from '../../server/services/image/image-size.ts';
import { thrownApiError } from '../support/api-error.ts';

const caps: ImageCapabilities = {
  resolutions: ['1K', '2K', '4K'],
  aspectRatios: ['1:1', '3:2', '2:3', '16:9', '9:16', '4:3', '3:4', '21:9'],
  outputFormats: ['png', 'jpeg', 'webp'],
  supportsQuality: false,
  supportsTransparentBackground: true,
  maxN: 4,
};

const apiError = thrownApiError;

function expectError(fn: () => unknown, code: string, param: string, message?: RegExp): ApiError {
  const err = apiError(fn);
  expect(err.status).toBe(400);
  expect(err.code).toBe(code);
  expect(err.param).toBe(param);
  if (message) expect(err.message).toMatch(message);
  return err;
}

const resolve = (over: Partial<ResolveImageSizeInput>) => resolveImageSize({ sizeParam: 'accept', caps, ...over });

const EDGE = /each edge/;
const PIXELS = /total pixels/;
const RATIO = /aspect ratio/;
const MULTIPLE = /multiples of 16/;

describe('SIZE_TABLE', () => {
  it('is table 2.8', () => {
    expect(SIZE_TABLE['1K']['1:1']).toEqual({ width: 1248, height: 1248 });
    expect(SIZE_TABLE['2K']['16:9']).toEqual({ width: 2048, height: 1152 });
    expect(SIZE_TABLE['4K']['21:9']).toEqual({ width: 3840, height: 1648 });
    const all = (Object.keys(SIZE_TABLE) as TableResolution[]).flatMap((r) =>
      Object.values(SIZE_TABLE[r]).map(({ width, height }) => `${width}x${height}`),
    );
    expect(all).toEqual([
      '1248x1248', '1248x832', '832x1248', '1248x704', '704x1248', '1248x944', '944x1248', '1248x528',
      '2048x2048', '2048x1360', '1360x2048', '2048x1152', '1152x2048', '2048x1536', '1536x2048', '2048x880',
      '2880x2880', '3520x2352', '2352x3520', '3840x2160', '2160x3840', '3312x2496', '2496x3312', '3840x1648',
    ]);
  });

  it('puts every table value in its own row under the custom-size tier rule', () => {
    for (const r of Object.keys(SIZE_TABLE) as TableResolution[]) {
      for (const { width, height } of Object.values(SIZE_TABLE[r])) expect(customSizeTier(width, height)).toBe(r);
    }
  });
});

describe('parseSize', () => {
  it('parses auto', () => {
    expect(parseSize('auto')).toEqual({ kind: 'auto' });
  });

  it('round-trips every table value', () => {
    for (const resolution of Object.keys(SIZE_TABLE) as TableResolution[]) {
      for (const aspectRatio of Object.keys(SIZE_TABLE[resolution]) as TableAspectRatio[]) {
        const { width, height } = SIZE_TABLE[resolution][aspectRatio];
        expect(parseSize(`${width}x${height}`)).toEqual({ kind: 'table', resolution, aspectRatio, width, height });
      }
    }
  });

  it('parses a valid custom size', () => {
    expect(parseSize('1024x640')).toEqual({ kind: 'custom', width: 1024, height: 640 });
    expect(parseSize('1024x1024')).toEqual({ kind: 'custom', width: 1024, height: 1024 });
  });

  it('rejects malformed strings', () => {
    for (const s of ['12x', 'x12', '0x0', '1024X1024', '1024*1024', ' 1024x1024', '1024x1024 ', '', 'AUTO', '-16x1024', '01024x1024', '1024.0x1024', '123456x1024']) {
      expectError(() => parseSize(s), 'invalid_size', 'size', /expected 'auto' or WIDTHxHEIGHT/);
    }
  });

  it('checks each edge at 256 and 3840 px', () => {
    expectError(() => parseSize('255x1024'), 'invalid_size', 'size', EDGE);
    expectError(() => parseSize('1024x255'), 'invalid_size', 'size', EDGE);
    // 256 passes the edge rule (the size then fails another rule: 256 x 1024 is too few pixels).
    const e256 = expectError(() => parseSize('256x1024'), 'invalid_size', 'size', PIXELS);
    expect(e256.message).not.toMatch(EDGE);
    expect(parseSize('3840x2160')).toMatchObject({ kind: 'table' });
    expect(parseSize('3840x2144')).toEqual({ kind: 'custom', width: 3840, height: 2144 });
    expect(parseSize('2144x3840')).toEqual({ kind: 'custom', width: 2144, height: 3840 });
    expectError(() => parseSize('3856x1024'), 'invalid_size', 'size', EDGE);
    expectError(() => parseSize('1024x3856'), 'invalid_size', 'size', EDGE);
    expectError(() => parseSize('3841x1024'), 'invalid_size', 'size', EDGE);
  });

  it('checks total pixels at 655,360 and 8,294,400', () => {
    expect(parseSize('1024x640')).toEqual({ kind: 'custom', width: 1024, height: 640 }); // exactly 655,360
    expect(parseSize('640x1024')).toEqual({ kind: 'custom', width: 640, height: 1024 });
    // 655,359 and 8,294,401 have no factorisation with both edges in 256–3840: these are the closest.
    expectError(() => parseSize('1285x510'), 'invalid_size', 'size', PIXELS); // 655,350
    expectError(() => parseSize('1008x640'), 'invalid_size', 'size', PIXELS); // 645,120, multiples of 16
    expect(parseSize('2880x2880')).toMatchObject({ kind: 'table' }); // exactly 8,294,400
    expect(parseSize('3600x2304')).toEqual({ kind: 'custom', width: 3600, height: 2304 }); // 8,294,400 custom
    expectError(() => parseSize('3586x2313'), 'invalid_size', 'size', PIXELS); // 8,294,418
    expectError(() => parseSize('3840x2176'), 'invalid_size', 'size', PIXELS); // 8,355,840, multiples of 16
  });

  it('checks the aspect ratio at 3:1', () => {
    expect(parseSize('2304x768')).toEqual({ kind: 'custom', width: 2304, height: 768 });
    expect(parseSize('768x2304')).toEqual({ kind: 'custom', width: 768, height: 2304 });
    expectError(() => parseSize('2320x768'), 'invalid_size', 'size', RATIO);
    expectError(() => parseSize('768x2320'), 'invalid_size', 'size', RATIO);
    expectError(() => parseSize('2305x768'), 'invalid_size', 'size', RATIO);
  });

  it('requires multiples of 16', () => {
    expectError(() => parseSize('1000x1000'), 'invalid_size', 'size', MULTIPLE);
    expectError(() => parseSize('1024x1000'), 'invalid_size', 'size', MULTIPLE);
    expectError(() => parseSize('1032x1024'), 'invalid_size', 'size', MULTIPLE);
    expect(parseSize('1040x1024')).toMatchObject({ kind: 'custom' });
  });
});

describe('resolveImageSize', () => {
  it("keeps an edit's input size when the request names no size (rule 0), scaled into the limits, billed at its tier", () => {
    expect(resolve({ inputSize: { width: 1000, height: 600 } })).toEqual({ width: 1000, height: 600, resolution: '1K', aspectRatio: '5:3', custom: true });
    expect(resolve({ size: 'auto', inputSize: { width: 1600, height: 1600 } })).toMatchObject({ width: 1600, height: 1600, resolution: '2K' });
    expect(resolve({ sizeParam: 'reject', inputSize: { width: 1600, height: 1600 } })).toMatchObject({ width: 1600, height: 1600, resolution: '2K' });
    expect(resolve({ inputSize: { width: 8000, height: 4000 } })).toMatchObject({ width: 3840, height: 1920, resolution: '4K' });
    // Any of size, aspectRatio or resolution: the usual rules, the input's size ignored.
    expect(resolve({ resolution: '2K', inputSize: { width: 1000, height: 600 } })).toMatchObject({ width: 2048, height: 2048, custom: false });
    expect(resolve({ aspectRatio: '16:9', inputSize: { width: 1000, height: 600 } })).toMatchObject({ width: 1248, height: 704 });
    expect(resolve({ size: '1024x1024', inputSize: { width: 1000, height: 600 } })).toMatchObject({ width: 1024, height: 1024 });
  });

  it("bills an edit's kept size at the nearest tier the model offers, never one its pixels do not fit", () => {
    // A model without the input's tier but with a larger one: its smallest larger tier, the size kept (not its largest).
    expect(resolve({ caps: { ...caps, resolutions: ['2K', '4K'] }, inputSize: { width: 512, height: 512 } })).toEqual({ width: 512, height: 512, resolution: '2K', aspectRatio: '1:1', custom: true });
    expect(resolve({ caps: { ...caps, resolutions: ['4K'] }, inputSize: { width: 1600, height: 1600 } })).toMatchObject({ width: 1600, height: 1600, resolution: '4K' });
    // Only smaller tiers: its largest, the size scaled down (ratio kept) to that tier's pixels, as an explicit size of that tier would be.
    const oneK = resolve({ caps: { ...caps, resolutions: ['1K'] }, inputSize: { width: 3000, height: 2000 } });
    expect(oneK).toMatchObject({ resolution: '1K', custom: true });
    expect(oneK.width * oneK.height).toBeLessThanOrEqual(1248 * 1248);
    expect(Math.abs(oneK.width / oneK.height - 1.5)).toBeLessThan(0.01);
    expect([oneK.width, oneK.height]).toEqual([1528, 1018]);
    const twoK = resolve({ caps: { ...caps, resolutions: ['1K', '2K'] }, inputSize: { width: 3840, height: 2160 } });
    expect(twoK).toMatchObject({ resolution: '2K' });
    expect(twoK.width * twoK.height).toBeLessThanOrEqual(2048 * 2048);
  });

  it("refuses an edit's size: auto too under IMAGE_SIZE_PARAM=reject (variant A rejects auto)", () => {
    expectError(() => resolve({ size: 'auto', sizeParam: 'reject', inputSize: { width: 1600, height: 1600 } }), 'size_not_accepted', 'size');
  });

  it('defaults to the first resolution and 1:1', () => {
    expect(resolve({})).toEqual({ width: 1248, height: 1248, resolution: '1K', aspectRatio: '1:1', custom: false });
    expect(resolve({ size: 'auto' })).toEqual({ width: 1248, height: 1248, resolution: '1K', aspectRatio: '1:1', custom: false });
    expect(resolve({ caps: { ...caps, resolutions: ['2K', '4K'] } })).toMatchObject({ width: 2048, height: 2048, resolution: '2K' });
  });

  it('defaults the ratio to 1:1 when only a resolution is given', () => {
    expect(resolve({ resolution: '4K' })).toEqual({ width: 2880, height: 2880, resolution: '4K', aspectRatio: '1:1', custom: false });
    expect(resolve({ size: 'auto', resolution: '2K' })).toMatchObject({ width: 2048, height: 2048 });
  });

  it('defaults the resolution to the first one when only a ratio is given', () => {
    expect(resolve({ aspectRatio: '16:9' })).toEqual({ width: 1248, height: 704, resolution: '1K', aspectRatio: '16:9', custom: false });
    expect(resolve({ aspectRatio: '21:9', caps: { ...caps, resolutions: ['4K'] } })).toMatchObject({ width: 3840, height: 1648 });
  });

  it('uses resolution + aspectRatio from the table', () => {
    expect(resolve({ resolution: '2K', aspectRatio: '3:4' })).toEqual({ width: 1536, height: 2048, resolution: '2K', aspectRatio: '3:4', custom: false });
  });

  it('takes the tier and ratio of a table size', () => {
    expect(resolve({ size: '2048x1152' })).toEqual({ width: 2048, height: 1152, resolution: '2K', aspectRatio: '16:9', custom: false });
    expect(resolve({ size: '2048x1152', aspectRatio: '16:9', resolution: '2K' })).toMatchObject({ width: 2048, height: 1152 });
  });

  it('renders a custom size exactly and bills it by pixel count', () => {
    expect(resolve({ size: '1024x640' })).toEqual({ width: 1024, height: 640, resolution: '1K', aspectRatio: '8:5', custom: true });
    expect(resolve({ size: '1248x1248' }).custom).toBe(false);
    expect(resolve({ size: '1264x1232' })).toMatchObject({ resolution: '1K', custom: true }); // 1,557,248 ≤ 1248²
    expect(resolve({ size: '1264x1248' })).toMatchObject({ resolution: '2K', custom: true }); // 1,577,472 > 1248²
    expect(resolve({ size: '2048x2032' })).toMatchObject({ resolution: '2K', custom: true });
    expect(resolve({ size: '2064x2048' })).toMatchObject({ resolution: '4K', custom: true }); // > 2048²
    expect(resolve({ size: '3840x2144' })).toMatchObject({ width: 3840, height: 2144, resolution: '4K', custom: true });
  });

  it('rejects any size in reject mode', () => {
    for (const size of ['auto', '2048x1152', '1024x640', 'garbage']) {
      expectError(() => resolve({ size, sizeParam: 'reject' }), 'size_not_accepted', 'size', /aspectRatio.*resolution/);
    }
    expect(resolve({ sizeParam: 'reject', aspectRatio: '16:9', resolution: '2K' })).toMatchObject({ width: 2048, height: 1152 });
  });

  it('rejects resolutions and ratios the model does not offer', () => {
    expectError(() => resolve({ resolution: '8K' }), 'unsupported_resolution', 'resolution');
    expectError(() => resolve({ resolution: '4K', caps: { ...caps, resolutions: ['1K', '2K'] } }), 'unsupported_resolution', 'resolution');
    expectError(() => resolve({ aspectRatio: '5:4' }), 'unsupported_aspect_ratio', 'aspectRatio');
    // The model's checks come before the size's own validity.
    expectError(() => resolve({ size: '12x', resolution: '8K' }), 'unsupported_resolution', 'resolution');
    expectError(() => resolve({ size: '12x' }), 'invalid_size', 'size');
  });

  it('rejects a size the model cannot produce', () => {
    const small = { ...caps, resolutions: ['1K', '2K'] };
    expectError(() => resolve({ size: '3840x2160', caps: small }), 'unsupported_resolution', 'size');
    expectError(() => resolve({ size: '3840x2144', caps: small }), 'unsupported_resolution', 'size');
    expectError(() => resolve({ size: '1248x528', caps: { ...caps, aspectRatios: ['1:1'] } }), 'unsupported_aspect_ratio', 'size');
  });

  it('detects conflicts of a table size', () => {
    expectError(() => resolve({ size: '2048x1152', aspectRatio: '1:1' }), 'size_conflict', 'size');
    expectError(() => resolve({ size: '2048x1152', resolution: '1K' }), 'size_conflict', 'size');
    expectError(() => resolve({ size: '2048x1152', aspectRatio: '16:9', resolution: '4K' }), 'size_conflict', 'size');
  });

  it('detects conflicts of a custom size', () => {
    // 1920x1088 is 1.7647 vs 16:9 = 1.7778: 0.74 % off → accepted.
    expect(resolve({ size: '1920x1088', aspectRatio: '16:9' })).toMatchObject({ width: 1920, height: 1088, custom: true, resolution: '2K' });
    // 1888x1088 is 2.4 % off 16:9 → conflict.
    expectError(() => resolve({ size: '1888x1088', aspectRatio: '16:9' }), 'size_conflict', 'size');
    expectError(() => resolve({ size: '1024x1024', aspectRatio: '4:3' }), 'size_conflict', 'size');
    expect(resolve({ size: '1024x1024', aspectRatio: '1:1', resolution: '1K' })).toMatchObject({ width: 1024, custom: true });
    expectError(() => resolve({ size: '1024x1024', resolution: '2K' }), 'size_conflict', 'size');
    expect(resolve({ size: '1920x1088', resolution: '2K' })).toMatchObject({ resolution: '2K' });
    expectError(() => resolve({ size: '1920x1088', resolution: '1K' }), 'size_conflict', 'size');
  });
});

describe('model size tables (Gemini: Google official pixel table, upstream-apis.md §3.4)', () => {
  const gemini3: ImageCapabilities = { ...caps, aspectRatios: ['1:1', '16:9', '9:16', '3:2', '21:9'], sizeTable: 'gemini-3-pro-image' };
  const flash: ImageCapabilities = { ...caps, resolutions: ['1K'], aspectRatios: ['1:1', '16:9', '3:2'], sizeTable: 'gemini-2.5-flash-image' };

  it('uses the official sizes, not the reference table', () => {
    expect(resolve({ caps: gemini3 })).toMatchObject({ width: 1024, height: 1024, resolution: '1K', aspectRatio: '1:1' });
    expect(resolve({ aspectRatio: '16:9', caps: gemini3 })).toMatchObject({ width: 1376, height: 768 });
    expect(resolve({ aspectRatio: '16:9', resolution: '2K', caps: gemini3 })).toMatchObject({ width: 2752, height: 1536 });
    expect(resolve({ aspectRatio: '16:9', resolution: '4K', caps: gemini3 })).toMatchObject({ width: 5504, height: 3072 });
    expect(resolve({ aspectRatio: '21:9', caps: gemini3 })).toMatchObject({ width: 1584, height: 672 });
    expect(resolve({ aspectRatio: '16:9', caps: flash })).toMatchObject({ width: 1344, height: 768 });
    expect(resolve({ aspectRatio: '3:2', caps: flash })).toMatchObject({ width: 1248, height: 832 });
  });

  it('reads a size of the model table as that tier and ratio', () => {
    expect(resolve({ size: '1376x768', caps: gemini3 })).toMatchObject({ resolution: '1K', aspectRatio: '16:9', custom: false });
    expect(resolve({ size: '2752x1536', caps: gemini3 })).toMatchObject({ resolution: '2K', aspectRatio: '16:9', custom: false });
    expectError(() => resolve({ size: '1376x768', aspectRatio: '9:16', caps: gemini3 }), 'size_conflict', 'size');
  });
});
