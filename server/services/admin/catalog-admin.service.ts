/**
 * Admin rules for the model catalog: capabilities are fixed at creation (except a configurable
 * reference-image limit and an image model's upstream settings: `resize`, `edits`,
 * `custom_size_ratios`, `min_edge`, `max_edge`); price rows must match the capabilities exactly and are replaced whole.
 */
import type { components } from '../../../generated/api.d.ts';
import type { ImageCapabilities, VideoCapabilities } from '../../catalog/capabilities.ts';
import { ApiError, badRequest, conflict } from '../../errors.ts';
import { CUSTOM_SIZE_LIMITS, SIZE_TABLES, resolveImageSize } from '../image/image-size.ts';
import type { Transactor } from '../../db/transaction.ts';
import type { CatalogRepository, PriceValues } from '../../repositories/catalog.repository.ts';
import { fromCredits } from '../../lib/money.ts';
import { MappingError, checkMapping, type MappingKind, type UpstreamMappings } from '../../providers/kit/mapping.ts';
import {
  fromAdminImageCapabilities,
  fromAdminVideoCapabilities,
  toAdminCatalogModel,
  type AdminCatalogModel,
  type AdminPriceRow,
} from './admin-mappers.ts';

type Schemas = components['schemas'];
export type CatalogModelCreateInput = Omit<Schemas['AdminCatalogModelCreate'], 'enabled'> & { enabled?: boolean };
export type CatalogModelUpdateInput = Schemas['AdminCatalogModelUpdate'];

const QUALITY_TIERS = ['low', 'medium', 'high'] as const;
const modelNotFound = () => new ApiError(404, 'model_not_found', 'No catalog model has this id.');
const invalidPricing = (detail: string) => badRequest('invalid_request', `Invalid 'pricing': ${detail}`, 'pricing');

/** Checks price rows against the capabilities (one row per required slot, nothing else) and converts them. */
export function validatePricing(kind: 'image' | 'video', capabilities: ImageCapabilities | VideoCapabilities, rows: readonly AdminPriceRow[]): PriceValues[] {
  const required = new Set<string>();
  if (kind === 'video') {
    for (const r of capabilities.resolutions) required.add(`${r}|`);
  } else {
    const image = capabilities as ImageCapabilities;
    for (const r of image.resolutions) {
      if (image.supportsQuality) for (const q of QUALITY_TIERS) required.add(`${r}|${q}`);
      else required.add(`${r}|`);
    }
  }
  const seen = new Set<string>();
  const values: PriceValues[] = [];
  for (const row of rows) {
    const slot = `${row.resolution}|${row.quality ?? ''}`;
    const label = row.quality === null ? `resolution '${row.resolution}'` : `resolution '${row.resolution}' and quality '${row.quality}'`;
    if (kind === 'video' && row.quality !== null) throw invalidPricing(`video price rows have 'quality' null (${label}).`);
    if (kind === 'image' && row.mode !== 'per_item') throw invalidPricing(`image price rows use mode 'per_item' (${label}).`);
    if (!required.has(slot)) throw invalidPricing(`the model has no ${label} to price.`);
    if (seen.has(slot)) throw invalidPricing(`${label} is priced twice.`);
    seen.add(slot);
    const unitPrice = fromCredits(row.unit_price);
    if (unitPrice === undefined || unitPrice < 0) throw invalidPricing(`the unit price of ${label} must be a non-negative number with at most 6 fractional digits.`);
    values.push({ resolution: row.resolution, quality: row.quality ?? '', mode: row.mode, unitPrice });
  }
  const missing = [...required].filter((slot) => !seen.has(slot)).map((slot) => slot.replace(/\|$/, '').replace('|', '/'));
  if (missing.length > 0) throw invalidPricing(`missing a price for ${missing.join(', ')}.`);
  return values;
}

