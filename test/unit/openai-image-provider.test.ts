/**
 * The OpenAI Images adapter (server/providers/openai/openai-image.provider.ts) called directly,
 * over real HTTP against the fake upstream of test/fakes/openai-images.ts: the wire format it
 * sends (upstream-apis.md §1.1–§1.2), what the client receives (§1.3, post-processing), streaming
 * (§1.4) and error classification (§1.5). No database.
 */
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import sharp from 'sharp';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { apiErrorOf } from '../../server/errors.ts';
import { OpenAIImageProvider, upstreamImageSize } from '../../server/providers/openai/openai-image.provider.ts';
import type { GeneratedImage, ImageEvents, ImageJob, ImageParams, UpstreamAccount } from '../../server/providers/types.ts';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { providerErrorOf } from '../support/api-error.ts';
import { imageParams } from '../support/image-params.ts';

let fake: OpenAIImagesFake;
/** Frames 300 ms apart, to see partials arrive before the image is done. */
let slow: OpenAIImagesFake;
const provider = new OpenAIImageProvider();

beforeAll(async () => {
  [fake, slow] = await Promise.all([startOpenAIImagesFake({ models: ['acme-image'] }), startOpenAIImagesFake({ streamEventDelayMs: 300 })]);
});
afterAll(async () => {
  await Promise.all([fake.close(), slow.close()]);
});
afterEach(() => {
  for (const f of [fake, slow]) {
    f.faults.clear();
    f.holdMs = 0;
    f.streamDone = false;
    f.resume();
    f.calls.length = 0;
    f.requests.length = 0;
    f.resetInFlightStats();
  }
});

// ---------------------------------------------------------------------------------------------
// Factories

function account(upstream: { url: string } = fake, apiKey = 'sk-test'): UpstreamAccount {
  return { memberId: 'member-1', provider: 'openai', baseUrl: `${upstream.url}/v1`, credentials: { api_key: apiKey }, modelMap: {} };
}

function job(overrides: Partial<Omit<ImageJob, 'params'>> = {}, p: Partial<ImageParams> = {}): ImageJob {
  return { operation: 'generation', model: 'gpt-image-1.5', prompt: 'a lighthouse at dusk', n: 1, inputs: [], params: imageParams(p), ...overrides };
}

interface Recorded {
  events: ImageEvents;
  /** `partial i/k` and `image i` in the order they were reported. */
  log: string[];
  partials: Buffer[];
  images: GeneratedImage[];
}

function recorder(hooks: { partial?: (imageIndex: number, partialIndex: number) => Promise<void> | void; image?: (imageIndex: number) => Promise<void> | void } = {}): Recorded {
  const rec: Recorded = {
    log: [],
    partials: [],
    images: [],
    events: {
      partial: async (imageIndex, partialIndex, image) => {
        rec.log.push(`partial ${imageIndex}/${partialIndex}`);
        rec.partials.push(image);
        await hooks.partial?.(imageIndex, partialIndex);
      },
      image: async (imageIndex, generated) => {
        rec.log.push(`image ${imageIndex}`);
        rec.images.push(generated);
        await hooks.image?.(imageIndex);
      },
    },
  };
  return rec;
}

async function run(j: ImageJob, acct = account(), rec = recorder(), signal = new AbortController().signal): Promise<Recorded> {
  await provider.generate(acct, j, signal, rec.events);
  return rec;
}

async function meta(image: Buffer): Promise<{ format: string | undefined; width: number | undefined; height: number | undefined }> {
  const m = await sharp(image).metadata();
  return { format: m.format, width: m.width, height: m.height };
}

const solid = (width: number, height: number, alpha = false) =>
  sharp({ create: { width, height, channels: alpha ? 4 : 3, background: alpha ? { r: 0, g: 0, b: 0, alpha: 0 } : { r: 20, g: 110, b: 190 } } });
const png = (w: number, h: number, alpha = false) => solid(w, h, alpha).png().toBuffer();

