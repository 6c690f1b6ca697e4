/**
 * Operations the other files of the contract lane (test/contract-lane.json) only send to the server
 * directly, each exercised here through `client()` (Prism in the contract lane): health, readiness and
 * metrics, a JSON image edit and its output's bytes (GET, and HEAD with the key and by the signed
 * URL), both other video creation paths (the deprecated POST /v1/videos answers 404), the
 * capabilities, and a lookup of a task that does not exist. The contract step of `npm test` fails
 * when an operation of openapi/ goes through Prism in no file of the lane (scripts/contract-lane.ts),
 * so each of these stays covered here.
 */
import { randomUUID } from 'node:crypto';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const METRICS_TOKEN = 'metrics-token-0123456789abcdef';
let server: TestServer;
let customer: Awaited<ReturnType<typeof createCustomer>>;

beforeAll(async () => {
  server = await startTestServer({ env: { METRICS_TOKEN } });
  await seedCatalog(server.db);
  customer = await createCustomer(server.db, { balance: 100 });
});
afterAll(async () => server?.close());

const png = (width = 64, height = 48) => sharp({ create: { width, height, channels: 3, background: { r: 40, g: 120, b: 200 } } }).png().toBuffer();

/** A GET through the lane's client, as text; a token for /metrics. */
function laneGet(path: '/healthz' | '/readyz' | '/metrics', token?: string) {
  return server.client(token).GET(path, { parseAs: 'text' }) as Promise<{ response: Response; data?: string }>;
}

describe('operations endpoints through the lane', () => {
  it('GET /healthz and /readyz answer without a key', async () => {
    const health = await laneGet('/healthz');
    expect([health.response.status, JSON.parse(health.data!)]).toEqual([200, { status: 'ok' }]);
    const ready = await laneGet('/readyz');
    expect([ready.response.status, JSON.parse(ready.data!)]).toEqual([200, { status: 'ready' }]);
  });

  // Without the token Prism answers 401 itself (the operation's security); test/http/auth.test.ts asks the server.
  it('GET /metrics answers the metrics token with Prometheus text', async () => {
    const metrics = await laneGet('/metrics', METRICS_TOKEN);
    expect(metrics.response.status).toBe(200);
    expect(metrics.response.headers.get('content-type')).toContain('text/plain');
    expect(metrics.data).toContain('mediagate_http_request_duration_seconds_bucket');
  });
});

describe('media operations through the lane', () => {
  it('POST /v1/images/edits (JSON) edits a data URL image, and GET /v1/files/{file_id}/content streams the output', async () => {
    const input = await png(320, 240);
    const edit = await server.client(customer.key).POST('/v1/images/edits', {
      body: { model: 'local-image-1', prompt: 'add a hat', images: [`data:image/png;base64,${input.toString('base64')}`], response_format: 'url' },
    });
    expect(edit.response.status, JSON.stringify(edit.error)).toBe(200);
    // Uploads (POST /v1/files) go to the server directly everywhere: Prism's proxy re-encodes multipart bodies.
    const fileId = new URL((edit.data as Json).data[0].url as string).pathname.split('/').pop()!;
    const content = await server.client(customer.key).GET('/v1/files/{file_id}/content', { params: { path: { file_id: fileId } }, parseAs: 'arrayBuffer' });
    expect(content.response.status).toBe(200);
    expect(content.response.headers.get('content-type')).toBe('image/png');
    // The bytes from the server itself: the proxy re-encodes binary bodies.
    const direct = await fetch(`${server.directUrl}/v1/files/${fileId}/content`, { headers: { Authorization: `Bearer ${customer.key}` } });
    expect(await sharp(Buffer.from(await direct.arrayBuffer())).metadata()).toMatchObject({ width: 320, height: 240 });

    // HEAD on both download paths: GET's header fields, no body (Prism's proxy rewrites a HEAD's
    // Content-Length to 0; test/http/file-names-head.test.ts checks it from the server itself).
    const head = await server.client(customer.key).HEAD('/v1/files/{file_id}/content', { params: { path: { file_id: fileId } } });
    expect([head.response.status, head.response.headers.get('etag'), head.response.headers.get('accept-ranges')]).toEqual([200, `"${fileId}"`, 'bytes']);
    const signed = new URL((edit.data as Json).data[0].url as string);
    const query = { expires: Number(signed.searchParams.get('expires')), signature: signed.searchParams.get('signature')! };
    const headSigned = await server.client().HEAD('/v1/files/{file_id}', { params: { path: { file_id: fileId }, query } });
    expect([headSigned.response.status, headSigned.response.headers.get('etag'), headSigned.response.headers.get('accept-ranges')]).toEqual([200, `"${fileId}"`, 'bytes']);
  });

  it('creates videos on /api/v1/videos/generations; the deprecated POST /v1/videos is 404', async () => {
    const created = await server.client(customer.key).POST('/api/v1/videos/generations', {
      body: { client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' },
    });
    expect(created.response.status, JSON.stringify(created.error)).toBe(202);
    expect(created.data).toMatchObject({ object: 'video.task', status: 'queued', model: 'local-video-1' });

    const legacy = await server.client(customer.key).POST('/v1/videos');
    expect([legacy.response.status, (legacy.error as Json)?.error.code]).toEqual([404, 'video_creation_endpoint_moved']);
  });

  it('GET /v1/videos/capabilities lists the video models', async () => {
    const res = await server.client(customer.key).GET('/v1/videos/capabilities');
    expect(res.response.status).toBe(200);
    expect(res.data?.items.map((i) => i.model)).toContain('local-video-1');
  });

  it('GET /v1/images/capabilities lists the image models with their prices', async () => {
    const res = await server.client(customer.key).GET('/v1/images/capabilities');
    expect(res.response.status).toBe(200);
    expect(res.data?.items.map((i) => i.model)).toEqual(['local-image-1', 'local-image-pro']);
  });

  it('a lookup of a task that does not exist is 404, for images and videos', async () => {
    const image = await server.client(customer.key).GET('/v1/images/{task_id}', { params: { path: { task_id: 'img_unknown' } } });
    expect([image.response.status, image.error?.error.code]).toEqual([404, 'task_not_found']);
    const video = await server.client(customer.key).GET('/v1/videos/{id}', { params: { path: { id: 'video_unknown' } } });
    expect([video.response.status, video.error?.error.code]).toEqual([404, 'task_not_found']);
  });
});
