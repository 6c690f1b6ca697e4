import createClient from 'openapi-fetch';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { paths } from '../../generated/api.d.ts';
import { findCatalogDefinition } from '../../server/catalog/catalog-definitions.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

const direct = () => createClient<paths>({ baseUrl: server.directUrl, headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
type CreateBody = paths['/admin/v1/models']['post']['requestBody']['content']['application/json'];

const pricesOf = (modelId: string) =>
  server.db.selectFrom('modelPrices').select(['resolution', 'quality', 'mode', 'unitPrice']).where('modelId', '=', modelId).orderBy('resolution').orderBy('quality').execute();

const imageModel = (id: string, overrides: Partial<CreateBody> = {}): CreateBody => ({
  id,
  kind: 'image',
  display_name: 'GPT Image 1',
  enabled: true,
  image: {
    resolutions: ['1K'],
    aspect_ratios: ['1:1', '3:2'],
    output_formats: ['png', 'jpeg'],
    supports_quality: true,
    supports_transparent_background: true,
    max_n: 4,
  },
  pricing: [
    { resolution: '1K', quality: 'low', mode: 'per_item', unit_price: 0.011 },
    { resolution: '1K', quality: 'medium', mode: 'per_item', unit_price: 0.042 },
    { resolution: '1K', quality: 'high', mode: 'per_item', unit_price: 0.167 },
  ],
  ...overrides,
});

describe('catalog models', () => {
  it('lists every catalog model by id, and filters by kind', async () => {
    const all = await server.admin().GET('/admin/v1/models');
    expect(all.response.status).toBe(200);
    expect(all.data!.data.map((m) => m.id)).toEqual(['local-image-1', 'local-image-pro', 'local-video-1', 'local-video-audio', 'local-video-lite']);
    const videos = await server.admin().GET('/admin/v1/models', { params: { query: { kind: 'video' } } });
    expect(videos.data!.data.every((m) => m.kind === 'video' && m.image === null && m.video !== null)).toBe(true);
    expect(videos.data!.data).toHaveLength(3);
  });

  it('gets one model with snake_case capabilities and decimal prices', async () => {
    const { data } = await server.admin().GET('/admin/v1/models/{model_id}', { params: { path: { model_id: 'local-video-1' } } });
    expect(data).toEqual({
      id: 'local-video-1',
      kind: 'video',
      display_name: 'Local Video 1 (per second, first and last frame)',
      enabled: true,
      image: null,
      video: {
        durations: [2, 4, 6, 8],
        aspect_ratios: ['16:9', '9:16', '1:1'],
        resolutions: ['360p', '480p', '720p'],
        frames: 'first-and-optional-last',
        reference_images: { max_count: 10, configurable: true },
        audio: { supported: true, default_enabled: false, always_on: false },
        duration_constraints: [],
      },
      pricing: [
        { resolution: '360p', quality: null, mode: 'per_second', unit_price: 0.05 },
        { resolution: '480p', quality: null, mode: 'per_second', unit_price: 0.08 },
        { resolution: '720p', quality: null, mode: 'per_second', unit_price: 0.12 },
      ],
      upstream_mappings: {},
    });
    const missing = await server.admin().GET('/admin/v1/models/{model_id}', { params: { path: { model_id: 'nope' } } });
    expect(missing.response.status).toBe(404);
    expect(missing.error?.error.code).toBe('model_not_found');
  });

  it('creates an image model priced per quality tier', async () => {
    const { data, response } = await server.admin().POST('/admin/v1/models', { body: imageModel('gpt-image-1') });
    expect(response.status).toBe(201);
    const { enabled: _enabled, ...body } = imageModel('gpt-image-1');
    expect(data).toEqual({ ...body, image: { ...body.image, size_table: 'reference', max_input_images: null, resize: 'exact', edits: true, custom_size_ratios: 'any', min_edge: null, max_edge: null }, enabled: true, video: null, upstream_mappings: {} });
    expect(await pricesOf('gpt-image-1')).toEqual([
      { resolution: '1K', quality: 'high', mode: 'per_item', unitPrice: 167_000 },
      { resolution: '1K', quality: 'low', mode: 'per_item', unitPrice: 11_000 },
      { resolution: '1K', quality: 'medium', mode: 'per_item', unitPrice: 42_000 },
    ]);
    const row = await server.db.selectFrom('catalogModels').select('capabilities').where('id', '=', 'gpt-image-1').executeTakeFirstOrThrow();
    expect(row.capabilities).toMatchObject({ supportsQuality: true, aspectRatios: ['1:1', '3:2'], maxN: 4 });

    const again = await server.admin().POST('/admin/v1/models', { body: imageModel('gpt-image-1') });
    expect(again.response.status).toBe(409);
    expect(again.error?.error).toMatchObject({ code: 'conflict', param: 'id' });
  });

  it('rejects missing, extra or duplicate price rows with 400 naming pricing', async () => {
    const base = imageModel('bad-prices');
    const cases: CreateBody['pricing'][] = [
      base.pricing.slice(0, 2),
      [...base.pricing, { resolution: '2K', quality: 'low', mode: 'per_item', unit_price: 1 }],
      [...base.pricing, base.pricing[0]!],
      base.pricing.map((p) => ({ ...p, mode: 'per_second' as const })),
      base.pricing.map((p) => ({ ...p, quality: null })),
    ];
    for (const pricing of cases) {
      const { response, error } = await server.admin().POST('/admin/v1/models', { body: { ...base, pricing } });
      expect(response.status).toBe(400);
      expect(error?.error).toMatchObject({ code: 'invalid_request', param: 'pricing' });
    }
    expect(await server.db.selectFrom('catalogModels').select('id').where('id', '=', 'bad-prices').execute()).toEqual([]);
  });

  it('rejects capabilities that do not match kind', async () => {
    const video = (await server.admin().GET('/admin/v1/models/{model_id}', { params: { path: { model_id: 'local-video-1' } } })).data!.video!;
    const both = await direct().POST('/admin/v1/models', { body: imageModel('both', { video }) });
    expect(both.response.status).toBe(400);
    expect(both.error?.error).toMatchObject({ code: 'invalid_request', param: 'video' });
    const none = await direct().POST('/admin/v1/models', { body: imageModel('none', { image: null }) });
    expect(none.error?.error).toMatchObject({ code: 'invalid_request', param: 'image' });
    const audio = await direct().POST('/admin/v1/models', {
      body: {
        id: 'bad-audio',
        kind: 'video',
        display_name: 'x',
        enabled: true,
        video: { ...video, audio: { supported: false, default_enabled: true } },
        pricing: video.resolutions.map((resolution) => ({ resolution, quality: null, mode: 'per_item' as const, unit_price: 1 })),
      },
    });
    expect(audio.response.status).toBe(400);
    expect(audio.error?.error.code).toBe('invalid_request');
  });

  it('replaces price rows on update; broken pricing changes nothing', async () => {
    const path = { model_id: 'local-video-audio' };
    const { data, error } = await server.admin().PATCH('/admin/v1/models/{model_id}', {
      params: { path },
      body: {
        pricing: [
          { resolution: '480p', quality: null, mode: 'per_second', unit_price: 0.25 },
          { resolution: '720p', quality: null, mode: 'per_item', unit_price: 2 },
        ],
      },
    });
    expect(error).toBeUndefined();
    expect(data?.pricing).toEqual([
      { resolution: '480p', quality: null, mode: 'per_second', unit_price: 0.25 },
      { resolution: '720p', quality: null, mode: 'per_item', unit_price: 2 },
    ]);
    const after = await pricesOf('local-video-audio');
    expect(after).toEqual([
      { resolution: '480p', quality: '', mode: 'per_second', unitPrice: 250_000 },
      { resolution: '720p', quality: '', mode: 'per_item', unitPrice: 2_000_000 },
    ]);

    const broken = await server.admin().PATCH('/admin/v1/models/{model_id}', {
      params: { path },
      body: { display_name: 'changed?', pricing: [{ resolution: '480p', quality: null, mode: 'per_second', unit_price: 1 }] },
    });
    expect(broken.response.status).toBe(400);
    expect(broken.error?.error).toMatchObject({ code: 'invalid_request', param: 'pricing' });
    expect(await pricesOf('local-video-audio')).toEqual(after);
    const name = await server.db.selectFrom('catalogModels').select('displayName').where('id', '=', 'local-video-audio').executeTakeFirstOrThrow();
    expect(name.displayName).not.toBe('changed?');
  });

  it('changes the reference-image limit only when it is configurable', async () => {
    const { data } = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'local-video-1' } }, body: { reference_image_max_count: 8 } });
    expect(data?.video?.reference_images).toEqual({ max_count: 8, configurable: true });
    const row = await server.db.selectFrom('catalogModels').select('capabilities').where('id', '=', 'local-video-1').executeTakeFirstOrThrow();
    expect(row.capabilities).toMatchObject({ referenceImages: { maxCount: 8, configurable: true }, durations: [2, 4, 6, 8] });

    for (const model_id of ['local-video-audio', 'local-image-1']) {
      const { response, error } = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id } }, body: { reference_image_max_count: 1 } });
      expect(response.status).toBe(400);
      expect(error?.error).toMatchObject({ code: 'invalid_request', param: 'reference_image_max_count' });
    }
    const fixed = await server.db.selectFrom('catalogModels').select('capabilities').where('id', '=', 'local-video-audio').executeTakeFirstOrThrow();
    expect(fixed.capabilities).toMatchObject({ referenceImages: { maxCount: 3, configurable: false } });
  });

  it('disabling a model hides it from GET /v1/models; enabling shows it again', async () => {
    const customer = await createCustomer(server.db);
    const ids = async () => (await server.client(customer.key).GET('/v1/models')).data!.data.map((m) => m.id);
    expect(await ids()).toContain('local-image-1');
    const { data } = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'local-image-1' } }, body: { enabled: false } });
    expect(data?.enabled).toBe(false);
    expect(await ids()).not.toContain('local-image-1');
    await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'local-image-1' } }, body: { enabled: true } });
    expect(await ids()).toContain('local-image-1');
  });

  it('answers 404 model_not_found when updating an unknown model', async () => {
    const { response, error } = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'nope' } }, body: { enabled: false } });
    expect(response.status).toBe(404);
    expect(error?.error.code).toBe('model_not_found');
  });
});