/** A small HTTP server for answers the fake does not give (a gateway's `url` image, odd SSE). */
async function startServer(handle: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ url: string; headers: IncomingHttpHeaders[]; close(): Promise<void> }> {
  const headers: IncomingHttpHeaders[] = [];
  const server = createServer((req, res) => {
    headers.push(req.headers);
    req.resume();
    req.on('end', () => handle(req, res));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    headers,
    close: () => {
      server.closeAllConnections();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const until = async (condition: () => boolean) => {
  for (let i = 0; i < 500 && !condition(); i++) await new Promise((r) => setTimeout(r, 10));
  expect(condition()).toBe(true);
};

// ---------------------------------------------------------------------------------------------

describe('upstreamImageSize', () => {
  it('asks GPT image models for the standard size of the nearest aspect ratio', () => {
    expect(upstreamImageSize('gpt-image-1', 1920, 1080)).toBe('1536x1024');
    expect(upstreamImageSize('gpt-image-1.5', 800, 1600)).toBe('1024x1536');
    expect(upstreamImageSize('gpt-image-1-mini', 1000, 1000)).toBe('1024x1024');
    expect(upstreamImageSize('some-gateway-model', 2048, 2048)).toBe('1024x1024');
  });

  it('asks gpt-image-2 for the exact size when it is valid, else the nearest standard size', () => {
    expect(upstreamImageSize('gpt-image-2', 1280, 720)).toBe('1280x720');
    expect(upstreamImageSize('gpt-image-2-2026-04-21', 3840, 2160)).toBe('3840x2160');
    expect(upstreamImageSize('gpt-image-2', 2160, 3840)).toBe('2160x3840');
    expect(upstreamImageSize('gpt-image-2', 1000, 1000)).toBe('1024x1024'); // not divisible by 16
    expect(upstreamImageSize('gpt-image-2', 4096, 2160)).toBe('1536x1024'); // wider than 3840
    expect(upstreamImageSize('gpt-image-2', 2048, 512)).toBe('1536x1024'); // ratio 4:1
    expect(upstreamImageSize('gpt-image-2', 512, 512)).toBe('1024x1024'); // under the pixel floor
  });

  it('asks dall-e-3 for its three sizes and dall-e-2 for the smallest square at least as large', () => {
    expect(upstreamImageSize('dall-e-3', 1920, 1080)).toBe('1792x1024');
    expect(upstreamImageSize('dall-e-3', 1080, 1920)).toBe('1024x1792');
    expect(upstreamImageSize('dall-e-3', 1100, 1000)).toBe('1024x1024');
    expect(upstreamImageSize('dall-e-2', 256, 256)).toBe('256x256');
    expect(upstreamImageSize('dall-e-2', 300, 200)).toBe('512x512');
    expect(upstreamImageSize('dall-e-2', 1000, 600)).toBe('1024x1024');
    expect(upstreamImageSize('dall-e-2', 2048, 2048)).toBe('1024x1024');
  });
});

describe('generations', () => {
  it('sends a GPT image model its parameters as JSON with the bearer key, never response_format', async () => {
    const rec = await run(job({}, { width: 1536, height: 1024, quality: 'low', background: 'opaque', outputFormat: 'jpeg', outputCompression: 40 }));
    expect(fake.calls).toHaveLength(1);
    const call = fake.calls[0]!;
    expect(call.request.path).toBe('/v1/images/generations');
    expect(call.request.headers.authorization).toBe('Bearer sk-test');
    expect(call.request.headers['content-type']).toBe('application/json');
    expect(call.params).toEqual({
      model: 'gpt-image-1.5',
      prompt: 'a lighthouse at dusk',
      n: 1,
      size: '1536x1024',
      quality: 'low',
      background: 'opaque',
      output_format: 'jpeg',
      output_compression: 40,
    });
    expect(call.outcome).toBe('ok');
    expect(rec.log).toEqual(['image 0']);
    expect(await meta(rec.images[0]!.image)).toEqual({ format: 'jpeg', width: 1536, height: 1024 });
    expect(rec.images[0]!.revisedPrompt).toBeUndefined();
  });

  it('leaves output_compression out for png and asks for n images in one call', async () => {
    const rec = await run(job({ n: 4 }, { outputFormat: 'png', outputCompression: 30 }));
    expect(fake.calls).toHaveLength(1);
    // `quality: auto` goes as the `high` it is billed at.
    expect(fake.calls[0]!.params).toEqual({ model: 'gpt-image-1.5', prompt: 'a lighthouse at dusk', n: 4, size: '1024x1024', quality: 'high', background: 'auto', output_format: 'png' });
    expect(rec.log).toEqual(['image 0', 'image 1', 'image 2', 'image 3']);
  });

  it('treats a model name it does not know as a GPT image model', async () => {
    await run(job({ model: 'acme-image' }, { outputFormat: 'webp' }));
    expect(fake.calls[0]!.outcome).toBe('ok');
    expect(fake.calls[0]!.params).not.toHaveProperty('response_format');
    expect(fake.calls[0]!.params).toMatchObject({ model: 'acme-image', output_format: 'webp' });
  });

  it('sends dall-e-3 quality hd or standard and response_format b64_json, one call per image, and relays the revised prompt', async () => {
    const rec = await run(job({ model: 'dall-e-3', n: 2 }, { width: 1920, height: 1080, quality: 'high' }));
    expect(fake.calls.map((c) => c.params)).toEqual([
      { model: 'dall-e-3', prompt: 'a lighthouse at dusk', n: 1, size: '1792x1024', quality: 'hd', response_format: 'b64_json' },
      { model: 'dall-e-3', prompt: 'a lighthouse at dusk', n: 1, size: '1792x1024', quality: 'hd', response_format: 'b64_json' },
    ]);
    expect(rec.log).toEqual(['image 0', 'image 1']);
    expect(rec.images[0]!.revisedPrompt).toBe('a lighthouse at dusk, rendered in rich detail.');
    // 1792x1024 cropped to the requested 16:9.
    expect(await meta(rec.images[1]!.image)).toEqual({ format: 'png', width: 1920, height: 1080 });

    fake.calls.length = 0;
    await run(job({ model: 'dall-e-3' }, { quality: 'medium' }));
    expect(fake.calls[0]!.params.quality).toBe('standard');
    // `auto`, billed at high, is asked for as hd.
    fake.calls.length = 0;
    await run(job({ model: 'dall-e-3' }, { quality: 'auto' }));
    expect(fake.calls[0]!.params.quality).toBe('hd');
  });

  it('sends dall-e-2 no quality, the smallest square size that covers the request, and converts the answer', async () => {
    const rec = await run(job({ model: 'dall-e-2', n: 3 }, { width: 300, height: 200, quality: 'high', outputFormat: 'webp', outputCompression: 20 }));
    expect(fake.calls).toHaveLength(1);
    expect(fake.calls[0]!.params).toEqual({ model: 'dall-e-2', prompt: 'a lighthouse at dusk', n: 3, size: '512x512', response_format: 'b64_json' });
    expect(rec.log).toEqual(['image 0', 'image 1', 'image 2']);
    for (const image of rec.images) expect(await meta(image.image)).toEqual({ format: 'webp', width: 300, height: 200 });
  });

  it('sends gpt-image-2 an exact valid size, and resizes from the nearest standard size otherwise', async () => {
    const exact = await run(job({ model: 'gpt-image-2' }, { width: 1280, height: 720 }));
    expect(fake.calls[0]!.params.size).toBe('1280x720');
    expect(await meta(exact.images[0]!.image)).toEqual({ format: 'png', width: 1280, height: 720 });

    const odd = await run(job({ model: 'gpt-image-2' }, { width: 1000, height: 1000 }));
    expect(fake.calls[1]!.params.size).toBe('1024x1024');
    expect(await meta(odd.images[0]!.image)).toEqual({ format: 'png', width: 1000, height: 1000 });
  });

  it('crops (cover, centred) rather than stretching when the aspect ratio differs', async () => {
    // A 1536x1024 answer, red with a blue band in the middle: a 1:2 crop of the centre (the middle 512
    // columns) is all blue; stretching or a crop off-centre would show red.
    const answer = await sharp({ create: { width: 1536, height: 1024, channels: 3, background: { r: 255, g: 0, b: 0 } } })
      .composite([{ input: { create: { width: 640, height: 1024, channels: 3, background: { r: 0, g: 0, b: 255 } } }, left: 448, top: 0 }])
      .png()
      .toBuffer();
    fake.faults.push('generations', { status: 200, body: { created: 1, data: [{ b64_json: answer.toString('base64') }] } });
    const rec = await run(job({}, { width: 200, height: 400 }));
    const { channels } = await sharp(rec.images[0]!.image).stats();
    expect([channels[0]!.max, channels[2]!.min]).toEqual([0, 255]);
    expect(await meta(rec.images[0]!.image)).toEqual({ format: 'png', width: 200, height: 400 });
  });

  it('passes an answer that already matches through byte for byte, and re-encodes one that does not', async () => {
    // Encoded differently from sharp's defaults, so a re-encode could not reproduce these bytes.
    const answer = await solid(1024, 1024).png({ compressionLevel: 0 }).toBuffer();
    const reply = { status: 200, body: { created: 1, data: [{ b64_json: answer.toString('base64') }] } };
    fake.faults.push('generations', reply, 2);
    const same = await run(job({}, { outputFormat: 'png' }));
    expect(same.images[0]!.image.equals(answer)).toBe(true);

    const converted = await run(job({}, { outputFormat: 'jpeg', outputCompression: 50 }));
    expect(converted.images[0]!.image.equals(answer)).toBe(false);
    expect(await meta(converted.images[0]!.image)).toEqual({ format: 'jpeg', width: 1024, height: 1024 });
  });

  it("fetches a gateway's url answer without the member's key", async () => {
    const image = await png(1024, 1024);
    const files = await startServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'image/png' });
      res.end(image);
    });
    try {
      fake.faults.push('generations', { status: 200, body: { created: 1, data: [{ url: `${files.url}/img.png?sig=abc`, revised_prompt: 'a lighthouse, revised' }] } });
      const rec = await run(job({ model: 'dall-e-3' }));
      expect(rec.images[0]!.image.equals(image)).toBe(true);
      expect(rec.images[0]!.revisedPrompt).toBe('a lighthouse, revised');
      expect(files.headers).toHaveLength(1);
      expect(files.headers[0]!.authorization).toBeUndefined();
    } finally {
      await files.close();
    }
  });

  it('asks again for the rest when an answer holds fewer images than asked, and fails on an empty one', async () => {
    const one = (await png(1024, 1024)).toString('base64');
    fake.faults.push('generations', { status: 200, body: { created: 1, data: [{ b64_json: one }] } });
    const rec = await run(job({ n: 3 }));
    expect(rec.log).toEqual(['image 0', 'image 1', 'image 2']);
    expect(fake.calls.map((c) => c.params.n)).toEqual([3, 2]);

    fake.faults.push('generations', { status: 200, body: { created: 1, data: [] } });
    const err = await providerErrorOf(run(job()));
    expect([err.kind, err.message]).toEqual(['retryable', 'the upstream image generation answered no image']);
  });
});

