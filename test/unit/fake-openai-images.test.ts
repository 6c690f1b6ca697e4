/**
 * The fake OpenAI Images upstream (test/fakes/openai-images.ts) against the wire format of
 * ../shared/reference/upstream-apis.md §1: plain fetch/FormData, plus the official SDK as a
 * cross-check that the fake's answers and SSE frames parse as OpenAI's do. No database.
 */
import OpenAI, { toFile } from 'openai';
import sharp from 'sharp';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';

let fake: OpenAIImagesFake;
const KEY = 'sk-test';

beforeAll(async () => {
  fake = await startOpenAIImagesFake({ apiKeys: [KEY, 'sk-other'] });
});
afterAll(async () => {
  await fake.close();
});
afterEach(() => {
  fake.faults.clear();
  fake.holdMs = 0;
  fake.streamDone = false;
});

function post(route: 'generations' | 'edits', body: unknown, key = KEY): Promise<Response> {
  const isForm = body instanceof FormData;
  return fetch(`${fake.url}/v1/images/${route}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, ...(isForm ? {} : { 'content-type': 'application/json' }) },
    body: isForm ? body : JSON.stringify(body),
  });
}

async function errorOf(res: Response): Promise<{ message: string; type: string; param: string | null; code: string | null }> {
  const body = (await res.json()) as { error: { message: string; type: string; param: string | null; code: string | null } };
  expect(Object.keys(body)).toEqual(['error']);
  expect(Object.keys(body.error).sort()).toEqual(['code', 'message', 'param', 'type']);
  return body.error;
}

async function png(width: number, height: number, alpha = false): Promise<Buffer> {
  return sharp({ create: { width, height, channels: alpha ? 4 : 3, background: alpha ? { r: 0, g: 0, b: 0, alpha: 0 } : { r: 10, g: 120, b: 200 } } })
    .png()
    .toBuffer();
}

interface Frame {
  event?: string;
  data: string;
}

function frames(text: string): Frame[] {
  return text
    .split('\n\n')
    .filter((block) => block.trim() !== '')
    .map((block) => {
      const frame: Frame = { data: '' };
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) frame.event = line.slice(7);
        else if (line.startsWith('data: ')) frame.data += line.slice(6);
      }
      return frame;
    });
}

describe('POST /v1/images/generations', () => {
  it('answers the ImagesResponse of §1.3 with decodable images of the requested size and format', async () => {
    const res = await post('generations', { model: 'gpt-image-1', prompt: 'a lighthouse', size: '1536x1024', quality: 'low', output_format: 'jpeg', output_compression: 80, n: 2 });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/json');
    expect(res.headers.get('x-request-id')).toMatch(/^req_[0-9a-f]{32}$/);
    const body = (await res.json()) as Record<string, unknown> & { data: { b64_json: string }[]; usage: Record<string, unknown> };
    expect(Object.keys(body)).toEqual(['created', 'data', 'background', 'output_format', 'quality', 'size', 'usage']);
    expect(body.created).toBeTypeOf('number');
    expect(Math.abs((body.created as number) - Date.now() / 1000)).toBeLessThan(60);
    expect(body).toMatchObject({ background: 'opaque', output_format: 'jpeg', quality: 'low', size: '1536x1024' });
    expect(body.data).toHaveLength(2);
    for (const item of body.data) {
      expect(Object.keys(item)).toEqual(['b64_json']); // no url / revised_prompt for GPT image models
      const meta = await sharp(Buffer.from(item.b64_json, 'base64')).metadata();
      expect([meta.format, meta.width, meta.height]).toEqual(['jpeg', 1536, 1024]);
    }
    const usage = body.usage as { input_tokens: number; output_tokens: number; total_tokens: number; input_tokens_details: { text_tokens: number; image_tokens: number } };
    expect(usage.input_tokens_details.image_tokens).toBe(0);
    expect(usage.input_tokens).toBe(usage.input_tokens_details.text_tokens);
    expect(usage.output_tokens).toBe(2 * 400); // low, landscape, per image
    expect(usage.total_tokens).toBe(usage.input_tokens + usage.output_tokens);
    expect('output_tokens_details' in usage).toBe(false); // gpt-image-1: not a "newer model"

    const call = fake.calls.at(-1)!;
    expect(call).toMatchObject({ route: 'generations', apiKey: KEY, model: 'gpt-image-1', n: 2, stream: false, status: 200, outcome: 'ok' });
    expect(call.params).toEqual({ model: 'gpt-image-1', prompt: 'a lighthouse', size: '1536x1024', quality: 'low', output_format: 'jpeg', output_compression: 80, n: 2 });
  });

  it('resolves auto settings, returns png by default and output_tokens_details for newer models', async () => {
    const res = await post('generations', { model: 'gpt-image-1.5', prompt: 'a fox', background: 'transparent' });
    const body = (await res.json()) as { data: { b64_json: string }[]; size: string; quality: string; background: string; output_format: string; usage: { output_tokens: number; output_tokens_details?: unknown } };
    expect(res.status).toBe(200);
    expect(body).toMatchObject({ size: '1024x1024', quality: 'high', background: 'transparent', output_format: 'png' });
    expect(body.usage.output_tokens_details).toEqual({ image_tokens: body.usage.output_tokens, text_tokens: 0 });
    const meta = await sharp(Buffer.from(body.data[0]!.b64_json, 'base64')).metadata();
    expect([meta.format, meta.width, meta.height, meta.hasAlpha]).toEqual(['png', 1024, 1024, true]);
  });

  it('accepts gpt-image-2 arbitrary sizes within the documented limits', async () => {
    const ok = await post('generations', { model: 'gpt-image-2', prompt: 'wide', size: '1536x864', output_format: 'webp' });
    expect(ok.status).toBe(200);
    const body = (await ok.json()) as { data: { b64_json: string }[]; size: string };
    expect(body.size).toBe('1536x864');
    const meta = await sharp(Buffer.from(body.data[0]!.b64_json, 'base64')).metadata();
    expect([meta.format, meta.width, meta.height]).toEqual(['webp', 1536, 864]);

    const odd = await post('generations', { model: 'gpt-image-2', prompt: 'wide', size: '1792x936' });
    expect(odd.status).toBe(400);
    expect(await errorOf(odd)).toMatchObject({ param: 'size', message: "Invalid size '1792x936'. Width and height must both be divisible by 16." });
    for (const size of ['4000x1008', '3840x1024', '512x512']) {
      const bad = await post('generations', { model: 'gpt-image-2', prompt: 'x', size });
      expect(bad.status, size).toBe(400);
    }
    const transparent = await post('generations', { model: 'gpt-image-2', prompt: 'x', background: 'transparent' });
    expect(transparent.status).toBe(400);
  });

  it('validates as §1.1 documents', async () => {
    const cases: [Record<string, unknown>, string | null, string | null][] = [
      [{ model: 'gpt-image-1', prompt: 'x', size: '512x512' }, 'size', 'invalid_value'],
      [{ model: 'gpt-image-1', prompt: 'x', size: '1792x1024' }, 'size', 'invalid_value'],
      [{ model: 'gpt-image-9', prompt: 'x' }, 'model', 'invalid_value'],
      [{ model: 'gpt-image-1', prompt: 'x', n: 11 }, 'n', 'integer_above_max_value'],
      [{ model: 'gpt-image-1', prompt: 'x', n: 0 }, 'n', 'integer_below_min_value'],
      [{ model: 'gpt-image-1', prompt: 'x', n: '2' }, 'n', 'invalid_type'],
      [{ model: 'gpt-image-1', prompt: 'x', stream: true, partial_images: 4 }, 'partial_images', 'integer_above_max_value'],
      [{ model: 'gpt-image-1', prompt: 'x', quality: 'hd' }, 'quality', 'invalid_value'],
      [{ model: 'gpt-image-1', prompt: 'x', background: 'transparent', output_format: 'jpeg' }, 'background', 'invalid_value'],
      [{ model: 'gpt-image-1', prompt: 'x', output_compression: 101 }, 'output_compression', 'integer_above_max_value'],
      [{ model: 'gpt-image-1', prompt: 'x', response_format: 'b64_json' }, 'response_format', 'unknown_parameter'],
      [{ model: 'gpt-image-1', prompt: 'x', colour: 'red' }, 'colour', 'unknown_parameter'],
      [{ model: 'gpt-image-1' }, 'prompt', 'missing_required_parameter'],
      [{ model: 'gpt-image-1', prompt: 'x'.repeat(32001) }, 'prompt', 'string_above_max_length'],
      [{ model: 'dall-e-3', prompt: 'x', n: 2 }, 'n', 'integer_above_max_value'],
      [{ model: 'dall-e-2', prompt: 'x', stream: true }, 'stream', 'unknown_parameter'],
      [{ model: 'chatgpt-image-latest', prompt: 'x' }, 'model', 'invalid_value'],
    ];
    for (const [body, param, code] of cases) {
      const res = await post('generations', body);
      expect(res.status, JSON.stringify(body).slice(0, 80)).toBe(400);
      expect(res.headers.get('x-request-id')).toBeTruthy();
      const error = await errorOf(res);
      expect({ param: error.param, code: error.code, type: error.type }, JSON.stringify(body).slice(0, 80)).toEqual({ param, code, type: 'invalid_request_error' });
    }
    const size = await errorOf(await post('generations', { model: 'gpt-image-1', prompt: 'x', size: '512x512' }));
    expect(size.message).toBe("Invalid value: '512x512'. Supported values are: '1024x1024', '1536x1024', '1024x1536', and 'auto'.");

    const notJson = await fetch(`${fake.url}/v1/images/generations`, { method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' }, body: '{"prompt":' });
    expect(notJson.status).toBe(400);
    expect((await errorOf(notJson)).message).toMatch(/^We could not parse the JSON body of your request/);
  });

  it('takes the qualities §1.1 lists per model: dall-e-3 hd|standard, dall-e-2 standard, never auto', async () => {
    for (const [body, status] of [
      [{ model: 'dall-e-3', prompt: 'x', quality: 'hd', response_format: 'b64_json' }, 200],
      [{ model: 'dall-e-3', prompt: 'x', quality: 'standard', response_format: 'b64_json' }, 200],
      [{ model: 'dall-e-3', prompt: 'x', quality: 'auto' }, 400],
      [{ model: 'dall-e-2', prompt: 'x', quality: 'standard', size: '256x256', response_format: 'b64_json' }, 200],
      [{ model: 'dall-e-2', prompt: 'x', quality: 'auto', size: '256x256' }, 400],
      [{ model: 'dall-e-2', prompt: 'x', quality: 'hd', size: '256x256' }, 400],
      [{ model: 'gpt-image-1', prompt: 'x', quality: 'standard' }, 400], // generations: no `standard` for GPT image models
    ] as const) {
      const res = await post('generations', body);
      expect(res.status, JSON.stringify(body)).toBe(status);
      if (status === 400) expect(await errorOf(res)).toMatchObject({ param: 'quality', code: 'invalid_value' });
    }
    const auto = await errorOf(await post('generations', { model: 'dall-e-3', prompt: 'x', quality: 'auto' }));
    expect(auto.message).toBe("Invalid value: 'auto'. Supported values are: 'standard' and 'hd'.");
  });

  it('serves dall-e answers without the GPT-only fields', async () => {
    const res = await post('generations', { model: 'dall-e-3', prompt: 'a cat', response_format: 'b64_json', size: '1792x1024' });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { data: { b64_json: string; revised_prompt: string }[] };
    expect(Object.keys(body)).toEqual(['created', 'data']);
    expect(Object.keys(body.data[0]!).sort()).toEqual(['b64_json', 'revised_prompt']);

    const url = await post('generations', { prompt: 'a dog', size: '256x256' }); // default model dall-e-2, url
    const urlBody = (await url.json()) as { data: { url: string }[] };
    expect(fake.calls.at(-1)!.model).toBe('dall-e-2');
    const img = await fetch(urlBody.data[0]!.url);
    expect(img.headers.get('content-type')).toBe('image/png');
    expect((await sharp(Buffer.from(await img.arrayBuffer())).metadata()).width).toBe(256);

    await post('generations', { prompt: 'a dog', output_format: 'webp' }); // a GPT-only parameter: not dall-e-2
    expect(fake.calls.at(-1)!.model).toBe('gpt-image-1');
  });
});

describe('POST /v1/images/edits', () => {
  it('accepts several image[] parts and a mask, and records the files it received', async () => {
    const first = await png(1024, 1536);
    const second = await sharp({ create: { width: 600, height: 400, channels: 3, background: 'red' } }).webp().toBuffer();
    const mask = await png(1024, 1536, true);
    const form = new FormData();
    form.append('model', 'gpt-image-1');
    form.append('prompt', 'put them together');
    form.append('size', 'auto');
    form.append('input_fidelity', 'high');
    form.append('image[]', new Blob([first], { type: 'image/png' }), 'a.png');
    form.append('image[]', new Blob([second], { type: 'image/webp' }), 'b.webp');
    form.append('mask', new Blob([mask], { type: 'image/png' }), 'mask.png');
    const res = await post('edits', form);
    expect(res.status).toBe(200);
    const body = (await res.json()) as { data: { b64_json: string }[]; size: string; usage: { input_tokens_details: { image_tokens: number; text_tokens: number } } };
    expect(body.size).toBe('1024x1536'); // auto → the first image's orientation
    expect(body.usage.input_tokens_details.image_tokens).toBeGreaterThan(0);
    const meta = await sharp(Buffer.from(body.data[0]!.b64_json, 'base64')).metadata();
    expect([meta.width, meta.height]).toEqual([1024, 1536]);

    const call = fake.calls.at(-1)!;
    expect(call.route).toBe('edits');
    expect(call.params).toEqual({ model: 'gpt-image-1', prompt: 'put them together', size: 'auto', input_fidelity: 'high' });
    expect(call.images.map((f) => [f.field, f.filename, f.mimeType, f.format, f.width, f.height])).toEqual([
      ['image[]', 'a.png', 'image/png', 'png', 1024, 1536],
      ['image[]', 'b.webp', 'image/webp', 'webp', 600, 400],
    ]);
    expect(call.images[0]!.data.equals(first)).toBe(true);
    expect(call.mask).toMatchObject({ field: 'mask', filename: 'mask.png', width: 1024, height: 1536, hasAlpha: true });
    const recorded = fake.requests.at(-1)!;
    expect(recorded.form?.files.map((f) => f.field)).toEqual(['image[]', 'image[]', 'mask']);
    expect(recorded.form?.fields.prompt).toEqual(['put them together']);
  });

  it('accepts quality `standard` on edits of GPT image models (§1.2)', async () => {
    const form = new FormData();
    form.append('model', 'gpt-image-1.5');
    form.append('prompt', 'standard edit');
    form.append('quality', 'standard');
    form.append('image', new Blob([await png(64, 64)], { type: 'image/png' }), 'x.png');
    const res = await post('edits', form);
    expect(res.status).toBe(200);
    // ASSUMPTION of the fake: it resolves like `auto`.
    expect(((await res.json()) as { quality: string }).quality).toBe('high');
    expect(fake.calls.at(-1)!.params.quality).toBe('standard');
  });

  it('accepts a single `image` part', async () => {
    const form = new FormData();
    form.append('prompt', 'brighter');
    form.append('image', new Blob([await png(64, 64)], { type: 'image/png' }), 'one.png');
    const res = await post('edits', form);
    expect(res.status).toBe(200);
    expect(fake.calls.at(-1)!.model).toBe('gpt-image-1.5'); // the edits default
  });

  it('refuses images that do not decode, wrong mimetypes, bad masks and moderation on edits', async () => {
    const cases: [(f: FormData) => Promise<void> | void, string, string][] = [
      [(f) => f.append('image[]', new Blob([Buffer.from('not an image at all')], { type: 'image/png' }), 'x.png'), 'image[0]', 'invalid_image_file'],
      [async (f) => f.append('image', new Blob([await png(32, 32)], { type: 'application/octet-stream' }), 'x.png'), 'image', 'unsupported_file_mimetype'],
      [(f) => f.append('image', 'data:image/png;base64,AAAA'), 'image', 'invalid_type'],
      [() => {}, 'image', 'missing_required_parameter'],
      [
        async (f) => {
          f.append('image', new Blob([await png(64, 64)], { type: 'image/png' }), 'x.png');
          f.append('mask', new Blob([await png(32, 32, true)], { type: 'image/png' }), 'm.png');
        },
        'mask',
        'invalid_image_file',
      ],
      [
        async (f) => {
          f.append('image', new Blob([await png(64, 64)], { type: 'image/png' }), 'x.png');
          f.append('moderation', 'low');
        },
        'moderation',
        'unknown_parameter',
      ],
    ];
    for (const [build, param, code] of cases) {
      const form = new FormData();
      form.append('model', 'gpt-image-1');
      form.append('prompt', 'edit');
      await build(form);
      const res = await post('edits', form);
      expect(res.status, `${param} ${code}`).toBe(400);
      expect(await errorOf(res)).toMatchObject({ param, code, type: 'invalid_request_error' });
    }
    const unsupported = await errorOf(await post('edits', (() => {
      const f = new FormData();
      f.append('prompt', 'edit');
      f.append('image', new Blob([Buffer.from('x')], { type: 'application/octet-stream' }), 'x.png');
      return f;
    })()));
    expect(unsupported.message).toBe("Invalid file 'image': unsupported mimetype ('application/octet-stream'). Supported file formats are 'image/jpeg', 'image/png', and 'image/webp'.");
  });
});

describe('streaming (§1.4)', () => {
  it('sends partial_images partial frames then a completed frame with usage, without [DONE] by default', async () => {
    const res = await post('generations', { model: 'gpt-image-1', prompt: 'stream me', stream: true, partial_images: 2, size: '1024x1536', quality: 'medium' });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    expect(res.headers.get('x-request-id')).toBeTruthy();
    const text = await res.text();
    const list = frames(text);
    expect(list.map((f) => f.event)).toEqual(['image_generation.partial_image', 'image_generation.partial_image', 'image_generation.completed']);
    const events = list.map((f) => JSON.parse(f.data) as Record<string, unknown>);
    for (const [i, e] of events.entries()) expect(e.type).toBe(list[i]!.event);
    expect(events.slice(0, 2).map((e) => e.partial_image_index)).toEqual([0, 1]);
    expect(Object.keys(events[0]!).sort()).toEqual(['b64_json', 'background', 'created_at', 'output_format', 'partial_image_index', 'quality', 'size', 'type']);
    expect(events[0]).toMatchObject({ size: '1024x1536', quality: 'medium', background: 'auto', output_format: 'png' }); // requested settings
    const completed = events[2]!;
    expect(Object.keys(completed).sort()).toEqual(['b64_json', 'background', 'created_at', 'output_format', 'quality', 'size', 'type', 'usage']);
    expect(completed).toMatchObject({ size: '1024x1536', quality: 'medium', background: 'opaque', output_format: 'png' }); // resolved
    expect(completed.usage).toMatchObject({ output_tokens: 1584, input_tokens_details: { image_tokens: 0 } });
    const meta = await sharp(Buffer.from(completed.b64_json as string, 'base64')).metadata();
    expect([meta.width, meta.height]).toEqual([1024, 1536]);
    expect(text).not.toContain('[DONE]');
    expect(fake.calls.at(-1)).toMatchObject({ stream: true, outcome: 'ok', streamEvents: 3 });
  });

  it('ends with data: [DONE] when asked, and partial_images 0 gives a single completed frame', async () => {
    fake.streamDone = true;
    const res = await post('generations', { model: 'gpt-image-1-mini', prompt: 'done', stream: true });
    const list = frames(await res.text());
    expect(list.map((f) => f.event ?? f.data)).toEqual(['image_generation.completed', '[DONE]']);
  });

  it('streams edits from multipart `stream: "true"` with image_edit.* frames, n images one after the other', async () => {
    const form = new FormData();
    form.append('model', 'gpt-image-1');
    form.append('prompt', 'edit stream');
    form.append('stream', 'true');
    form.append('partial_images', '1');
    form.append('n', '2');
    form.append('image', new Blob([await png(256, 256)], { type: 'image/png' }), 'x.png');
    const res = await post('edits', form);
    const list = frames(await res.text());
    expect(list.map((f) => f.event)).toEqual(['image_edit.partial_image', 'image_edit.completed', 'image_edit.partial_image', 'image_edit.completed']);
  });

  it('can send the completed frame before all partials (§1.1: "final may arrive before all partials")', async () => {
    fake.completedAfterPartials = 1;
    try {
      const res = await post('generations', { model: 'gpt-image-1', prompt: 'early', stream: true, partial_images: 3, n: 2 });
      const list = frames(await res.text());
      const P = 'image_generation.partial_image';
      const C = 'image_generation.completed';
      expect(list.map((f) => f.event)).toEqual([P, C, P, P, P, C, P, P]);
      expect(list.filter((f) => f.event === P).map((f) => (JSON.parse(f.data) as { partial_image_index: number }).partial_image_index)).toEqual([0, 1, 2, 0, 1, 2]);
      expect(fake.calls.at(-1)).toMatchObject({ outcome: 'ok', streamEvents: 8 });
      fake.completedAfterPartials = 0;
      const first = frames(await (await post('generations', { model: 'gpt-image-1', prompt: 'early', stream: true, partial_images: 1 })).text());
      expect(first.map((f) => f.event)).toEqual([C, P]);
    } finally {
      fake.completedAfterPartials = undefined;
    }
  });

  it('emits an event: error frame mid-stream when told to', async () => {
    fake.streamErrorNext('generations', 1, { message: 'Generated image was blocked.', type: 'image_generation_user_error', param: null, code: 'moderation_blocked' });
    const res = await post('generations', { model: 'gpt-image-1', prompt: 'breaks', stream: true, partial_images: 3 });
    const list = frames(await res.text());
    expect(list.map((f) => f.event)).toEqual(['image_generation.partial_image', 'error']);
    expect(JSON.parse(list[1]!.data)).toEqual({ error: { message: 'Generated image was blocked.', type: 'image_generation_user_error', param: null, code: 'moderation_blocked' } });
    expect(fake.calls.at(-1)).toMatchObject({ outcome: 'stream-error', streamEvents: 2 });
  });

  it('can drop the connection mid-stream after the frames already sent', async () => {
    fake.streamErrorNext('generations', 1, 'reset');
    const res = await post('generations', { model: 'gpt-image-1', prompt: 'drops', stream: true, partial_images: 2 });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    let text = '';
    await expect(
      (async () => {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) return;
          text += Buffer.from(value).toString('utf8');
        }
      })(),
    ).rejects.toThrow();
    expect(frames(text).map((f) => f.event)).toEqual(['image_generation.partial_image']);
    await new Promise((r) => setTimeout(r, 20));
    expect(fake.calls.at(-1)).toMatchObject({ outcome: 'stream-error', status: 0 });
  });

  it('parses with the official SDK (stream and non-stream, edits with an image array)', async () => {
    const client = new OpenAI({ apiKey: KEY, baseURL: `${fake.url}/v1`, maxRetries: 0 });
    const stream = await client.images.generate({ model: 'gpt-image-1', prompt: 'sdk', stream: true, partial_images: 1 });
    const types: string[] = [];
    for await (const event of stream) types.push(event.type);
    expect(types).toEqual(['image_generation.partial_image', 'image_generation.completed']);

    const image = await toFile(await png(128, 128), 'a.png', { type: 'image/png' });
    const image2 = await toFile(await png(128, 128), 'b.png', { type: 'image/png' });
    const edited = await client.images.edit({ model: 'gpt-image-1', prompt: 'sdk edit', image: [image, image2] });
    expect(edited.data?.[0]?.b64_json).toBeTruthy();
    expect(fake.calls.at(-1)!.images.map((f) => f.field)).toEqual(['image[]', 'image[]']);

    fake.streamErrorNext('generations', 0);
    const broken = await client.images.generate({ model: 'gpt-image-1', prompt: 'sdk', stream: true });
    await expect(async () => {
      for await (const _ of broken) void _;
    }).rejects.toThrow(/server had an error/);
  });
});

describe('errors, rate limits and faults (§1.5)', () => {
  it('blocks moderated prompts with the moderation_blocked envelope', async () => {
    const res = await post('generations', { model: 'gpt-image-1', prompt: 'please moderate-me now' });
    expect(res.status).toBe(400);
    const error = await errorOf(res);
    expect(error).toMatchObject({ type: 'image_generation_user_error', param: '', code: 'moderation_blocked' });
    expect(error.message).toMatch(/^Your request was rejected by the safety system\. /);
    expect(error.message).toContain(res.headers.get('x-request-id')!);
  });

  it('answers a bad or missing key with 401', async () => {
    const bad = await post('generations', { model: 'gpt-image-1', prompt: 'x' }, 'sk-wrong-key-123456');
    expect(bad.status).toBe(401);
    expect(bad.headers.get('x-request-id')).toBeTruthy();
    expect(await errorOf(bad)).toMatchObject({ type: 'invalid_request_error', param: null, code: 'invalid_api_key' });
    const missing = await fetch(`${fake.url}/v1/images/generations`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    expect(missing.status).toBe(401);
    await errorOf(missing);
  });

  it('rateLimitNext gives one 429 with retry-after and x-ratelimit-* headers', async () => {
    fake.rateLimitNext('generations', 7);
    const res = await post('generations', { model: 'gpt-image-1', prompt: 'x' });
    expect(res.status).toBe(429);
    expect(res.headers.get('retry-after')).toBe('7');
    expect(res.headers.get('x-ratelimit-limit-requests')).toMatch(/^\d+$/);
    expect(res.headers.get('x-ratelimit-remaining-requests')).toBe('0');
    expect(res.headers.get('x-ratelimit-reset-requests')).toBe('7s');
    // §1.5 lists the token limits next to the request limits.
    expect(res.headers.get('x-ratelimit-limit-tokens')).toMatch(/^\d+$/);
    expect(res.headers.get('x-ratelimit-remaining-tokens')).toMatch(/^\d+$/);
    expect(res.headers.get('x-ratelimit-reset-tokens')).toMatch(/^(\d+m)?\d+(\.\d+)?s$/);
    expect(res.headers.get('retry-after-ms')).toBeNull();
    expect(res.headers.get('x-should-retry')).toBeNull();
    expect(res.headers.get('x-request-id')).toBeTruthy();
    expect(await errorOf(res)).toMatchObject({ type: 'requests', code: 'rate_limit_exceeded', param: null });
    expect((await post('generations', { model: 'gpt-image-1', prompt: 'x' })).status).toBe(200);
  });

  it('adds retry-after-ms and x-should-retry when asked (both read by the SDK, §1.5)', async () => {
    fake.rateLimitNext('generations', 7, 1, { retryAfterMs: 1500, shouldRetry: true });
    const limited = await post('generations', { model: 'gpt-image-1', prompt: 'x' });
    expect([limited.status, limited.headers.get('retry-after'), limited.headers.get('retry-after-ms'), limited.headers.get('x-should-retry')]).toEqual([429, '7', '1500', 'true']);
    fake.serverErrorNext('generations', 503, 1, { shouldRetry: false });
    const final = await post('generations', { model: 'gpt-image-1', prompt: 'x' });
    expect([final.status, final.headers.get('x-should-retry')]).toEqual([503, 'false']);
    expect(await errorOf(final)).toMatchObject({ type: 'server_error' });
    // The SDK gives up at once on x-should-retry: false, even for a 503.
    const client = new OpenAI({ apiKey: KEY, baseURL: `${fake.url}/v1`, maxRetries: 2 });
    fake.serverErrorNext('generations', 503, 1, { shouldRetry: false });
    const before = fake.counts.generations;
    await expect(client.images.generate({ model: 'gpt-image-1', prompt: 'x' })).rejects.toThrow();
    expect(fake.counts.generations).toBe(before + 1);
  });

  it('quotaExhaustedNext gives a 429 insufficient_quota, per route', async () => {
    fake.quotaExhaustedNext('edits');
    expect((await post('generations', { model: 'gpt-image-1', prompt: 'x' })).status).toBe(200);
    const form = new FormData();
    form.append('prompt', 'x');
    form.append('image', new Blob([await png(32, 32)], { type: 'image/png' }), 'x.png');
    const res = await post('edits', form);
    expect(res.status).toBe(429);
    expect(res.headers.get('retry-after')).toBeNull();
    expect(await errorOf(res)).toMatchObject({ type: 'insufficient_quota', code: 'insufficient_quota' });
  });

  it('keeps faults.push working (500, delay, reset)', async () => {
    fake.faults.push('generations', { status: 500, body: { error: { message: 'boom', type: 'server_error', param: null, code: null } }, delayMs: 50 });
    const started = Date.now();
    const res = await post('generations', { model: 'gpt-image-1', prompt: 'x' });
    expect(res.status).toBe(500);
    expect(Date.now() - started).toBeGreaterThanOrEqual(45);
    expect(res.headers.get('x-request-id')).toBeTruthy();
    expect(fake.calls.at(-1)!.outcome).toBe('fault');
    fake.faults.push('generations', { destroy: true });
    await expect(post('generations', { model: 'gpt-image-1', prompt: 'x' })).rejects.toThrow();
    fake.serverErrorNext('generations', 503);
    const unavailable = await post('generations', { model: 'gpt-image-1', prompt: 'x' });
    expect(unavailable.status).toBe(503);
    expect(await errorOf(unavailable)).toMatchObject({ type: 'server_error' });
  });

  it('answers unknown routes with a 404 envelope', async () => {
    const res = await fetch(`${fake.url}/v1/images/variations2`, { method: 'POST', headers: { authorization: `Bearer ${KEY}` } });
    expect(res.status).toBe(404);
    await errorOf(res);
  });
});

describe('options', () => {
  it('serves another basePath, extra model ids, and keeps no log with record: false', async () => {
    const other = await startOpenAIImagesFake({ basePath: '/openai/v1', models: ['relay-image'], record: false, apiKeys: ['k1'] });
    try {
      const res = await fetch(`${other.url}/openai/v1/images/generations`, {
        method: 'POST',
        headers: { authorization: 'Bearer k1', 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'relay-image', prompt: 'x', size: '1024x1536' }),
      });
      expect(res.status).toBe(200);
      expect(((await res.json()) as { size: string }).size).toBe('1024x1536');
      expect(other.requests).toHaveLength(0);
      expect(other.calls).toHaveLength(0);
      expect(other.counts.generations).toBe(1);
    } finally {
      await other.close();
    }
  });
});

describe('slow upstream and in-flight tracking', () => {
  it('holds requests and records the maximum in flight, overall and per key', async () => {
    fake.holdMs = 150;
    fake.resetInFlightStats();
    const started = Date.now();
    const results = await Promise.all([
      ...Array.from({ length: 5 }, () => post('generations', { model: 'gpt-image-1', prompt: 'slow', quality: 'low' }, KEY)),
      ...Array.from({ length: 3 }, () => post('generations', { model: 'gpt-image-1', prompt: 'slow', quality: 'low' }, 'sk-other')),
    ]);
    expect(results.map((r) => r.status)).toEqual(Array(8).fill(200));
    expect(Date.now() - started).toBeGreaterThanOrEqual(145);
    expect(fake.maxInFlight).toBe(8);
    expect(fake.maxInFlightByKey[KEY]).toBe(5);
    expect(fake.maxInFlightByKey['sk-other']).toBe(3);
    await Promise.all(results.map((r) => r.arrayBuffer()));
    await new Promise((r) => setTimeout(r, 20));
    expect(fake.inFlight).toBe(0);
    expect(fake.inFlightByKey[KEY]).toBe(0);
  });

  it('sequential requests never overlap; pause() holds requests until resume()', async () => {
    fake.resetInFlightStats();
    for (let i = 0; i < 3; i++) await (await post('generations', { model: 'gpt-image-1', prompt: 'one at a time' })).arrayBuffer();
    expect(fake.maxInFlight).toBe(1);

    fake.pause();
    const pending = post('generations', { model: 'gpt-image-1', prompt: 'paused' });
    await new Promise((r) => setTimeout(r, 100));
    expect(fake.inFlight).toBe(1);
    fake.resume();
    expect((await pending).status).toBe(200);
  });
});
