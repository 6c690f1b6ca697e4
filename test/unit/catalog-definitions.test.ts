/**
 * The shipped catalog definitions (server/catalog/definitions/): each is a body the admin API
 * accepts, and offers only what its provider's adapter can send upstream; the loader finds a new
 * file without any code change and names the file of a broken one.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { checkBody } from '../../scripts/admin/contract.ts';
import { findCatalogDefinition, loadCatalogDefinitions, type CatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { geminiAspectRatio } from '../../server/providers/gemini/gemini-image.provider.ts';
import { klingImageRatio } from '../../server/providers/kling/kling-image.provider.ts';
import { upstreamImageSize } from '../../server/providers/openai/openai-image.provider.ts';
import { createProviderRegistry } from '../../server/providers/registry.ts';
import type { VideoShape } from '../../server/providers/types.ts';
import { SIZE_TABLES } from '../../server/services/image/image-size.ts';

const shipped = loadCatalogDefinitions();
const video = shipped.filter((d) => d.model.kind === 'video');
const image = shipped.filter((d) => d.model.kind === 'image');
// The adapters of this build (nothing is rendered or sent: only their `check` runs).
const registry = createProviderRegistry({ mediaDir: join(tmpdir(), 'catalog-definitions-unused'), localRenderDelayMs: 0 });

/** Every request shape a video definition admits: each duration, ratio and resolution, with each input it takes. */
function admittedShapes(def: CatalogDefinition): VideoShape[] {
  const caps = def.model.video!;
  const constrained = (durations: number[], when: (c: NonNullable<typeof caps.duration_constraints>[number]) => boolean | undefined) =>
    (caps.duration_constraints ?? []).filter(when).reduce((allowed, c) => allowed.filter((d) => c.durations.includes(d)), durations);
  const shapes: VideoShape[] = [];
  for (const resolution of caps.resolutions) {
    const durations = constrained(caps.durations, (c) => c.resolutions?.includes(resolution));
    for (const durationSeconds of durations) {
      for (const aspectRatio of caps.aspect_ratios) {
        const base = { durationSeconds, aspectRatio, resolution, hasFirstFrame: false, hasLastFrame: false, referenceImages: 0, referenceVideos: 0, referenceAudios: 0, hasNegativePrompt: false, promptLength: 40, negativePromptLength: 0, generateAudio: caps.audio.default_enabled };
        shapes.push(base);
        if (caps.frames !== 'none') shapes.push({ ...base, hasFirstFrame: true });
        if (caps.frames === 'first-and-optional-last' && constrained([durationSeconds], (c) => c.last_frame).length > 0) shapes.push({ ...base, hasFirstFrame: true, hasLastFrame: true });
        if (caps.reference_images.max_count > 0 && constrained([durationSeconds], (c) => c.reference_images).length > 0) shapes.push({ ...base, referenceImages: caps.reference_images.max_count });
      }
    }
  }
  return shapes;
}