describe('reading an answer (its images decoded as they arrive)', () => {
  it("decodes base64 a gateway wrote with escaped slashes (PHP's json_encode), in any chunking", async () => {
    const image = await png(1024, 1024);
    const body = JSON.stringify({ created: 1, data: [{ b64_json: image.toString('base64') }] }).replaceAll('/', '\\/');
    const server = await startServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      // Dribbled in small pieces, some splitting an escape.
      const bytes = Buffer.from(body);
      let at = 0;
      const next = () => {
        if (at >= bytes.length) return void res.end();
        res.write(bytes.subarray(at, (at += 997)));
        setImmediate(next);
      };
      next();
    });
    try {
      const rec = await run(job(), account(server));
      expect(rec.images[0]!.image.equals(image)).toBe(true);
    } finally {
      await server.close();
    }
  });

  it('takes the url of an item whose b64_json is empty; fails retryable on base64 that is not base64', async () => {
    const image = await png(1024, 1024);
    const files = await startServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'image/png' });
      res.end(image);
    });
    try {
      fake.faults.push('generations', { status: 200, body: { created: 1, data: [{ b64_json: '', url: `${files.url}/a.png` }] } });
      expect((await run(job())).images[0]!.image.equals(image)).toBe(true);
      fake.faults.push('generations', { status: 200, body: { created: 1, data: [{ b64_json: 'this is not base64!' }] } });
      const err = await providerErrorOf(run(job()));
      expect([err.kind, err.message]).toEqual(['retryable', 'the upstream image generation answered an image that is not valid base64']);
    } finally {
      await files.close();
    }
  });

  it('refuses an answer with more than 1 MiB besides its images, and one that is not JSON', async () => {
    fake.faults.push('generations', { status: 200, body: { created: 1, data: [{ b64_json: (await png(64, 64)).toString('base64'), revised_prompt: 'x'.repeat(1.1 * 1024 * 1024) }] } });
    const big = await providerErrorOf(run(job()));
    expect([big.kind, big.message]).toEqual(['failed', 'the upstream image generation answered more than 1 MiB besides its images']);
    const server = await startServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<html>{"data": [oops</html>');
    });
    try {
      const html = await providerErrorOf(run(job(), account(server)));
      expect([html.kind, html.message]).toEqual(['retryable', 'the upstream image generation answered something other than JSON']);
    } finally {
      await server.close();
    }
  });
});

