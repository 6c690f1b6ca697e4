/**
 * Every image request a shipped fal or Replicate model accepts is one its upstream takes. A request
 * the gateway accepts but the upstream refuses with 422 is worse than a 400: replicate-api.ts and
 * fal-api.ts read a 422 as the member's misconfiguration, so one client's valid-looking request
 * takes the model off every member serving it for minutes, and the client gets a 502.
 *
 * Enumerated: each shipped mapped image model × `size` (every value of every pixel table and a
 * grid of custom sizes) × `aspectRatio` × `resolution`; each request the gateway accepts
 * (normalizeImageRequest, with the model's capabilities as the admin API stores them) is mapped as
 * the adapter maps it (imageContext + mappedInput), and each distinct upstream input is sent to the
 * fake upstream, which validates it as the vendor does (test/fakes/replicate.ts: Replicate's
 * aspect_ratio lists; test/fakes/fal.ts: fal's image_size bounds). None may be refused.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadCatalogDefinitions, type CatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { imageContext, mappedInput, type UpstreamMapping } from '../../server/providers/kit/mapping.ts';
import type { ImageJob } from '../../server/providers/types.ts';
import { fromAdminImageCapabilities } from '../../server/services/admin/admin-mappers.ts';
import { validatePricing } from '../../server/services/admin/catalog-admin.service.ts';
import { normalizeImageRequest } from '../../server/services/image/image-request.ts';
import { SIZE_TABLES, parseSize } from '../../server/services/image/image-size.ts';
import { startFalFake, type FalFake } from '../fakes/fal.ts';
import { startReplicateFake, type ReplicateFake } from '../fakes/replicate.ts';

let fal: FalFake;
let replicate: ReplicateFake;

beforeAll(async () => {
  fal = await startFalFake({ apiKeys: ['fal-a:secret'], queueMs: 0, jobDurationMs: 0 });
  replicate = await startReplicateFake({ tokens: ['r8_a'], queueMs: 0, jobDurationMs: 0 });
});
afterAll(async () => {
  await fal?.close();
  await replicate?.close();
});

const mapped = loadCatalogDefinitions().filter((d) => d.model.kind === 'image' && (d.provider === 'fal' || d.provider === 'replicate'));

/** Every `size` worth asking: each pixel table's values, a grid of custom sizes, and sizes at the custom limits. */
function sizes(): string[] {
  const out = new Set<string>(['auto', '1024x640', '1280x800', '2496x832', '832x2496', '2064x880', '1536x512', '3840x1280', '3840x2160', '1008x2048']);
  for (const table of Object.values(SIZE_TABLES)) for (const row of Object.values(table)) for (const px of Object.values(row)) out.add(`${px.width}x${px.height}`);
  for (let width = 256; width <= 3840; width += 176) {
    for (let height = 256; height <= 3840; height += 176) {
      try {
        if (parseSize(`${width}x${height}`).kind === 'custom') out.add(`${width}x${height}`);
      } catch {
        // not a size a request can send
      }
    }
  }
  return [...out];
}

/** The distinct upstream inputs of every request the model accepts, each with one request that makes it. */
async function acceptedInputs(def: CatalogDefinition, mapping: UpstreamMapping): Promise<Map<string, { request: object; input: Record<string, unknown> }>> {
  const caps = fromAdminImageCapabilities(def.model.image!);
  const prices = validatePricing('image', caps, def.model.pricing).map((p) => ({ resolution: p.resolution, quality: p.quality, unitPrice: p.unitPrice }));
  const ratios = [undefined, ...new Set([...caps.aspectRatios, '1:1', '3:2', '16:9', '21:9', '4:5', '8:5', '1:3'])];
  const resolutions = [undefined, '512', '1K', '2K', '4K'];
  const inputs = new Map<string, { request: object; input: Record<string, unknown> }>();
  for (const size of [undefined, ...sizes()]) {
    for (const aspectRatio of ratios) {
      for (const resolution of resolutions) {
        for (const n of [1, caps.maxN]) {
          const request = { prompt: 'a lighthouse', model: def.model.id, n, ...(size && { size }), ...(aspectRatio && { aspectRatio }), ...(resolution && { resolution }) };
          let priced;
          try {
            priced = normalizeImageRequest(request, caps, prices, { sizeParam: 'accept' });
          } catch {
            continue; // refused at creation: nothing held, nothing sent
          }
          const job: ImageJob = { operation: 'generation', model: def.upstreamModel, prompt: request.prompt, n: priced.n, params: priced.params, inputs: [] };
          const input = await mappedInput(mapping, imageContext(job));
          const key = JSON.stringify(input);
          if (!inputs.has(key)) inputs.set(key, { request, input });
        }
      }
    }
  }
  return inputs;
}

/** The upstream's verdict on an input: its HTTP status (Replicate validates at create, fal when the result is read). */
async function upstreamStatus(def: CatalogDefinition, mapping: UpstreamMapping, input: Record<string, unknown>): Promise<{ status: number; body: unknown }> {
  if (def.provider === 'replicate') {
    const res = await fetch(`${replicate.baseUrl}/models/${mapping.endpoint}/predictions`, { method: 'POST', headers: { Authorization: 'Bearer r8_a', 'Content-Type': 'application/json' }, body: JSON.stringify({ input }) });
    return { status: res.status, body: await res.json() };
  }
  const submit = await fetch(`${fal.url}/${mapping.endpoint}`, { method: 'POST', headers: { Authorization: 'Key fal-a:secret', 'Content-Type': 'application/json' }, body: JSON.stringify(input) });
  if (submit.status !== 200) return { status: submit.status, body: await submit.json() };
  const { response_url } = (await submit.json()) as { response_url: string };
  const result = await fetch(response_url, { headers: { Authorization: 'Key fal-a:secret' } });
  return { status: result.status, body: await result.json() };
}

describe('shipped fal and Replicate image models', () => {
  it('include the FLUX, Seedream and Ideogram definitions', () => {
    expect(mapped.map((d) => d.id)).toEqual(expect.arrayContaining(['fal/flux-dev-fal', 'fal/seedream-4-fal', 'replicate/flux-schnell-replicate', 'replicate/ideogram-v3-turbo-replicate']));
  });

  it.each(mapped.map((d) => [d.id, d] as const))('%s: every request the gateway accepts is one the upstream takes (no 422)', async (_id, def) => {
    const mapping = (def.model.upstream_mappings as Record<string, UpstreamMapping>)[def.provider]!;
    const inputs = await acceptedInputs(def, mapping);
    expect(inputs.size).toBeGreaterThan(0);
    const refused: string[] = [];
    for (const { request, input } of inputs.values()) {
      const { status, body } = await upstreamStatus(def, mapping, input);
      if (status !== 200 && status !== 201) refused.push(`${JSON.stringify(request)} -> ${JSON.stringify(input)}: ${status} ${JSON.stringify(body)}`);
    }
    expect(refused.slice(0, 5), `${refused.length} of ${inputs.size} accepted inputs refused`).toEqual([]);
    // Hundreds of upstream round trips, each an image made by the fake: 10 s alone on a slow VM, three times that in a loaded suite.
  }, 120_000);
});