/**
 * Aspect ratios run from 1:3 to 3:1, the bound of a custom image size (`CUSTOM_SIZE_LIMITS.maxAspectRatio`):
 * the reference table derives a wider ratio's pixels as a sliver (99:1 at 1K is 3840x32), and no
 * upstream renders one. The Gemini tables list their own ratios (1:8) and are checked against those.
 */
function checkRatioBound(ratios: readonly string[], param: string): void {
  const max = CUSTOM_SIZE_LIMITS.maxAspectRatio;
  const wide = ratios.filter((ratio) => {
    const [w, h] = ratio.split(':').map(Number) as [number, number];
    return Math.max(w / h, h / w) > max;
  });
  if (wide.length > 0) throw badRequest('invalid_request', `Aspect ratios must lie between 1:${max} and ${max}:1; outside: ${wide.join(', ')}.`, param);
}

/**
 * Every size the model offers (each tier at each ratio) lies within its upstream's edges
 * (`minEdge`/`maxEdge`): a size outside them would be held for and refused upstream, a 422 that
 * faults the member. `param` names the bound it breaks.
 */
function checkEdges(caps: ImageCapabilities): void {
  const { minEdge, maxEdge } = caps;
  if (minEdge === undefined && maxEdge === undefined) return;
  if (minEdge !== undefined && maxEdge !== undefined && minEdge > maxEdge) {
    throw badRequest('invalid_request', `'min_edge' (${minEdge}) is larger than 'max_edge' (${maxEdge}).`, 'image.min_edge');
  }
  for (const resolution of caps.resolutions) {
    for (const aspectRatio of caps.aspectRatios) {
      const { width, height } = resolveImageSize({ resolution, aspectRatio, caps, sizeParam: 'accept' });
      const [short, long] = [Math.min(width, height), Math.max(width, height)];
      if (minEdge !== undefined && short < minEdge) {
        throw badRequest('invalid_request', `${resolution} ${aspectRatio} is ${width}x${height}, an edge under 'min_edge' (${minEdge} px); leave that ratio or tier out.`, 'image.min_edge');
      }
      if (maxEdge !== undefined && long > maxEdge) {
        throw badRequest('invalid_request', `${resolution} ${aspectRatio} is ${width}x${height}, an edge over 'max_edge' (${maxEdge} px); leave that ratio or tier out.`, 'image.max_edge');
      }
    }
  }
}

function capabilitiesFor(input: CatalogModelCreateInput): ImageCapabilities | VideoCapabilities {
  const other = input.kind === 'image' ? 'video' : 'image';
  if (input[other] !== undefined && input[other] !== null) {
    throw badRequest('invalid_request', `An ${input.kind} model takes '${input.kind}' capabilities; leave '${other}' out or null.`, other);
  }
  if (input.kind === 'image') {
    if (!input.image) throw badRequest('invalid_request', "An image model needs 'image' capabilities.", 'image');
    const caps = fromAdminImageCapabilities(input.image);
    // A tier outside the model's size table could never be served (`512` is only in gemini-3.1-flash-image's).
    const tableName = caps.sizeTable ?? 'reference';
    const table = SIZE_TABLES[tableName] as Record<string, Record<string, unknown> | undefined>;
    const tiers = caps.resolutions.filter((r) => !table[r]);
    if (tiers.length > 0) throw badRequest('invalid_request', `Size table '${tableName}' has no ${tiers.join(', ')} tier; it has ${Object.keys(table).join(', ')}.`, 'image.resolutions');
    // A Gemini size table is all the model takes; the reference table derives a size for any ratio within the bound.
    if (caps.sizeTable) {
      const ratios = caps.aspectRatios.filter((a) => caps.resolutions.some((r) => !table[r]![a]));
      if (ratios.length > 0) throw badRequest('invalid_request', `Size table '${caps.sizeTable}' has no ${ratios.join(', ')} size at every tier the model offers.`, 'image.aspect_ratios');
    } else checkRatioBound(caps.aspectRatios, 'image.aspect_ratios');
    checkEdges(caps);
    return caps;
  }
  if (!input.video) throw badRequest('invalid_request', "A video model needs 'video' capabilities.", 'video');
  if (input.video.audio.default_enabled && !input.video.audio.supported) {
    throw badRequest('invalid_request', "'audio.default_enabled' requires 'audio.supported'.", 'video.audio.default_enabled');
  }
  if (input.video.audio.always_on && !input.video.audio.default_enabled) {
    throw badRequest('invalid_request', "'audio.always_on' requires 'audio.default_enabled'.", 'video.audio.always_on');
  }
  checkRatioBound(input.video.aspect_ratios, 'video.aspect_ratios');
  for (const c of input.video.duration_constraints ?? []) {
    const stray = [...c.durations.filter((d) => !input.video!.durations.includes(d)), ...(c.resolutions ?? []).filter((r) => !input.video!.resolutions.includes(r))];
    if (stray.length > 0) throw badRequest('invalid_request', `'duration_constraints' name durations or resolutions the model does not offer: ${stray.join(', ')}.`, 'video.duration_constraints');
    if (!c.resolutions?.length && !c.last_frame && !c.reference_images) {
      throw badRequest('invalid_request', "Each duration constraint needs a condition: 'resolutions', 'last_frame' or 'reference_images'.", 'video.duration_constraints');
    }
  }
  return fromAdminVideoCapabilities(input.video);
}