describe('edits', () => {
  it('sends one input as part `image` and the mask as `mask`, every value a string', async () => {
    const input = await png(512, 512);
    const mask = await png(512, 512, true);
    const rec = await run(job({ operation: 'edit', inputs: [input], mask, n: 2 }, { quality: 'medium', outputFormat: 'webp', outputCompression: 10 }));
    const call = fake.calls[0]!;
    expect(call.request.path).toBe('/v1/images/edits');
    expect(call.request.headers.authorization).toBe('Bearer sk-test');
    expect(call.request.headers['content-type']).toMatch(/^multipart\/form-data; boundary=/);
    expect(call.request.form!.fields).toEqual({
      model: ['gpt-image-1.5'],
      prompt: ['a lighthouse at dusk'],
      n: ['2'],
      size: ['1024x1024'],
      quality: ['medium'],
      background: ['auto'],
      output_format: ['webp'],
      output_compression: ['10'],
    });
    expect(call.request.form!.files.map((f) => [f.field, f.filename, f.mimeType])).toEqual([
      ['image', 'image-1.png', 'image/png'],
      ['mask', 'mask.png', 'image/png'],
    ]);
    expect(call.images[0]!.data.equals(input)).toBe(true);
    expect(call.mask!.data.equals(mask)).toBe(true);
    expect(call.outcome).toBe('ok');
    expect(rec.log).toEqual(['image 0', 'image 1']);
    expect(await meta(rec.images[0]!.image)).toEqual({ format: 'webp', width: 1024, height: 1024 });
  });

  it('sends several inputs as parts `image[]` with the content type of their bytes; a GIF goes as PNG', async () => {
    const inputs = [await png(64, 64), await solid(64, 64).jpeg().toBuffer(), await solid(64, 64).webp().toBuffer(), await solid(64, 64).gif().toBuffer()];
    await run(job({ operation: 'edit', inputs }));
    const call = fake.calls[0]!;
    expect(call.outcome).toBe('ok');
    expect(call.request.form!.files.map((f) => [f.field, f.filename, f.mimeType])).toEqual([
      ['image[]', 'image-1.png', 'image/png'],
      ['image[]', 'image-2.jpg', 'image/jpeg'],
      ['image[]', 'image-3.webp', 'image/webp'],
      ['image[]', 'image-4.png', 'image/png'],
    ]);
    expect(call.images.map((i) => i.format)).toEqual(['png', 'jpeg', 'webp', 'png']);
    expect(call.images[1]!.data.equals(inputs[1]!)).toBe(true);
  });

  it('sends dall-e-2 a PNG, response_format and no quality', async () => {
    const rec = await run(job({ operation: 'edit', model: 'dall-e-2', inputs: [await solid(256, 256).jpeg().toBuffer()] }, { width: 256, height: 256, quality: 'high' }));
    const call = fake.calls[0]!;
    expect(call.outcome).toBe('ok');
    expect(call.request.form!.fields).toEqual({ model: ['dall-e-2'], prompt: ['a lighthouse at dusk'], n: ['1'], size: ['256x256'], response_format: ['b64_json'] });
    expect(call.request.form!.files.map((f) => [f.field, f.filename, f.mimeType])).toEqual([['image', 'image-1.png', 'image/png']]);
    expect(await meta(rec.images[0]!.image)).toEqual({ format: 'png', width: 256, height: 256 });
  });
});

