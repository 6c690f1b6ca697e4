/**
 * Result links that redirect to another host (signed object storage, a CDN): followed, and the
 * member's credentials never go with them. OpenAI-compatible gateways answer
 * `/v1/videos/{id}/content` with a 302 to storage; output images of fal/Replicate, Kling and
 * OpenAI `url` answers are fetched without credentials, so their redirects go anywhere. Over real
 * HTTP: an upstream (the API's origin) and a storage host (another origin) of this test.
 */
import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fetchOutputImage } from '../../server/providers/kit/queued-images.ts';
import { KlingTokens } from '../../server/providers/kling/kling-auth.ts';
import { KlingImageProvider } from '../../server/providers/kling/kling-image.provider.ts';
import { OpenAIImageProvider } from '../../server/providers/openai/openai-image.provider.ts';
import { OpenAIVideoProvider } from '../../server/providers/openai/openai-video.provider.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { GeneratedImage, ImageJob, UpstreamAccount, VideoJob } from '../../server/providers/types.ts';
import { upstreamFetch } from '../../server/providers/upstream-http.ts';
import { imageParams } from '../support/image-params.ts';

const MP4 = Buffer.concat([Buffer.from([0, 0, 0, 0x18]), Buffer.from('ftypisom', 'latin1'), Buffer.alloc(2000, 5)]);
let PNG: Buffer;

interface Seen {
  host: 'api' | 'storage';
  path: string;
  headers: IncomingHttpHeaders;
}
const seen: Seen[] = [];
let api: Server;
let storage: Server;
let apiUrl = '';
let storageUrl = '';

const listen = async (server: Server) => {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
};
const json = (res: ServerResponse, body: unknown) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));

beforeAll(async () => {
  PNG = await sharp({ create: { width: 64, height: 64, channels: 3, background: { r: 20, g: 110, b: 190 } } }).png().toBuffer();
  storage = createServer((req, res) => {
    seen.push({ host: 'storage', path: req.url!, headers: req.headers });
    if (req.url!.startsWith('/signed/out.mp4')) res.writeHead(200, { 'content-type': 'video/mp4', 'content-length': String(MP4.length) }).end(MP4);
    else if (req.url!.startsWith('/signed/out.png')) res.writeHead(200, { 'content-type': 'image/png' }).end(PNG);
    else if (req.url!.startsWith('/bounce?to=')) res.writeHead(302, { location: decodeURIComponent(req.url!.slice('/bounce?to='.length)) }).end();
    else if (req.url!.startsWith('/forbidden')) res.writeHead(403, { 'content-type': 'application/xml' }).end('<Error><Code>AccessDenied</Code></Error>');
    else res.writeHead(404).end();
  });
  storageUrl = await listen(storage);
  api = createServer((req, res) => {
    seen.push({ host: 'api', path: req.url!, headers: req.headers });
    req.resume();
    req.on('end', () => {
      const path = req.url!;
      if (path.startsWith('/v1/videos/vid_1/content')) res.writeHead(302, { location: `${storageUrl}/signed/out.mp4?sig=x` }).end();
      // A storage host that sends the download back to the API's origin, then refuses it there.
      else if (path.startsWith('/v1/videos/vid_back/content')) res.writeHead(302, { location: `${storageUrl}/bounce?to=${encodeURIComponent(`${apiUrl}/v1/videos/vid_back/final`)}` }).end();
      else if (path.startsWith('/v1/videos/vid_back/final')) res.writeHead(req.headers.authorization ? 200 : 401, { 'content-type': 'application/json' }).end('{"error":{"message":"no key","type":"invalid_request_error"}}');
      else if (path.startsWith('/v1/videos/vid_gone/content')) res.writeHead(302, { location: `${storageUrl}/forbidden` }).end();
      else if (path.startsWith('/loop')) res.writeHead(302, { location: `${storageUrl}/bounce?to=${encodeURIComponent(`${apiUrl}/loop`)}` }).end();
      else if (path === '/files/out.png') res.writeHead(302, { location: `${storageUrl}/signed/out.png?sig=y` }).end();
      else if (path === '/v1/images/generations') json(res, { created: 1, data: [{ url: `${apiUrl}/files/out.png` }] });
      // Kling's image task: created, then done with its image behind a link that redirects.
      else if (path === '/kling/v1/images/generations') json(res, { code: 0, message: 'SUCCEED', data: { task_id: 'img-1', task_status: 'submitted' } });
      else if (path === '/kling/v1/images/generations/img-1') json(res, { code: 0, message: 'SUCCEED', data: { task_id: 'img-1', task_status: 'succeed', task_result: { images: [{ index: 0, url: `${apiUrl}/files/out.png` }] } } });
      else res.writeHead(404).end();
    });
  });
  apiUrl = await listen(api);
});
afterAll(() => {
  for (const server of [api, storage]) {
    server.closeAllConnections();
    server.close();
  }
});