/**
 * Checks every mapping of `mappings` (400 invalid_mapping naming the bad part) and returns them as
 * stored; `null` entries (an update removing a provider's mapping) are passed through.
 */
async function checkedMappings<M extends Partial<Record<MappingKind, unknown>>>(modelKind: 'image' | 'video', mappings: M): Promise<M> {
  const saved: Record<string, unknown> = {};
  for (const [provider, mapping] of Object.entries(mappings)) {
    saved[provider] = mapping;
    if (mapping === null || mapping === undefined) continue;
    // Saved as shown: the default media form written out, whichever path (create or update) set it.
    saved[provider] = { ...(mapping as object), media: (mapping as { media?: string }).media ?? 'url' };
    try {
      await checkMapping(provider as MappingKind, modelKind, mapping as UpstreamMappings[MappingKind] & object);
    } catch (err) {
      if (!(err instanceof MappingError)) throw err;
      const param = `upstream_mappings.${provider}.${err.path}`;
      throw badRequest('invalid_mapping', `'${param}' ${err.message}`, param);
    }
  }
  return saved as M;
}

export class CatalogAdminService {
  constructor(
    private readonly catalog: CatalogRepository,
    private readonly tx: Transactor,
  ) {}

  async list(kind?: Schemas['AdminModelKind']): Promise<Schemas['AdminCatalogModelList']> {
    return { data: (await this.catalog.listModelsWithPrices(kind)).map(toAdminCatalogModel) };
  }

  async get(id: string): Promise<AdminCatalogModel> {
    const row = await this.catalog.findModelWithPrices(id);
    if (!row) throw modelNotFound();
    return toAdminCatalogModel(row);
  }

  async create(input: CatalogModelCreateInput): Promise<AdminCatalogModel> {
    const capabilities = capabilitiesFor(input);
    const prices = validatePricing(input.kind, capabilities, input.pricing);
    const upstreamMappings = await checkedMappings(input.kind, input.upstream_mappings ?? {});
    await this.tx.run(async (trx) => {
      const row = await this.catalog.insertModel({ id: input.id, kind: input.kind, displayName: input.display_name, enabled: input.enabled ?? true, capabilities, upstreamMappings }, trx);
      if (!row) throw conflict('conflict', `A catalog model with id '${input.id}' already exists.`, {}, 'id');
      await this.catalog.replacePrices(input.id, prices, trx);
    });
    return this.get(input.id);
  }