describe('streaming', () => {
  it('relays each partial as its frame arrives, before the upstream has sent the completed frame', async () => {
    const seen: number[] = [];
    const rec = recorder({ partial: () => void seen.push(slow.calls[0]!.streamEvents) });
    await run(job({}, { partialImages: 2, width: 1000, height: 1000 }), account(slow), rec);
    expect(slow.calls[0]!.params).toMatchObject({ stream: true, partial_images: 2, n: 1 });
    expect(rec.log).toEqual(['partial 0/0', 'partial 0/1', 'image 0']);
    // The upstream had written 1 (then 2) of its 3 frames when each partial reached us.
    expect(seen).toEqual([1, 2]);
    // Partials are previews as the upstream sent them; the image is what the client asked for.
    expect(await meta(rec.partials[0]!)).toEqual({ format: 'png', width: 1024, height: 1024 });
    expect(await meta(rec.images[0]!.image)).toEqual({ format: 'png', width: 1000, height: 1000 });
  });

  it('streams n images as n sequential calls of one image each', async () => {
    const rec = await run(job({ n: 2 }, { partialImages: 1 }));
    expect(fake.calls.map((c) => [c.params.n, c.params.stream, c.params.partial_images])).toEqual([
      [1, true, 1],
      [1, true, 1],
    ]);
    expect(fake.calls[1]!.startedAt).toBeGreaterThanOrEqual(fake.calls[0]!.finishedAt!);
    expect(fake.maxInFlight).toBe(1);
    expect(rec.log).toEqual(['partial 0/0', 'image 0', 'partial 1/0', 'image 1']);
  });

  it('streams edits with multipart string values and relays image_edit partials', async () => {
    fake.streamDone = true; // a terminal `data: [DONE]` is tolerated
    const rec = await run(job({ operation: 'edit', inputs: [await png(128, 128)] }, { partialImages: 2 }));
    expect(fake.calls[0]!.request.form!.fields).toMatchObject({ stream: ['true'], partial_images: ['2'] });
    expect(fake.calls[0]!.outcome).toBe('ok');
    expect(rec.log).toEqual(['partial 0/0', 'partial 0/1', 'image 0']);
  });

  it('does not stream without partials, nor for dall-e models', async () => {
    await run(job({}, { partialImages: 0 }));
    await run(job({ model: 'dall-e-3' }, { partialImages: 2 }));
    expect(fake.calls.map((c) => [c.stream, c.params.stream])).toEqual([
      [false, undefined],
      [false, undefined],
    ]);
  });

  it('takes the completed frame when it comes before all partials (§1.1), and relays only the partials before it', async () => {
    try {
      fake.completedAfterPartials = 1;
      const rec = await run(job({ n: 2 }, { partialImages: 3, width: 1024, height: 1024 }));
      expect(rec.log).toEqual(['partial 0/0', 'image 0', 'partial 1/0', 'image 1']);
      expect(await meta(rec.images[1]!.image)).toEqual({ format: 'png', width: 1024, height: 1024 });
      expect(fake.calls.map((c) => c.params.n)).toEqual([1, 1]);
      fake.completedAfterPartials = 0;
      const first = await run(job({}, { partialImages: 2 }));
      expect(first.log).toEqual(['image 0']);
    } finally {
      fake.completedAfterPartials = undefined;
    }
  });

  it('reads frames without `event:` lines and a last frame without its blank line', async () => {
    const image = (await png(1024, 1024)).toString('base64');
    const sse = await startServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(`data: ${JSON.stringify({ type: 'image_generation.partial_image', b64_json: image, partial_image_index: 0 })}\n\n`);
      res.end(`data: ${JSON.stringify({ type: 'image_generation.completed', b64_json: image })}\n`);
    });
    try {
      const rec = await run(job({}, { partialImages: 1 }), account(sse));
      expect(rec.log).toEqual(['partial 0/0', 'image 0']);
      expect(rec.images[0]!.image.toString('base64')).toBe(image);
    } finally {
      await sse.close();
    }
  });

  it('fails retryable when the stream ends before the completed frame', async () => {
    const image = (await png(64, 64)).toString('base64');
    const sse = await startServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(`event: image_generation.partial_image\ndata: ${JSON.stringify({ type: 'image_generation.partial_image', b64_json: image, partial_image_index: 0 })}\n\n`);
    });
    try {
      const rec = recorder();
      const err = await providerErrorOf(run(job({}, { partialImages: 2 }), account(sse), rec));
      expect([err.kind, err.message]).toEqual(['retryable', 'the upstream stream ended before the image was complete']);
      expect(rec.log).toEqual(['partial 0/0']);
    } finally {
      await sse.close();
    }
  });

  it('classifies an `event: error` frame like an error answer', async () => {
    fake.streamErrorNext('generations', 1, { message: 'Generated image was blocked by the safety system.', type: 'image_generation_user_error', param: null, code: 'moderation_blocked' });
    const rec = recorder();
    const policy = await providerErrorOf(run(job({}, { partialImages: 2 }), account(), rec));
    expect([policy.kind, policy.message, policy.upstreamCode]).toEqual(['policy', 'Generated image was blocked by the safety system.', 'moderation_blocked']);
    expect(rec.log).toEqual(['partial 0/0']);

    fake.streamErrorNext('generations', 0); // the fake's server_error envelope
    const server = await providerErrorOf(run(job({}, { partialImages: 1 })));
    expect([server.kind, server.message]).toEqual(['retryable', 'The server had an error while processing your request. Sorry about that!']);

    fake.streamErrorNext('generations', 1, 'reset');
    const reset = await providerErrorOf(run(job({}, { partialImages: 2 })));
    expect(reset.kind).toBe('retryable');
  });
});

