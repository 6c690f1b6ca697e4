// normalizeImageRequest's defaults where the client leaves a field unset (the contract's descriptions of
// output_format, output_compression and size), and an edit's kept size priced at the tier it is billed at.
import { describe, expect, it } from 'vitest';
import type { ImageCapabilities } from '../../server/catalog/capabilities.ts';
import { normalizeImageRequest } from '../../server/services/image/image-request.ts';
import { thrownApiError } from '../support/api-error.ts';

const caps: ImageCapabilities = {
  resolutions: ['1K', '2K', '4K'],
  aspectRatios: ['1:1', '16:9'],
  outputFormats: ['png', 'jpeg', 'webp'],
  supportsQuality: false,
  supportsTransparentBackground: true,
  maxN: 4,
};
const prices = [
  { resolution: '1K', quality: '', unitPrice: 1_000_000 },
  { resolution: '2K', quality: '', unitPrice: 2_000_000 },
  { resolution: '4K', quality: '', unitPrice: 4_000_000 },
];
const normalize = (body: Record<string, unknown>, c: Partial<ImageCapabilities> = {}, inputSize?: { width: number; height: number }) =>
  normalizeImageRequest({ prompt: 'p', model: 'm', ...body }, { ...caps, ...c }, prices, { sizeParam: 'accept', ...(inputSize && { inputSize }) });

const errorOf = thrownApiError;

describe('normalizeImageRequest, fields left unset', () => {
  it('makes png when output_format is unset, or the model\'s first format when its catalog entry has no png', () => {
    expect(normalize({}).params.outputFormat).toBe('png');
    expect(normalize({}, { outputFormats: ['jpeg', 'webp'] }).params.outputFormat).toBe('jpeg');
    // Compression then applies to that default.
    expect(normalize({ output_compression: 40 }, { outputFormats: ['webp'] }).params).toMatchObject({ outputFormat: 'webp', outputCompression: 40 });
  });

  it('says why output_compression is refused when output_format was left unset', () => {
    const err = errorOf(() => normalize({ output_compression: 40 }));
    expect([err.status, err.code, err.param]).toEqual([400, 'output_compression_requires_jpeg_or_webp', 'output_compression']);
    expect(err.message).toContain("output_format is unset, which means 'png'");
    expect(errorOf(() => normalize({ output_format: 'png', output_compression: 40 })).message).toContain("got 'png'");
  });

  it("prices a generation with no size at the model's first tier, 1:1", () => {
    expect(normalize({})).toMatchObject({ unitPrice: 1_000_000, params: { width: 1248, height: 1248, resolution: '1K', aspectRatio: '1:1' } });
    expect(normalize({}, { resolutions: ['2K', '4K'] })).toMatchObject({ unitPrice: 2_000_000, params: { resolution: '2K' } });
  });

  it("prices an edit's kept size at the tier it is billed at: the smallest larger one offered, or the largest with the size scaled to it", () => {
    expect(normalize({}, { resolutions: ['2K', '4K'] }, { width: 512, height: 512 })).toMatchObject({ unitPrice: 2_000_000, params: { width: 512, height: 512, resolution: '2K' } });
    const scaled = normalize({}, { resolutions: ['1K'] }, { width: 3000, height: 2000 });
    expect(scaled).toMatchObject({ unitPrice: 1_000_000, params: { resolution: '1K' } });
    expect(scaled.params.width * scaled.params.height).toBeLessThanOrEqual(1248 * 1248);
  });
});
