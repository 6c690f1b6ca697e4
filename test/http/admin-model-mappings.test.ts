/**
 * A catalog model's aggregator mappings through the admin API (issue 31, requirement 2): set on
 * creation and by update (a provider's whole mapping replaced, `null` removing it, others kept),
 * shown on every model, and refused when saved with `400 invalid_mapping` naming the bad part.
 */
import createClient from 'openapi-fetch';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { paths } from '../../generated/api.d.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;

beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => server?.close());

/** Past Prism, for the gateway's own 400s (Prism's own refusal of a schema violation is a 422). */
const direct = () => createClient<paths>({ baseUrl: server.directUrl, headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
type CreateBody = paths['/admin/v1/models']['post']['requestBody']['content']['application/json'];

const FAL_KLING = {
  endpoint: 'fal-ai/kling-video/v2.1/standard/image-to-video',
  input: '{"prompt": prompt, "duration": $string(duration), "image_url": first_frame}',
  output: 'video.url',
};
/** As saved and shown: the contract's default `media` is written out. */
const FAL_KLING_SAVED = { ...FAL_KLING, media: 'url' };

const videoModel = (id: string, extra: Partial<CreateBody> = {}): CreateBody => ({
  id,
  kind: 'video',
  display_name: 'Kling 2.1 via fal',
  video: {
    durations: [5, 10],
    aspect_ratios: ['16:9'],
    resolutions: ['720p'],
    frames: 'first-only',
    reference_images: { max_count: 0, configurable: false },
    audio: { supported: false, default_enabled: false },
  },
  pricing: [{ resolution: '720p', quality: null, mode: 'per_second', unit_price: 0.05 }],
  ...extra,
});

describe('upstream mappings of catalog models', () => {
  it('are saved on creation, shown on the model, replaced per provider by an update, and removed with null', async () => {
    const created = await server.admin().POST('/admin/v1/models', { body: videoModel('kling-fal', { upstream_mappings: { fal: FAL_KLING } }) });
    expect(created.response.status).toBe(201);
    expect(created.data!.upstream_mappings).toEqual({ fal: FAL_KLING_SAVED });
    const stored = await server.db.selectFrom('catalogModels').select('upstreamMappings').where('id', '=', 'kling-fal').executeTakeFirstOrThrow();
    expect(stored.upstreamMappings).toEqual({ fal: FAL_KLING_SAVED });

    const replicate = { endpoint: 'kwaivgi/kling-v2.1', input: '{"prompt": prompt, "start_image": first_frame, "duration": duration}', output: 'output' };
    const added = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'kling-fal' } }, body: { upstream_mappings: { replicate } } });
    expect(added.response.status).toBe(200);
    expect(added.data!.upstream_mappings).toEqual({ fal: FAL_KLING_SAVED, replicate: { ...replicate, media: 'url' } });

    const removed = await server.admin().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: 'kling-fal' } }, body: { upstream_mappings: { fal: null } } });
    expect(removed.data!.upstream_mappings).toEqual({ replicate: { ...replicate, media: 'url' } });
    expect((await server.admin().GET('/admin/v1/models/{model_id}', { params: { path: { model_id: 'kling-fal' } } })).data!.upstream_mappings).toEqual({ replicate: { ...replicate, media: 'url' } });

    const plain = await server.admin().POST('/admin/v1/models', { body: videoModel('plain-video') });
    expect(plain.data!.upstream_mappings).toEqual({});
  });

  it.each([
    ['a fal endpoint without an app', { ...FAL_KLING, endpoint: 'kling' }, 'upstream_mappings.fal.endpoint', "is 'kling', which is not fal's endpoint id"],
    ['an input that does not compile', { ...FAL_KLING, input: '{"prompt": prompt' }, 'upstream_mappings.fal.input', 'is not a valid JSONata expression'],
    ['an output that does not compile', { ...FAL_KLING, output: 'video[' }, 'upstream_mappings.fal.output', 'is not a valid JSONata expression'],
    ['an input that makes no object', { ...FAL_KLING, input: '[prompt]' }, 'upstream_mappings.fal.input', 'must make a JSON object of the request'],
    ['wait on fal', { ...FAL_KLING, wait: 5 }, 'upstream_mappings.fal.wait', 'is a Replicate setting'],
    // Regular expressions run on RE2 (linear time): what it cannot run is refused here, not at a request.
    ['a regular expression with a backreference', { ...FAL_KLING, output: '$match(video.url, /(a)\\1/).match' }, 'upstream_mappings.fal.output', 'uses the regular expression /(a)\\1/, which RE2 cannot run'],
  ])('refuses %s with 400 invalid_mapping naming the part, on creation and on update, saving nothing', async (_what, mapping, param, message) => {
    const id = `bad-${param.split('.').pop()}-${Math.random().toString(36).slice(2, 8)}`;
    const create = await direct().POST('/admin/v1/models', { body: videoModel(id, { upstream_mappings: { fal: mapping } }) });
    expect(create.response.status).toBe(400);
    expect(create.error!.error).toMatchObject({ code: 'invalid_mapping', param, type: 'invalid_request_error' });
    expect(create.error!.error.message).toContain(`'${param}' ${message}`);
    expect(await server.db.selectFrom('catalogModels').select('id').where('id', '=', id).executeTakeFirst()).toBeUndefined();

    await server.admin().POST('/admin/v1/models', { body: videoModel(id, { upstream_mappings: { fal: FAL_KLING } }) });
    const update = await direct().PATCH('/admin/v1/models/{model_id}', { params: { path: { model_id: id } }, body: { upstream_mappings: { fal: mapping } } });
    expect([update.response.status, update.error?.error.code, update.error?.error.param]).toEqual([400, 'invalid_mapping', param]);
    expect((await server.db.selectFrom('catalogModels').select('upstreamMappings').where('id', '=', id).executeTakeFirstOrThrow()).upstreamMappings).toEqual({ fal: FAL_KLING_SAVED });
  });

  it('refuses a mapping for a provider that is no aggregator, and unknown mapping fields, as the contract says', async () => {
    const other = await direct().POST('/admin/v1/models', { body: { ...videoModel('openai-mapped'), upstream_mappings: { openai: FAL_KLING } } as unknown as CreateBody });
    expect([other.response.status, other.error?.error.code]).toEqual([400, 'invalid_request']);
    const field = await direct().POST('/admin/v1/models', { body: { ...videoModel('extra-field'), upstream_mappings: { fal: { ...FAL_KLING, template: 'x' } } } as unknown as CreateBody });
    expect([field.response.status, field.error?.error.code]).toEqual([400, 'invalid_request']);
  });
});