describe('reference-image limits', () => {
  it('lowers a configurable limit and raises it back, but never past the max_count the model was created with', async () => {
    // Kling's omni-video takes 7 reference images; Ark's Seedance 1.0 lite i2v 4 (its adapter's check allows 9).
    for (const [definition, max] of [['kling/kling-v3-omni-std', 7], ['ark/seedance-1-0-lite-i2v-250428', 4]] as const) {
      const { model } = findCatalogDefinition(definition)!;
      expect((await server.admin().POST('/admin/v1/models', { body: model })).response.status).toBe(201);
      const path = { model_id: model.id };
      const raised = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path }, body: { reference_image_max_count: max + 1 } });
      expect(raised.response.status).toBe(400);
      expect(raised.error?.error).toMatchObject({ code: 'invalid_request', param: 'reference_image_max_count', message: expect.stringContaining(`at most ${max} reference images`) });
      const row = await server.db.selectFrom('catalogModels').select('capabilities').where('id', '=', model.id).executeTakeFirstOrThrow();
      expect(row.capabilities).toMatchObject({ referenceImages: { maxCount: max, configurable: true } });

      const lowered = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path }, body: { reference_image_max_count: 2 } });
      expect(lowered.data?.video?.reference_images).toEqual({ max_count: 2, configurable: true });
      const back = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path }, body: { reference_image_max_count: max } });
      expect(back.data?.video?.reference_images).toEqual({ max_count: max, configurable: true });
      const again = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path }, body: { reference_image_max_count: max + 1 } });
      expect(again.response.status).toBe(400);
    }
  });

  it('a model stored before its ceiling was recorded keeps its creation limit through a lowering: it can be raised back', async () => {
    const { model } = findCatalogDefinition('kling/kling-v3-omni-std')!;
    const legacy = { ...model, id: 'kling-omni-legacy' };
    expect((await server.admin().POST('/admin/v1/models', { body: legacy })).response.status).toBe(201);
    // As an older version stored it: no ceiling in its capabilities.
    const row = await server.db.selectFrom('catalogModels').select('capabilities').where('id', '=', legacy.id).executeTakeFirstOrThrow();
    const { ceiling: _ceiling, ...referenceImages } = (row.capabilities as { referenceImages: Record<string, unknown> }).referenceImages;
    await server.db.updateTable('catalogModels').set({ capabilities: JSON.stringify({ ...(row.capabilities as object), referenceImages }) }).where('id', '=', legacy.id).execute();
    const path = { model_id: legacy.id };
    const lowered = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path }, body: { reference_image_max_count: 3 } });
    expect(lowered.data?.video?.reference_images).toEqual({ max_count: 3, configurable: true });
    const back = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path }, body: { reference_image_max_count: 7 } });
    expect([back.response.status, back.data?.video?.reference_images]).toEqual([200, { max_count: 7, configurable: true }]);
  });

  it('publishes only the limit the upstream takes in GET /v1/videos/capabilities', async () => {
    const customer = await createCustomer(server.db, { models: ['kling-v3-omni-std'] });
    const raise = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'kling-v3-omni-std' } }, body: { reference_image_max_count: 12 } });
    expect(raise.response.status).toBe(400);
    const { data } = await server.client(customer.key).GET('/v1/videos/capabilities');
    expect(data?.items.map((i) => [i.model, i.input.referenceImages])).toEqual([['kling-v3-omni-std', { maxCount: 7, configurable: true }]]);
  });
});