const never = new AbortController().signal;
const imageJob: ImageJob = {
  operation: 'generation',
  model: 'dall-e-3',
  prompt: 'a lighthouse',
  n: 1,
  inputs: [],
  params: imageParams({ width: 64, height: 64 }),
};

async function imagesOf(generate: (events: { partial: () => Promise<void>; image: (i: number, g: GeneratedImage) => Promise<void> }) => Promise<void>): Promise<Buffer[]> {
  const images: Buffer[] = [];
  await generate({ partial: async () => undefined, image: async (_i, g) => void images.push(g.image) });
  return images;
}

/** What reached each host, and whether it carried a credential. */
const trail = () => seen.map((s) => ({ host: s.host, path: s.path.split('?')[0], credentials: s.headers.authorization !== undefined || s.headers['x-api-key'] !== undefined }));

describe('a result link that redirects to another host', () => {
  it("OpenAI's video content: the 302 to storage is followed, the key goes to the member's origin only", async () => {
    seen.length = 0;
    const account = { memberId: 'm', provider: 'openai', baseUrl: `${apiUrl}/v1`, credentials: { api_key: 'sk-secret-key' }, modelMap: {} } as UpstreamAccount;
    const content = await new OpenAIVideoProvider().download(account, 'vid_1', {}, {} as VideoJob, never);
    const chunks: Buffer[] = [];
    for await (const chunk of content.stream) chunks.push(chunk as Buffer);
    expect(Buffer.concat(chunks).equals(MP4)).toBe(true);
    expect([content.contentType, content.bytes]).toEqual(['video/mp4', MP4.length]);
    expect(trail()).toEqual([
      { host: 'api', path: '/v1/videos/vid_1/content', credentials: true },
      { host: 'storage', path: '/signed/out.mp4', credentials: false },
    ]);
    expect(seen[0]!.headers.authorization).toBe('Bearer sk-secret-key');
  });

  it("fal and Replicate's output images (fetchOutputImage) follow it", async () => {
    seen.length = 0;
    expect((await fetchOutputImage(`${apiUrl}/files/out.png`, never, 'fal')).equals(PNG)).toBe(true);
    expect(trail()).toEqual([
      { host: 'api', path: '/files/out.png', credentials: false },
      { host: 'storage', path: '/signed/out.png', credentials: false },
    ]);
  });

  it("an OpenAI `url` image answer is fetched through its redirect, without the member's key", async () => {
    seen.length = 0;
    const account = { memberId: 'm', provider: 'openai', baseUrl: `${apiUrl}/v1`, credentials: { api_key: 'sk-secret-key' }, modelMap: {} } as UpstreamAccount;
    const images = await imagesOf((events) => new OpenAIImageProvider().generate(account, imageJob, never, events));
    expect(images.map((image) => image.equals(PNG))).toEqual([true]);
    expect(trail()).toEqual([
      { host: 'api', path: '/v1/images/generations', credentials: true },
      { host: 'api', path: '/files/out.png', credentials: false },
      { host: 'storage', path: '/signed/out.png', credentials: false },
    ]);
  });

  it("Kling's output image is fetched through its redirect, without the member's token", async () => {
    seen.length = 0;
    const account = { memberId: 'm', provider: 'kling', baseUrl: `${apiUrl}/kling`, credentials: { access_key: 'ak', secret_key: 'sk-kling-secret' }, modelMap: {} } as UpstreamAccount;
    const provider = new KlingImageProvider({ pollIntervalMs: 10, tokens: new KlingTokens({ ttlSeconds: 60, renewBeforeSeconds: 5 }) });
    const images = await imagesOf((events) => provider.generate(account, { ...imageJob, model: 'kling-v2' }, never, events));
    expect(images.map((image) => image.equals(PNG))).toEqual([true]);
    expect(trail().slice(-2)).toEqual([
      { host: 'api', path: '/files/out.png', credentials: false },
      { host: 'storage', path: '/signed/out.png', credentials: false },
    ]);
  });
});

