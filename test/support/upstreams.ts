/**
 * Catalog entries and group members for upstream providers, shared by the adapter tests and the
 * benchmarks: a model sold under the upstream's own id and a member pointing at a fake upstream.
 * The Gemini models are the shipped definitions; `sora-2` and `image-pro` stay as the tests made
 * them (the shipped Sora 2 always has audio, the shipped GPT Image models have quality tiers).
 */
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import type { CatalogModelDefinition } from '../../server/catalog/capabilities.ts';
import { encryptSecret } from '../../server/lib/secret-box.ts';
import { fromCredits, MICRO } from '../../server/lib/money.ts';
import { fromAdminImageCapabilities, fromAdminVideoCapabilities } from '../../server/services/admin/admin-mappers.ts';
import { newId } from '../../server/lib/ids.ts';

/** `sora-2` as OpenAI's /v1/videos wire format can express it: 4/8/12 s, 16:9 and 9:16, first frame. */
export const SORA_2: CatalogModelDefinition = {
  id: 'sora-2',
  kind: 'video',
  displayName: 'Sora 2 (OpenAI-compatible upstream)',
  capabilities: {
    durations: [4, 8, 12],
    aspectRatios: ['16:9', '9:16'],
    resolutions: ['720p'],
    frames: 'first-only',
    referenceImages: { maxCount: 0, configurable: false },
    audio: { supported: true, defaultEnabled: true },
  },
  prices: [{ resolution: '720p', quality: '', mode: 'per_second', unitPrice: Math.round(0.1 * MICRO) }],
};

/** `image-pro` as sold by an operator whose OpenAI-compatible upstream calls it `gpt-image-1.5`: 1K only (1024x1024, 1536x1024, 1024x1536). */
export const IMAGE_PRO: CatalogModelDefinition = {
  id: 'image-pro',
  kind: 'image',
  displayName: 'Image Pro (OpenAI-compatible upstream)',
  capabilities: { resolutions: ['1K'], aspectRatios: ['1:1', '3:2', '2:3'], outputFormats: ['png', 'jpeg', 'webp'], supportsQuality: false, supportsTransparentBackground: false, maxN: 4 },
  prices: [{ resolution: '1K', quality: '', mode: 'per_item', unitPrice: Math.round(0.04 * MICRO) }],
};

/** A plain image model `id` (1K, 1:1, PNG, up to 4 images, 1 credit each) for tests that map it to an upstream model of their own. */
export function plainImageModel(id: string): CatalogModelDefinition {
  return {
    id,
    kind: 'image',
    displayName: id,
    capabilities: { resolutions: ['1K'], aspectRatios: ['1:1'], outputFormats: ['png'], supportsQuality: false, supportsTransparentBackground: false, maxN: 4 },
    prices: [{ resolution: '1K', quality: '', mode: 'per_item', unitPrice: MICRO }],
  };
}

/** An upstream member of `provider` with an encrypted `credentials` object, serving `models`. */
export async function addUpstreamMember(
  db: Kysely<DB>,
  secretKey: Buffer,
  o: {
    groupId: string;
    provider: 'openai' | 'gemini';
    baseUrl: string;
    credentials: Record<string, string>;
    models: string[];
    name?: string;
    modelMap?: Record<string, string>;
    priority?: number;
    weight?: number;
    concurrencyLimit?: number | null;
  },
): Promise<{ id: string }> {
  const id = newId('mem');
  await db
    .insertInto('groupMembers')
    .values({
      id,
      groupId: o.groupId,
      name: o.name ?? `${o.provider}-${id.slice(4, 12).toLowerCase()}`,
      provider: o.provider,
      baseUrl: o.baseUrl,
      models: o.models,
      modelMap: JSON.stringify(o.modelMap ?? {}),
      priority: o.priority ?? 0,
      weight: o.weight ?? 1,
      concurrencyLimit: o.concurrencyLimit ?? null,
      enabled: true,
      credentialsCiphertext: encryptSecret(secretKey, JSON.stringify(o.credentials)),
    })
    .execute();
  return { id };
}

/** A shipped catalog definition (server/catalog/definitions/) in the shape the factories seed. */
function shipped(id: string): CatalogModelDefinition {
  const model = findCatalogDefinition(id)?.model;
  if (!model) throw new Error(`no shipped catalog definition '${id}'`);
  return {
    id: model.id,
    kind: model.kind,
    displayName: model.display_name,
    capabilities: model.kind === 'image' ? fromAdminImageCapabilities(model.image!) : fromAdminVideoCapabilities(model.video!),
    prices: model.pricing.map((p) => ({ resolution: p.resolution, quality: p.quality ?? '', mode: p.mode, unitPrice: fromCredits(p.unit_price)! })),
  };
}

/** Nano Banana as shipped: Google's official 1K sizes, at most 3 input images. */
export const NANO_BANANA = shipped('gemini/gemini-2.5-flash-image');

/** Nano Banana Pro as shipped: 1K/2K/4K on Google's official table, at most 14 input images. */
export const NANO_BANANA_PRO = shipped('gemini/gemini-3-pro-image-preview');

/** Veo 3.1 as shipped: 4/6/8 s, but 8 s only with 1080p/4k, a last frame or reference images; audio always on. */
export const VEO_31 = shipped('gemini/veo-3.1-generate-preview');