  /** Changes name, enabled flag, prices (all rows at once), the reference-image limit and an image model's upstream settings (resize, edits, custom-size ratios, edges) in one transaction. */
  async update(id: string, input: CatalogModelUpdateInput): Promise<AdminCatalogModel> {
    if (Object.values(input).every((v) => v === undefined)) throw badRequest('invalid_request', 'Send at least one member to change.');
    await this.tx.run(async (trx) => {
      const model = await this.catalog.findModelForUpdate(id, trx);
      if (!model) throw modelNotFound();
      const kind = model.kind as 'image' | 'video';
      let capabilities = model.capabilities as unknown as ImageCapabilities | VideoCapabilities;
      if (input.reference_image_max_count !== undefined) {
        const video = kind === 'video' ? (capabilities as VideoCapabilities) : undefined;
        if (!video?.referenceImages.configurable) {
          throw badRequest(
            'invalid_request',
            `The reference-image limit of '${id}' is not configurable.`,
            'reference_image_max_count',
          );
        }
        // The model's limit at creation (its definition's) is what its upstream takes: it can be lowered, not raised past it.
        const ceiling = video.referenceImages.ceiling ?? video.referenceImages.maxCount;
        if (input.reference_image_max_count > ceiling) {
          throw badRequest(
            'invalid_request',
            `'${id}' takes at most ${ceiling} reference images (its limit when it was created); the limit can be lowered, not raised past that.`,
            'reference_image_max_count',
          );
        }
        // The ceiling is written with the lowered limit: a model stored before it was recorded keeps it for the next raise.
        capabilities = { ...video, referenceImages: { ...video.referenceImages, maxCount: input.reference_image_max_count, ceiling } };
      }
      // An image model's upstream settings, each stored only when it is not the default, as on
      // creation (fromAdminImageCapabilities).
      const imageSettings = (['resize', 'edits', 'custom_size_ratios', 'min_edge', 'max_edge'] as const).filter((k) => input[k] !== undefined);
      if (imageSettings.length > 0) {
        if (kind !== 'image') throw badRequest('invalid_request', `'${imageSettings[0]}' is a setting of image models; '${id}' is a ${kind} model.`, imageSettings[0]);
        const image = { ...(capabilities as ImageCapabilities) };
        if (input.resize !== undefined) {
          delete image.resize;
          if (input.resize === 'native') image.resize = 'native';
        }
        if (input.edits !== undefined) {
          delete image.edits;
          if (!input.edits) image.edits = false;
        }
        if (input.custom_size_ratios !== undefined) {
          delete image.customSizeRatios;
          if (input.custom_size_ratios === 'offered') image.customSizeRatios = 'offered';
        }
        if (input.min_edge !== undefined) {
          delete image.minEdge;
          if (input.min_edge !== null) image.minEdge = input.min_edge;
        }
        if (input.max_edge !== undefined) {
          delete image.maxEdge;
          if (input.max_edge !== null) image.maxEdge = input.max_edge;
        }
        checkEdges(image);
        capabilities = image;
      }
      const capabilitiesChanged = input.reference_image_max_count !== undefined || imageSettings.length > 0;
      const prices = input.pricing === undefined ? undefined : validatePricing(kind, capabilities, input.pricing);
      let upstreamMappings: UpstreamMappings | undefined;
      if (input.upstream_mappings !== undefined) {
        const changes = await checkedMappings(kind, input.upstream_mappings);
        const merged: Record<string, unknown> = { ...(model.upstreamMappings as UpstreamMappings) };
        for (const [provider, mapping] of Object.entries(changes)) {
          if (mapping === null) delete merged[provider];
          else if (mapping !== undefined) merged[provider] = mapping;
        }
        upstreamMappings = merged as UpstreamMappings;
        // A member left out of this model for a misconfiguration (a 422 from a bad mapping) gets
        // another chance as soon as the operator saves a new mapping for its provider.
        await this.catalog.clearMappingFaults(id, Object.keys(changes), trx);
      }
      await this.catalog.updateModel(
        id,
        { displayName: input.display_name, enabled: input.enabled, capabilities: capabilitiesChanged ? capabilities : undefined, upstreamMappings },
        trx,
      );
      if (prices) await this.catalog.replacePrices(id, prices, trx);
    });
    return this.get(id);
  }
}