describe('a video download that leaves the member\'s origin', () => {
  const account = { memberId: 'm', provider: 'openai', baseUrl: `${apiUrl}/v1`, credentials: { api_key: 'sk-secret-key' }, modelMap: {} } as UpstreamAccount;
  const download = (id: string) => new OpenAIVideoProvider().download({ ...account, baseUrl: `${apiUrl}/v1` }, id, {}, {} as VideoJob, never).catch((e: unknown) => e);

  it('never carries the key again, even when a redirect leads back to the member\'s origin; that origin\'s refusal is then its own error', async () => {
    seen.length = 0;
    const err = await download('vid_back');
    expect(trail()).toEqual([
      { host: 'api', path: '/v1/videos/vid_back/content', credentials: true },
      { host: 'storage', path: '/bounce', credentials: false },
      { host: 'api', path: '/v1/videos/vid_back/final', credentials: false },
    ]);
    // The answer came from the member's own origin: classified as the upstream's own error, not as a gone link.
    expect(err).toBeInstanceOf(ProviderError);
    expect((err as ProviderError).upstreamStatus).toBe(401);
  });

  it("a storage host's 403 is a link that no longer works: the download failed for good, not the member's credentials", async () => {
    seen.length = 0;
    const err = await download('vid_gone');
    expect(err).toBeInstanceOf(ProviderError);
    expect([(err as ProviderError).kind, (err as ProviderError).upstreamStatus]).toEqual(['failed', 403]);
    expect(trail().map((t) => t.host)).toEqual(['api', 'storage']);
  });

  it("a credential-free link that redirects in a loop is the link's failure (retryable), not the member's misconfiguration", async () => {
    const err = await upstreamFetch(`${apiUrl}/loop`, { redirect: 'anywhere' }, never, 'video download').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    expect((err as ProviderError).kind).toBe('retryable');
    expect((err as ProviderError).message).toContain('redirected more than 5 times');
  });
});

describe("upstreamFetch's redirects", () => {
  it("`anywhere` follows to another origin and sends it nothing but Accept; the default still refuses to (the member's misconfiguration)", async () => {
    seen.length = 0;
    const res = await upstreamFetch(`${apiUrl}/files/out.png`, { headers: { Accept: 'image/*', Authorization: 'Bearer sk-leak', 'x-api-key': 'sk-leak' }, redirect: 'anywhere' }, never, 'image download');
    expect(res.status).toBe(200);
    res.discard();
    expect(seen.map((s) => [s.host, s.headers.accept, s.headers.authorization, s.headers['x-api-key']])).toEqual([
      ['api', 'image/*', 'Bearer sk-leak', 'sk-leak'],
      ['storage', 'image/*', undefined, undefined],
    ]);

    seen.length = 0;
    const refused = await upstreamFetch(`${apiUrl}/files/out.png`, { headers: { Authorization: 'Bearer sk-leak' } }, never, 'video status').catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ProviderError);
    expect((refused as ProviderError).kind).toBe('misconfigured');
    expect(seen.map((s) => s.host)).toEqual(['api']);
  });
});
