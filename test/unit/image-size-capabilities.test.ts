/**
 * What a model's catalog entry says about the sizes its upstream renders, applied before anything
 * is held: the ratios a custom size may have (`customSizeRatios`), the edges it renders
 * (`minEdge`/`maxEdge`), and the tier of an edit that keeps its input's size on a model with its
 * own pixel table (the tier a `size` of that value gets). The shipped definitions' capabilities are
 * read as the admin API stores them.
 */
import { describe, expect, it } from 'vitest';
import type { ImageCapabilities } from '../../server/catalog/capabilities.ts';
import { findCatalogDefinition, loadCatalogDefinitions, type CatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { fromAdminImageCapabilities } from '../../server/services/admin/admin-mappers.ts';
import { validatePricing } from '../../server/services/admin/catalog-admin.service.ts';
import { normalizeImageRequest, type ImageRequestFields } from '../../server/services/image/image-request.ts';
import { CUSTOM_SIZE_LIMITS, SIZE_TABLES, parseSize, resolveImageSize, type PixelSize } from '../../server/services/image/image-size.ts';
import { thrownApiError } from '../support/api-error.ts';

function shipped(id: string) {
  const def = findCatalogDefinition(id)!;
  return modelOf(def);
}

function modelOf(def: CatalogDefinition) {
  const caps = fromAdminImageCapabilities(def.model.image!);
  const prices = validatePricing('image', caps, def.model.pricing).map((p) => ({ resolution: p.resolution, quality: p.quality, unitPrice: p.unitPrice }));
  const normalize = (body: Partial<ImageRequestFields>, inputSize?: PixelSize) =>
    normalizeImageRequest({ prompt: 'p', model: def.model.id, ...body }, caps, prices, { sizeParam: 'accept', ...(inputSize && { inputSize }) });
  return { caps, prices, normalize };
}

function expectRefused(fn: () => unknown, code: string, param: string, message?: RegExp) {
  const err = thrownApiError(fn);
  expect([err.status, err.code, err.param]).toEqual([400, code, param]);
  if (message) expect(err.message).toMatch(message);
}

const resolve = (caps: ImageCapabilities, over: { size?: string; aspectRatio?: string; resolution?: string; inputSize?: PixelSize }) => resolveImageSize({ sizeParam: 'accept', caps, ...over });

/** Every custom size a request may send, on a coarse grid (edges multiples of 16, within the limits). */
function customSizes(step = 112): PixelSize[] {
  const out: PixelSize[] = [];
  for (let width = 256; width <= 3840; width += step) {
    for (let height = 256; height <= 3840; height += step) {
      try {
        if (parseSize(`${width}x${height}`).kind === 'custom') out.push({ width, height });
      } catch {
        // outside the limits: not a size a request can send
      }
    }
  }
  return out;
}

const withinLimits = ({ width, height }: PixelSize) => Math.max(width, height) <= CUSTOM_SIZE_LIMITS.maxEdge && width * height <= CUSTOM_SIZE_LIMITS.maxPixels;

describe('an edit keeping its input size on a model with its own pixel table', () => {
  const gemini = loadCatalogDefinitions().filter((d) => d.model.kind === 'image' && d.model.image!.size_table && d.model.image!.size_table !== 'reference');

  it('is billed at the tier Google renders: Nano Banana Pro 2K 16:9 (2752x1536) at 2K, not 4K', () => {
    const pro = shipped('gemini/gemini-3-pro-image-preview');
    const kept = pro.normalize({}, { width: 2752, height: 1536 });
    expect([kept.params.width, kept.params.height, kept.params.resolution, kept.unitPrice]).toEqual([2752, 1536, '2K', 134_000]);
    const asSize = pro.normalize({ size: '2752x1536' });
    expect([asSize.params.resolution, asSize.unitPrice]).toEqual(['2K', 134_000]);
  });

  it("is billed at 3.1 Flash's 512 tier for a 512-tier size (688x384, 512x512)", () => {
    const flash = shipped('gemini/gemini-3.1-flash-image-preview');
    for (const inputSize of [{ width: 688, height: 384 }, { width: 512, height: 512 }, { width: 300, height: 200 }]) {
      const kept = flash.normalize({}, inputSize);
      expect([kept.params.width, kept.params.height, kept.params.resolution, kept.unitPrice], JSON.stringify(inputSize)).toEqual([inputSize.width, inputSize.height, '512', 45_000]);
    }
    expect(flash.normalize({}, { width: 1376, height: 768 }).params.resolution).toBe('1K');
  });

  it.each(gemini.map((d) => [d.id, d] as const))('%s: every table value within the limits is billed alike as a kept size and as `size`', (_id, def) => {
    const { caps, normalize } = modelOf(def);
    const table = SIZE_TABLES[caps.sizeTable!];
    let checked = 0;
    for (const tier of caps.resolutions) {
      for (const ratio of caps.aspectRatios) {
        const px = table[tier]![ratio]!;
        if (!withinLimits(px)) continue; // an edit's input larger than the limits is scaled down first
        const asSize = normalize({ size: `${px.width}x${px.height}` });
        const kept = normalize({}, px);
        expect([kept.params.width, kept.params.height, kept.params.resolution, kept.unitPrice], `${tier} ${ratio}`).toEqual([px.width, px.height, tier, asSize.unitPrice]);
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(0);
  });

  it.each(loadCatalogDefinitions().filter((d) => d.model.kind === 'image' && d.model.image!.edits !== false).map((d) => [d.id, d] as const))(
    '%s: a custom size a request may send is kept by an edit at the tier and pixels that `size` gets',
    (_id, def) => {
      const { normalize } = modelOf(def);
      for (const px of customSizes()) {
        let asSize;
        try {
          asSize = normalize({ size: `${px.width}x${px.height}` });
        } catch {
          continue; // a size the model refuses; its edit keeps it at the nearest tier it offers
        }
        const kept = normalize({}, px);
        expect([kept.params.width, kept.params.height, kept.params.resolution, kept.unitPrice], `${px.width}x${px.height}`).toEqual([px.width, px.height, asSize.params.resolution, asSize.unitPrice]);
      }
    },
  );

  it('bills a custom size on its own table at the smallest tier that renders at least its pixels', () => {
    const pro = shipped('gemini/gemini-3-pro-image-preview').caps;
    // 1K 1:1 renders 1024x1024: 1120x1120 needs 2K (rendered larger, scaled down; never scaled up).
    expect(resolve(pro, { size: '1120x1120' })).toMatchObject({ resolution: '2K', custom: true });
    expect(resolve(pro, { size: '1024x1024' })).toMatchObject({ resolution: '1K' });
    expectRefused(() => resolve(pro, { size: '1120x1120', resolution: '1K' }), 'size_conflict', 'size');
    // Gemini 2.5 Flash has 1K only: up to 1248x1248 px stays 1K, as on the reference thresholds.
    const flash = shipped('gemini/gemini-2.5-flash-image').caps;
    expect(resolve(flash, { size: '1232x1232' })).toMatchObject({ resolution: '1K' });
    expect(resolve(flash, { inputSize: { width: 1232, height: 1232 } })).toMatchObject({ width: 1232, height: 1232, resolution: '1K' });
    expect(resolve(flash, { inputSize: { width: 2000, height: 2000 } })).toMatchObject({ width: 1248, height: 1248, resolution: '1K' });
    expectRefused(() => resolve(flash, { size: '2000x2000' }), 'unsupported_resolution', 'size');
  });
});

describe('a table 2.8 value on a model with its own pixel table', () => {
  const gemini = loadCatalogDefinitions().filter((d) => d.model.kind === 'image' && d.model.image!.size_table && d.model.image!.size_table !== 'reference');

  it('is billed as the custom size it is on Nano Banana 2: 1248x1248 at 2K as 1232x1232, not 1K and scaled up', () => {
    const flash = shipped('gemini/gemini-3.1-flash-image-preview');
    const reference = flash.normalize({ size: '1248x1248' });
    const custom = flash.normalize({ size: '1232x1232' });
    expect([reference.params.width, reference.params.height, reference.params.resolution, reference.unitPrice]).toEqual([1248, 1248, '2K', 101_000]);
    expect([custom.params.resolution, custom.unitPrice]).toEqual(['2K', 101_000]);
    // Rendered at 2K 1:1 (2048x2048): at least the delivered pixels, scaled down only.
    const rendered = SIZE_TABLES['gemini-3.1-flash-image']['2K']!['1:1']!;
    expect(rendered.width * rendered.height).toBeGreaterThanOrEqual(1248 * 1248);
    expectRefused(() => resolve(flash.caps, { size: '1248x1248', resolution: '1K' }), 'size_conflict', 'size', /billed as resolution 2K/);
  });

  it("leaves a value of the model's own table as it was", () => {
    const flash = shipped('gemini/gemini-3.1-flash-image-preview').caps;
    expect(resolve(flash, { size: '1024x1024' })).toEqual({ width: 1024, height: 1024, resolution: '1K', aspectRatio: '1:1', custom: false });
    // 2048x2048 is in both tables: the model's own 2K 1:1.
    expect(resolve(flash, { size: '2048x2048' })).toEqual({ width: 2048, height: 2048, resolution: '2K', aspectRatio: '1:1', custom: false });
    expect(resolve(flash, { size: '688x384' })).toMatchObject({ resolution: '512', aspectRatio: '16:9', custom: false });
    // Gemini 2.5 Flash's 1K 3:2 is table 2.8's too.
    expect(resolve(shipped('gemini/gemini-2.5-flash-image').caps, { size: '1248x832' })).toEqual({ width: 1248, height: 832, resolution: '1K', aspectRatio: '3:2', custom: false });
  });

  it('still takes the ratio table 2.8 names for it (21:9 for 1248x528, 1.3 % off)', () => {
    const flash = shipped('gemini/gemini-3.1-flash-image-preview').caps;
    expect(resolve(flash, { size: '1248x528', aspectRatio: '21:9' })).toMatchObject({ width: 1248, height: 528, custom: true });
    expectRefused(() => resolve(flash, { size: '1248x528', aspectRatio: '16:9' }), 'size_conflict', 'size');
  });

  it.each(gemini.map((d) => [d.id, d] as const))('%s: every table 2.8 value is billed as a kept size of that value, rendered at a tier at least as large', (_id, def) => {
    const { caps, normalize } = modelOf(def);
    const own = SIZE_TABLES[caps.sizeTable!];
    const largest = Object.keys(own).filter((t) => caps.resolutions.includes(t)).at(-1);
    let checked = 0;
    for (const row of Object.values(SIZE_TABLES.reference)) {
      for (const px of Object.values(row)) {
        let asSize;
        try {
          asSize = normalize({ size: `${px.width}x${px.height}` });
        } catch {
          continue; // a tier the model does not sell (2.5 Flash: 1K only)
        }
        const kept = normalize({}, px);
        expect([asSize.params.width, asSize.params.height, asSize.params.resolution, asSize.unitPrice], `${px.width}x${px.height}`).toEqual([px.width, px.height, kept.params.resolution, kept.unitPrice]);
        // Below the model's largest tier, the tier it renders holds at least the delivered pixels.
        if (asSize.params.resolution !== largest) {
          const tierRow = own[asSize.params.resolution]!;
          const near = Object.values(tierRow).reduce((a, b) => (Math.abs(Math.log(b.width / b.height / (px.width / px.height))) < Math.abs(Math.log(a.width / a.height / (px.width / px.height))) ? b : a));
          expect(near.width * near.height, `${px.width}x${px.height}`).toBeGreaterThanOrEqual(px.width * px.height);
        }
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(0);
  });
});

describe('a model whose upstream takes only its offered ratios (customSizeRatios: offered)', () => {
  const flux = shipped('replicate/flux-schnell-replicate').caps;
  const ideogram = shipped('replicate/ideogram-v3-turbo-replicate').caps;

  it('refuses a custom size of another ratio before anything is held (Replicate would answer 422)', () => {
    expectRefused(() => resolve(flux, { size: '1280x800' }), 'unsupported_aspect_ratio', 'size', /8:5.*1:1, 3:2/);
    expectRefused(() => resolve(flux, { size: '1024x640' }), 'unsupported_aspect_ratio', 'size', /8:5/);
    expectRefused(() => resolve(ideogram, { size: '1344x576' }), 'unsupported_aspect_ratio', 'size');
  });

  it('asks for the offered ratio a custom size has (within 1 %), delivering the size itself', () => {
    expect(resolve(flux, { size: '1280x720' })).toEqual({ width: 1280, height: 720, resolution: '1K', aspectRatio: '16:9', custom: true });
    expect(resolve(flux, { size: '1264x848' })).toMatchObject({ width: 1264, height: 848, aspectRatio: '3:2' });
    expect(resolve(ideogram, { size: '1024x768' })).toMatchObject({ aspectRatio: '4:3' });
    // Gemini's 1K 16:9 as a `size` (43:24, 0.8 % off 16:9) is asked for as 16:9.
    expect(resolve(flux, { size: '1376x768' })).toMatchObject({ width: 1376, height: 768, aspectRatio: '16:9' });
  });

  it("asks an edit keeping its input's size for the nearest offered ratio", () => {
    expect(resolve(flux, { inputSize: { width: 1000, height: 667 } })).toEqual({ width: 1000, height: 667, resolution: '1K', aspectRatio: '3:2', custom: true });
    expect(resolve(flux, { inputSize: { width: 1000, height: 400 } })).toMatchObject({ aspectRatio: '21:9' });
    expect(resolve(ideogram, { inputSize: { width: 1000, height: 400 } })).toMatchObject({ aspectRatio: '16:9' });
  });

  it('leaves a model without the setting as it was: any ratio, named by its reduced form', () => {
    const { customSizeRatios: _offered, ...any } = flux;
    expect(resolve(any, { size: '1280x800' })).toMatchObject({ aspectRatio: '8:5' });
    expect(resolve(any, { inputSize: { width: 1000, height: 667 } })).toMatchObject({ aspectRatio: '1000:667' });
  });
});

describe("a model with its upstream's edges (minEdge/maxEdge: fal's Seedream, 1024 to 4096 px)", () => {
  const seedream = shipped('fal/seedream-4-fal').caps;

  it('refuses a custom size with an edge outside them (fal would answer 422)', () => {
    for (const size of ['2496x832', '2064x880', '1008x2048']) expectRefused(() => resolve(seedream, { size }), 'invalid_size', 'size', /1024 to 3840 px/);
    expect(resolve(seedream, { size: '2048x1024' })).toMatchObject({ width: 2048, height: 1024, resolution: '2K' });
  });

  it("scales an edit's kept size into them, or refuses it when its ratio cannot fit", () => {
    expect(resolve(seedream, { inputSize: { width: 800, height: 600 } })).toEqual({ width: 1366, height: 1024, resolution: '2K', aspectRatio: '683:512', custom: true });
    expectRefused(() => resolve(seedream, { inputSize: { width: 4000, height: 1000 } }), 'invalid_size', 'size', /4000x1000/);
  });
});