describe('shipped catalog definitions', () => {
  it('cover the OpenAI and Google models the adapters serve', () => {
    expect(shipped.map((d) => d.id)).toEqual(
      expect.arrayContaining([
        'openai/gpt-image-1',
        'openai/gpt-image-1.5',
        'openai/sora-2',
        'openai/sora-2-pro',
        'gemini/gemini-2.5-flash-image',
        'gemini/gemini-3-pro-image-preview',
        'gemini/veo-3.1-generate-preview',
      ]),
    );
    for (const def of shipped) expect(def.id, 'a file is named after the catalog id it creates').toBe(`${def.provider}/${def.model.id}`);
  });

  it.each(shipped.map((d) => [d.id, d] as const))('%s is a body POST /admin/v1/models accepts', (_id, def) => {
    expect(() => checkBody('AdminCatalogModelCreate', structuredClone(def.model))).not.toThrow();
    expect(def.notes.length).toBeGreaterThan(40);
  });

  it.each(shipped.map((d) => [d.id, d] as const))('%s is served by an adapter of its provider', (_id, def) => {
    expect(registry[def.model.kind](def.provider), `a ${def.model.kind} adapter of '${def.provider}'`).toBeDefined();
  });

  it.each(video.map((d) => [d.id, d] as const))('%s offers only what its adapter can send upstream', (_id, def) => {
    const adapter = registry.video(def.provider)!;
    const shapes = admittedShapes(def);
    // At least one shape per resolution (a text-only model of one duration and ratio has just that).
    expect(shapes.length).toBeGreaterThanOrEqual(def.model.video!.resolutions.length);
    for (const shape of shapes) expect(adapter.check?.(shape), JSON.stringify(shape)).toBeUndefined();
  });

  it.each(image.filter((d) => d.provider === 'gemini').map((d) => [d.id, d] as const))('%s asks Gemini for ratios and tiers of its own table', (_id, def) => {
    const caps = def.model.image!;
    const table = SIZE_TABLES[caps.size_table!];
    expect(def.upstreamModel.replace(/-preview$/, '')).toBe(caps.size_table);
    for (const resolution of caps.resolutions) {
      for (const ratio of caps.aspect_ratios) {
        const { width, height } = table[resolution]![ratio]!;
        expect(geminiAspectRatio(def.upstreamModel, ratio, width, height), `${resolution} ${ratio}`).toBe(ratio);
      }
    }
  });

  it.each(image.filter((d) => d.provider === 'kling').map((d) => [d.id, d] as const))('%s asks Kling for the very ratios it offers', (_id, def) => {
    const caps = def.model.image!;
    expect(caps.size_table ?? 'reference').toBe('reference');
    for (const resolution of caps.resolutions) {
      for (const ratio of caps.aspect_ratios) {
        const { width, height } = SIZE_TABLES.reference[resolution]![ratio]!;
        expect(klingImageRatio(ratio, width, height), `${resolution} ${ratio}`).toBe(ratio);
      }
    }
  });

  it.each(image.map((d) => [d.id, d] as const))('%s edits only if its upstream reads the input images', (_id, def) => {
    const caps = def.model.image!;
    const mappings = Object.values(def.model.upstream_mappings ?? {}).flatMap((m) => (m ? [m] : []));
    // A mapping that never names `images` would make a picture from the prompt alone, charged as an edit.
    if (mappings.some((m) => !/\bimages\b/.test(m.input))) expect(caps.edits, 'a mapping without images').toBe(false);
    // Kling's image adapter generates from a prompt only.
    if (def.provider === 'kling') expect(caps.edits).toBe(false);
  });

  it.each(image.filter((d) => d.provider === 'replicate').map((d) => [d.id, d] as const))('%s takes custom sizes of its offered ratios only (Replicate takes an aspect_ratio list)', (_id, def) => {
    const mapping = def.model.upstream_mappings!.replicate!;
    if (/\baspect_ratio\b\s*[,}\n]/.test(mapping.input)) expect(def.model.image!.custom_size_ratios).toBe('offered');
  });

  it.each(image.filter((d) => d.provider === 'openai').map((d) => [d.id, d] as const))('%s offers sizes the upstream renders in the same ratio', (_id, def) => {
    const caps = def.model.image!;
    expect(caps.size_table ?? 'reference').toBe('reference');
    for (const resolution of caps.resolutions) {
      for (const ratio of caps.aspect_ratios) {
        const { width, height } = SIZE_TABLES.reference[resolution]![ratio]!;
        const [w, h] = upstreamImageSize(def.upstreamModel, width, height).split('x').map(Number) as [number, number];
        // Resized to the table's size afterwards, never cropped: the upstream's ratio is the one asked for.
        expect(Math.abs(Math.log(w / h) - Math.log(width / height)), `${resolution} ${ratio}: ${w}x${h}`).toBeLessThan(0.01);
      }
    }
  });
});

describe('the definitions loader', () => {
  const dirs: string[] = [];
  afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

  function folder(files: Record<string, string>): string {
    const dir = mkdtempSync(join(tmpdir(), 'catalog-definitions-'));
    dirs.push(dir);
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(join(dir, path, '..'), { recursive: true });
      writeFileSync(join(dir, path), text);
    }
    return dir;
  }
  const body = (id: string) => JSON.stringify({ upstream_model: id, notes: 'n', model: { id, kind: 'image' } });

  it('finds a new file in a provider folder without a code change, and ignores other files', () => {
    const dir = folder({ 'gemini/new-model.json': body('new-model'), 'openai/a.json': body('a'), 'openai/README.md': '# notes' });
    expect(loadCatalogDefinitions(dir).map((d) => [d.id, d.provider, d.upstreamModel])).toEqual([
      ['gemini/new-model', 'gemini', 'new-model'],
      ['openai/a', 'openai', 'a'],
    ]);
    expect(findCatalogDefinition('gemini/new-model', dir)?.model).toEqual({ id: 'new-model', kind: 'image' });
    expect(findCatalogDefinition('gemini/other', dir)).toBeUndefined();
  });

  it.each([
    ['a folder that is no provider kind', { 'midjourney/x.json': body('x') }, "catalog definition 'midjourney/x' (", "'midjourney' is not a provider kind"],
    ['a file that is not JSON', { 'openai/x.json': '{"upstream_model":' }, "catalog definition 'openai/x'", 'not valid JSON'],
    ['an unknown key', { 'openai/x.json': JSON.stringify({ upstream_model: 'x', notes: '', model: {}, price: 1 }) }, 'openai/x', 'unknown key price (a definition has upstream_model, notes, model)'],
    ['no upstream model', { 'openai/x.json': JSON.stringify({ notes: '', model: {} }) }, 'openai/x', "'upstream_model' must be a non-empty string"],
    ['no model body', { 'openai/x.json': JSON.stringify({ upstream_model: 'x', notes: '', model: [] }) }, 'openai/x', "'model' must be the body of POST /admin/v1/models"],
  ])('names the file and the reason for %s', (_what, files, where, why) => {
    const dir = folder(files);
    expect(() => loadCatalogDefinitions(dir)).toThrow(where);
    expect(() => loadCatalogDefinitions(dir)).toThrow(why);
  });
});