describe('errors', () => {
  it('moderation → policy with the upstream reason', async () => {
    const rec = recorder();
    const err = await providerErrorOf(run(job({ prompt: 'please moderate-me' }), account(), rec));
    expect(err.kind).toBe('policy');
    expect(err.message).toMatch(/^Your request was rejected by the safety system\./);
    expect([err.upstreamStatus, err.upstreamCode]).toEqual([400, 'moderation_blocked']);
    expect(rec.log).toEqual([]);
  });

  it('401 → auth, without any part of the key in the message', async () => {
    const key = 'sk-wrong-0123456789abcdef';
    const err = await providerErrorOf(run(job(), account(fake, key)));
    expect([err.kind, err.upstreamStatus]).toEqual(['auth', 401]);
    expect(err.message).not.toMatch(/sk-|cdef|Incorrect/);
  });

  it('429 → rate_limited with the Retry-After wait; insufficient_quota → quota_exhausted', async () => {
    fake.rateLimitNext('generations', 7);
    const limited = await providerErrorOf(run(job()));
    expect([limited.kind, limited.retryAfterMs, limited.upstreamCode]).toEqual(['rate_limited', 7000, 'rate_limit_exceeded']);
    expect(limited.message).not.toContain('http');

    fake.quotaExhaustedNext('edits');
    const quota = await providerErrorOf(run(job({ operation: 'edit', inputs: [await png(64, 64)] })));
    expect([quota.kind, quota.transient]).toEqual(['quota_exhausted', false]);
  });

  it('the account\'s billing refusals are the account\'s, not the client\'s: billing_hard_limit_reached (a 400) and billing_not_active', async () => {
    fake.faults.push('generations', { status: 400, body: { error: { code: 'billing_hard_limit_reached', message: 'Billing hard limit has been reached', param: null, type: 'invalid_request_error' } } });
    const limit = await providerErrorOf(run(job()));
    expect([limit.kind, limit.transient]).toEqual(['quota_exhausted', false]);
    expect(apiErrorOf(limit)).toMatchObject({ status: 503, code: 'upstream_unavailable' });
    fake.faults.push('generations', { status: 429, body: { error: { code: 'billing_not_active', message: 'Your account is not active, please check your billing details on our website.', param: null, type: 'billing_not_active' } } });
    expect((await providerErrorOf(run(job()))).kind).toBe('account_disabled');
  });

  it('5xx → retryable; an upstream that answers too slowly → retryable timeout', async () => {
    fake.serverErrorNext('generations', 500);
    const server = await providerErrorOf(run(job()));
    expect([server.kind, server.upstreamStatus]).toEqual(['retryable', 500]);

    fake.holdMs = 1000;
    const err = await providerErrorOf(new OpenAIImageProvider(150).generate(account(), job(), new AbortController().signal, recorder().events));
    expect([err.kind, err.message]).toEqual(['retryable', 'the upstream image generation timed out']);
  });

  it('reads retry-after-ms before retry-after, and x-should-retry over the status, as the SDK does', async () => {
    fake.rateLimitNext('generations', 7, 1, { retryAfterMs: 1500 });
    const limited = await providerErrorOf(run(job()));
    expect([limited.kind, limited.retryAfterMs]).toEqual(['rate_limited', 1500]);
    expect(fake.calls.at(-1)!.outcome).toBe('fault');

    // x-should-retry: false makes a 5xx final: no retry, no failover, and still the upstream's failure (502), not the client's.
    fake.serverErrorNext('generations', 503, 1, { shouldRetry: false });
    const final = await providerErrorOf(run(job()));
    expect([final.kind, final.transient, final.upstreamStatus]).toEqual(['failed', false, 503]);
    expect(apiErrorOf(final)).toMatchObject({ status: 502, code: 'upstream_error' });
    fake.serverErrorNext('generations', 503, 1, { shouldRetry: true });
    expect((await providerErrorOf(run(job()))).kind).toBe('retryable');

    // x-should-retry: true makes a refusal transient; it never turns a key or policy refusal into one.
    fake.faults.push('generations', { status: 400, headers: { 'x-should-retry': 'true' }, body: { error: { message: 'Please retry.', type: 'invalid_request_error', param: null, code: null } } });
    const retry = await providerErrorOf(run(job()));
    expect([retry.kind, retry.transient]).toEqual(['retryable', true]);
    fake.faults.push('generations', { status: 401, headers: { 'x-should-retry': 'true' }, body: { error: { message: 'Incorrect API key provided.', type: 'invalid_request_error', param: null, code: 'invalid_api_key' } } });
    expect((await providerErrorOf(run(job()))).kind).toBe('auth');
  });

  it('an error envelope answered with status 200 (some gateways) → classified by its code and type', async () => {
    fake.faults.push('generations', { status: 200, body: { error: { message: 'Upstream model overloaded', type: 'server_error', param: null, code: null } } });
    const overloaded = await providerErrorOf(run(job()));
    expect([overloaded.kind, overloaded.message]).toEqual(['retryable', 'Upstream model overloaded']);
    fake.faults.push('generations', { status: 200, body: { error: { message: 'Blocked.', type: 'image_generation_user_error', param: null, code: 'moderation_blocked' } } });
    expect((await providerErrorOf(run(job()))).kind).toBe('policy');
  });

  it('a parameter the upstream refuses → invalid_request', async () => {
    // gpt-image-2 refuses a transparent background (SDK `background` doc, enforced by the fake).
    const err = await providerErrorOf(run(job({ model: 'gpt-image-2' }, { background: 'transparent', transparent: true })));
    expect([err.kind, err.upstreamStatus]).toEqual(['invalid_request', 400]);
  });
});