describe('capabilities no request could use', () => {
  const videoModel = (id: string, aspect_ratios: string[]): CreateBody => ({
    id,
    kind: 'video',
    display_name: id,
    video: {
      durations: [4],
      aspect_ratios,
      resolutions: ['720p'],
      frames: 'none',
      reference_images: { max_count: 0, configurable: false },
      audio: { supported: false, default_enabled: false },
    },
    pricing: [{ resolution: '720p', quality: null, mode: 'per_item', unit_price: 1 }],
  });
  const plainImage = (id: string, image: Partial<NonNullable<CreateBody['image']>>): CreateBody => {
    const resolutions = image.resolutions ?? ['1K'];
    return imageModel(id, {
      image: { ...imageModel(id).image!, supports_quality: false, ...image, resolutions },
      pricing: resolutions.map((resolution) => ({ resolution, quality: null, mode: 'per_item' as const, unit_price: 0.01 })),
    });
  };
  const stored = async (id: string) => (await server.db.selectFrom('catalogModels').select('id').where('id', '=', id).execute()).length;

  it("refuses an image tier the model's size table lacks: 512 only with gemini-3.1-flash-image", async () => {
    const reference = await server.admin().POST('/admin/v1/models', { body: plainImage('img-512', { resolutions: ['512', '1K'], aspect_ratios: ['1:1'] }) });
    expect(reference.response.status).toBe(400);
    expect(reference.error?.error).toMatchObject({ code: 'invalid_request', param: 'image.resolutions', message: expect.stringContaining("'reference' has no 512 tier") });
    expect(await stored('img-512')).toBe(0);
    const gemini = await server.admin().POST('/admin/v1/models', {
      body: plainImage('img-512-gemini', { resolutions: ['512', '1K'], aspect_ratios: ['1:1'], size_table: 'gemini-3.1-flash-image' }),
    });
    expect(gemini.response.status).toBe(201);
  });

  it('refuses ratios a request could not send (0:1, 16:09), as the request schema does', async () => {
    for (const body of [plainImage('img-zero', { aspect_ratios: ['1:1', '0:1'] }), videoModel('vid-padded', ['16:09', '16:9']), videoModel('vid-zero', ['0:1'])]) {
      const { response, error } = await direct().POST('/admin/v1/models', { body });
      expect(response.status, body.id).toBe(400);
      expect(error?.error).toMatchObject({ code: 'invalid_request', param: expect.stringMatching(/^(image|video)\.aspect_ratios/) });
      expect(await stored(body.id)).toBe(0);
    }
  });

  it('refuses ratios wider than 3:1, the bound of a custom size, on the reference table and for videos', async () => {
    for (const [body, param] of [
      [plainImage('img-wide', { aspect_ratios: ['1:1', '99:1'] }), 'image.aspect_ratios'],
      [plainImage('img-tall', { aspect_ratios: ['1:4'] }), 'image.aspect_ratios'],
      [videoModel('vid-wide', ['16:9', '4:1']), 'video.aspect_ratios'],
    ] as const) {
      const { response, error } = await server.admin().POST('/admin/v1/models', { body });
      expect(response.status, body.id).toBe(400);
      expect(error?.error).toMatchObject({ code: 'invalid_request', param, message: expect.stringContaining('between 1:3 and 3:1') });
      expect(await stored(body.id)).toBe(0);
    }
    // The bound itself, and a Gemini table's own wider ratios, are accepted.
    expect((await server.admin().POST('/admin/v1/models', { body: plainImage('img-3-1', { aspect_ratios: ['3:1', '1:3', '21:9'] }) })).response.status).toBe(201);
    expect((await server.admin().POST('/admin/v1/models', { body: videoModel('vid-21-9', ['21:9', '9:21']) })).response.status).toBe(201);
    const gemini = plainImage('img-gemini-8-1', { aspect_ratios: ['1:8', '8:1'], size_table: 'gemini-3.1-flash-image' });
    expect((await server.admin().POST('/admin/v1/models', { body: gemini })).response.status).toBe(201);
  });

  it("refuses edges that an offered size breaks (fal's Seedream takes 1024 to 4096 px a side)", async () => {
    for (const [body, param, words] of [
      [plainImage('img-edge-min', { aspect_ratios: ['1:1', '21:9'], min_edge: 1024 }), 'image.min_edge', '1K 21:9 is 1248x528'],
      [plainImage('img-edge-max', { aspect_ratios: ['1:1'], max_edge: 1024 }), 'image.max_edge', '1K 1:1 is 1248x1248'],
      [plainImage('img-edge-crossed', { aspect_ratios: ['1:1'], min_edge: 2048, max_edge: 1024 }), 'image.min_edge', 'larger than'],
    ] as const) {
      const { response, error } = await server.admin().POST('/admin/v1/models', { body });
      expect(response.status, body.id).toBe(400);
      expect(error?.error).toMatchObject({ code: 'invalid_request', param, message: expect.stringContaining(words) });
      expect(await stored(body.id)).toBe(0);
    }
    const ok = await server.admin().POST('/admin/v1/models', { body: plainImage('img-edge-ok', { aspect_ratios: ['1:1', '16:9'], resolutions: ['2K'], min_edge: 1024, max_edge: 4096 }) });
    expect(ok.response.status).toBe(201);
    expect(ok.data!.image).toMatchObject({ min_edge: 1024, max_edge: 4096, edits: true, custom_size_ratios: 'any' });
  });
});