describe('the client going away', () => {
  it('stops at the first image it cannot deliver and rethrows that error unchanged', async () => {
    const gone = new Error('client gone');
    const rec = recorder({
      image: () => {
        throw gone;
      },
    });
    const err = await run(job({ model: 'dall-e-3', n: 3 }), account(), rec).catch((e: unknown) => e);
    expect(err).toBe(gone);
    expect(rec.log).toEqual(['image 0']);
    expect(fake.calls).toHaveLength(1);

    const batch = recorder({
      image: () => {
        throw gone;
      },
    });
    expect(await run(job({ n: 3 }), account(), batch).catch((e: unknown) => e)).toBe(gone);
    expect(batch.log).toEqual(['image 0']);
  });

  it('stops a stream when a partial cannot be delivered', async () => {
    const gone = new Error('client gone');
    const rec = recorder({
      partial: () => {
        throw gone;
      },
    });
    expect(await run(job({ n: 2 }, { partialImages: 2 }), account(slow), rec).catch((e: unknown) => e)).toBe(gone);
    expect(rec.log).toEqual(['partial 0/0']);
    await until(() => slow.calls[0]!.outcome !== 'pending');
    expect(slow.calls[0]!.outcome).toBe('reset');
    expect(slow.calls).toHaveLength(1);
  });
});

describe('abort', () => {
  it('abandons a request in flight at once', async () => {
    fake.pause();
    const controller = new AbortController();
    const reason = new Error('step cancelled');
    const pending = run(job(), account(), recorder(), controller.signal).catch((e: unknown) => e);
    await until(() => fake.inFlight === 1);
    controller.abort(reason);
    // The fake is paused: it never answers, so settling at all means the adapter let go.
    expect(await pending).toBe(reason);
    await until(() => fake.inFlight === 0);
  });

  it('abandons a stream between frames', async () => {
    const controller = new AbortController();
    const reason = new Error('step cancelled');
    const rec = recorder({ partial: () => controller.abort(reason) });
    expect(await run(job({}, { partialImages: 3 }), account(slow), rec, controller.signal).catch((e: unknown) => e)).toBe(reason);
    // Three more frames 300 ms apart were still to come: the fake saw its client go away.
    expect(rec.log).toEqual(['partial 0/0']);
    await until(() => slow.calls[0]!.outcome !== 'pending');
    expect(slow.calls[0]!.outcome).toBe('reset');
  });
});