describe("an image model's upstream settings", () => {
  const capabilitiesOf = async (id: string) => (await server.db.selectFrom('catalogModels').select('capabilities').where('id', '=', id).executeTakeFirstOrThrow()).capabilities as Record<string, unknown>;
  const patch = (id: string, body: Record<string, unknown>) => direct().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: id } }, body: body as never });

  it('are shown with their defaults, stored only when not the default, and changed with PATCH', async () => {
    const created = await server.admin().POST('/admin/v1/models', { body: imageModel('img-settings') });
    expect(created.data!.image).toMatchObject({ edits: true, custom_size_ratios: 'any', min_edge: null, max_edge: null });
    expect(await capabilitiesOf('img-settings')).not.toHaveProperty('edits');

    const set = await patch('img-settings', { edits: false, custom_size_ratios: 'offered', min_edge: 512, max_edge: 2048 });
    expect(set.response.status).toBe(200);
    expect(set.data!.image).toMatchObject({ edits: false, custom_size_ratios: 'offered', min_edge: 512, max_edge: 2048 });
    expect(await capabilitiesOf('img-settings')).toMatchObject({ edits: false, customSizeRatios: 'offered', minEdge: 512, maxEdge: 2048 });

    // An edge an offered size breaks changes nothing.
    const broken = await patch('img-settings', { min_edge: 1024, edits: true });
    expect([broken.response.status, broken.error?.error.param]).toEqual([400, 'image.min_edge']);
    expect(await capabilitiesOf('img-settings')).toMatchObject({ edits: false, minEdge: 512 });

    const back = await patch('img-settings', { edits: true, custom_size_ratios: 'any', min_edge: null, max_edge: null });
    expect(back.data!.image).toMatchObject({ edits: true, custom_size_ratios: 'any', min_edge: null, max_edge: null });
    const stored = await capabilitiesOf('img-settings');
    for (const key of ['edits', 'customSizeRatios', 'minEdge', 'maxEdge']) expect(stored).not.toHaveProperty(key);
  });

  it('are refused on a video model', async () => {
    const { response, error } = await patch('local-video-1', { edits: false });
    expect([response.status, error?.error.code, error?.error.param]).toEqual([400, 'invalid_request', 'edits']);
  });
});
