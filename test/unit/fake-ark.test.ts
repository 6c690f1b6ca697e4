/**
 * The Ark fake against upstream-apis.md §5, §10.3 and the §8 checklist, spoken to with plain fetch
 * (never through an adapter): the error envelope and codes (rows of Volcengine's error-code table
 * on demand), per-account model activation, the platforms' model ids, Seedream's sizes, `data[]`
 * mixing images and errors, SSE with `[DONE]` and the 400 before any event, expiring result URLs on
 * another origin, and the Seedance task states with DELETE.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startArkFake, type ArkFake, type ArkTableError } from '../fakes/ark.ts';

let fake: ArkFake;
beforeAll(async () => {
  fake = await startArkFake({
    accounts: { 'ark-all': {}, 'ark-images-only': { models: ['seedream-4-0-250828'] }, 'ark-overdue': { overdue: true } },
    endpoints: { 'ep-20260101-abcde': 'seedream-4-5-251128' },
    // Long enough phases that a poll every 10 ms sees each one on a loaded machine too.
    timing: (prompt) => (prompt.includes('[phases]') ? { queuedMs: 400, runningMs: 400 } : undefined),
  });
});
afterAll(async () => fake.close());

type Json = Record<string, any>;

async function call(path: string, init: { method?: string; key?: string | null; body?: unknown } = {}) {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (init.key !== null) headers.authorization = `Bearer ${init.key ?? 'ark-all'}`;
  const res = await fetch(`${fake.url}/api/v3${path}`, { method: init.method ?? 'POST', headers, ...(init.body !== undefined && { body: JSON.stringify(init.body) }) });
  const text = await res.text();
  let json: Json = {};
  try {
    json = JSON.parse(text) as Json;
  } catch {
    // an event stream
  }
  return { status: res.status, json, text, headers: res.headers };
}

const image = (body: Record<string, unknown>, key?: string) => call('/images/generations', { body: { model: 'seedream-4-0-250828', response_format: 'b64_json', ...body }, ...(key && { key }) });
const sizeOf = async (b64: string) => {
  const meta = await sharp(Buffer.from(b64, 'base64')).metadata();
  return `${meta.width}x${meta.height}:${meta.format}`;
};
let frame: string;
beforeAll(async () => {
  frame = `data:image/png;base64,${(await sharp({ create: { width: 640, height: 360, channels: 3, background: '#446688' } }).png().toBuffer()).toString('base64')}`;
});

describe('Ark fake: auth, errors and accounts', () => {
  it('answers a missing or unknown key with 401 AuthenticationError in the error envelope', async () => {
    const none = await call('/images/generations', { key: null, body: { model: 'seedream-4-0-250828', prompt: 'x' } });
    const unknown = await image({ prompt: 'x' }, 'sk-unknown');
    for (const res of [none, unknown]) {
      expect(res.status).toBe(401);
      expect(res.json.error).toMatchObject({ code: 'AuthenticationError', type: 'Unauthorized', param: '' });
      expect(res.json.error.message).toMatch(/missing or invalid\. Request id: 0217/);
      expect(res.headers.get('x-request-id')).toMatch(/^0217/);
    }
  });

  it('answers ModelNotOpen for a model the account has not activated, and an overdue account with 403', async () => {
    const notOpen = await call('/contents/generations/tasks', { key: 'ark-images-only', body: { model: 'seedance-1-0-pro-250528', content: [{ type: 'text', text: 'x' }] } });
    expect([notOpen.status, notOpen.json.error.code]).toEqual([404, 'ModelNotOpen']);
    expect((await image({ prompt: 'x' }, 'ark-images-only')).status).toBe(200);
    const overdue = await image({ prompt: 'x' }, 'ark-overdue');
    expect([overdue.status, overdue.json.error.code]).toEqual([403, 'AccountOverdueError']);
  });

  it('knows the platform\'s ids and endpoint ids only', async () => {
    const volcengine = await image({ model: 'doubao-seedream-4-0-250828', prompt: 'x' });
    expect([volcengine.status, volcengine.json.error.code]).toEqual([404, 'InvalidEndpointOrModel.NotFound']);
    const endpoint = await image({ model: 'ep-20260101-abcde', prompt: 'x' });
    expect(endpoint.status).toBe(200);
    // A video model on the image API.
    const wrong = await image({ model: 'seedance-1-0-pro-250528', prompt: 'x' });
    expect([wrong.status, wrong.json.error.code]).toEqual([404, 'UnsupportedModel']);
    const doubao = await startArkFake({ platform: 'volcengine' });
    try {
      const res = await fetch(`${doubao.url}/api/v3/contents/generations/tasks`, {
        method: 'POST',
        headers: { authorization: 'Bearer ark-test', 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'doubao-seedance-2-0-260128', content: [{ type: 'text', text: 'x' }], resolution: '720p', ratio: '16:9', duration: 5 }),
      });
      expect(res.status).toBe(200);
      expect(((await res.json()) as Json).id).toMatch(/^cgt-\d{14}-[a-z0-9]{5}$/);
    } finally {
      await doubao.close();
    }
  });

  it('answers 429 RateLimitExceeded.EndpointRPMExceeded without Retry-After unless asked for one', async () => {
    fake.rateLimitNext('images');
    const plain = await image({ prompt: 'x' });
    expect([plain.status, plain.json.error.code, plain.headers.get('retry-after')]).toEqual([429, 'RateLimitExceeded.EndpointRPMExceeded', null]);
    fake.rateLimitNext('images', 9);
    expect((await image({ prompt: 'x' })).headers.get('retry-after')).toBe('9');
  });
});

describe('Ark fake: rows of Volcengine\'s error-code table', () => {
  const seedance = { model: 'seedance-1-0-pro-250528', content: [{ type: 'text', text: 'x' }] };

  it('answers each row on demand with the table\'s status, type, code and message, the request id where the table puts one', async () => {
    const rows: [ArkTableError, number, string, string, RegExp][] = [
      ['ContentSecurityDetectionError', 400, 'BadRequest', 'ContentSecurityDetectionError', /^Internal error\.ARKRequest ID:(0217\w+);CSDRequestId:\w+;CSDcode:\{\};CSDmessage:\{\}$/],
      ['OperationDenied.ServiceNotOpen', 403, 'Forbidden', 'OperationDenied.ServiceNotOpen', /^Operation is denied because the model service is unavailable, please go to the Volcano Ark console activation management page to activate the corresponding model service, or submit a work order to contact us\.$/],
      ['SetLimitExceeded', 429, 'TooManyRequests', 'SetLimitExceeded', /^Your account \[\d{10}\] has reached the set inference limit for the \[seedream-4-0-250828\] model, and the model service has been paused\. .*"Safe Experience Mode"\. Request ID: (0217\w+)$/],
      ['QuotaExceeded:free-trial', 429, 'TooManyRequests', 'QuotaExceeded', /^Your account \[\d{10}\] has exhausted its free trial quota for the \[seedream-4-0-250828\] model\. Request ID: (0217\w+)$/],
      ['QuotaExceeded:queued-tasks', 429, 'TooManyRequests', 'QuotaExceeded', /^The request has exceeded the quota\. Request ID: (0217\w+)$/],
      ['QuotaExceeded:usage-quota', 429, 'TooManyRequests', 'QuotaExceeded', /^You have exceeded the 5-hour\/weekly\/monthly usage quota\. It will reset at \d{4}-\d\d-\d\dT[\d:.]+Z\.$/],
    ];
    for (const [name, status, type, code, message] of rows) {
      fake.errorNext('images', name);
      const res = await image({ prompt: 'x' });
      expect([res.status, res.json.error.type, res.json.error.code, res.json.error.param], name).toEqual([status, type, code, '']);
      const said = message.exec(res.json.error.message);
      expect(said, `${name}: ${res.json.error.message}`).not.toBeNull();
      if (said?.[1]) expect(said[1]).toBe(res.headers.get('x-request-id'));
    }
    // Once: the next request is served.
    expect((await image({ prompt: 'x' })).status).toBe(200);
  });

  it('answers them on Seedance submits too, after the request is validated and before any task is made', async () => {
    const invalid = await call('/contents/generations/tasks', { body: { ...seedance, duration: 99 } });
    expect(invalid.json.error.code).toBe('InvalidParameter');
    fake.errorNext('submit', 'QuotaExceeded:queued-tasks');
    const tasks = fake.tasks.size;
    const refused = await call('/contents/generations/tasks', { body: seedance });
    expect([refused.status, refused.json.error.code]).toEqual([429, 'QuotaExceeded']);
    expect(fake.tasks.size).toBe(tasks);
    expect((await call('/contents/generations/tasks', { body: seedance })).status).toBe(200);
  });
});

describe('Ark fake: Seedream', () => {
  it('renders WxH within the model\'s pixel range and refuses sizes outside it', async () => {
    const ok = await image({ prompt: 'x', size: '1280x720' });
    expect(ok.status).toBe(200);
    expect(ok.json).toMatchObject({ model: 'seedream-4-0-250828', data: [{ size: '1280x720' }], usage: { generated_images: 1, output_tokens: 3600 } });
    expect(await sizeOf(ok.json.data[0].b64_json)).toBe('1280x720:jpeg');
    // 4.5 starts at 2560x1440 pixels and has no 1K tier.
    for (const size of ['1280x720', '1K']) {
      const refused = await image({ model: 'seedream-4-5-251128', prompt: 'x', size });
      expect([refused.status, refused.json.error.code, refused.json.error.param]).toEqual([400, 'InvalidParameter', 'size']);
    }
    // output_format is 5.0 lite's only.
    expect((await image({ prompt: 'x', output_format: 'png' })).json.error?.param).toBe('output_format');
    const png = await image({ model: 'seedream-5-0-260128', prompt: 'x', size: '2848x1600', output_format: 'png' });
    expect(await sizeOf(png.json.data[0].b64_json)).toBe('2848x1600:png');
  });

  it('takes lowercase data URLs as image inputs, up to 14, and refuses others', async () => {
    const ok = await image({ prompt: 'x', image: [frame, frame] });
    expect(ok.status).toBe(200);
    expect(fake.imageCalls.at(-1)!.images).toEqual([
      { kind: 'data', mimeType: 'image/png', width: 640, height: 360, bytes: expect.any(Number) },
      { kind: 'data', mimeType: 'image/png', width: 640, height: 360, bytes: expect.any(Number) },
    ]);
    const upper = await image({ prompt: 'x', image: frame.replace('image/png', 'image/PNG') });
    expect([upper.status, upper.json.error.param]).toEqual([400, 'image[0]']);
    expect((await image({ prompt: 'x', image: Array(15).fill(frame) })).json.error?.param).toBe('image');
  });

  it('answers data[] mixing images and per-image errors, charging usage for the images only', async () => {
    const res = await image({ prompt: 'four [ark:unsafe-image=1]', sequential_image_generation: 'auto', sequential_image_generation_options: { max_images: 3 } });
    expect(res.status).toBe(200);
    expect(res.json.data.map((d: Json) => (d.error ? d.error.code : d.size))).toEqual(['2048x2048', 'OutputImageSensitiveContentDetected', '2048x2048']);
    expect(res.json.usage.generated_images).toBe(2);
    // An internal error stops the batch; no image at all is a top-level error.
    const broken = await image({ prompt: 'x [ark:broken-image=1]', sequential_image_generation: 'auto', sequential_image_generation_options: { max_images: 3 } });
    expect(broken.json.data.map((d: Json) => d.error?.code ?? 'ok')).toEqual(['ok', 'InternalServiceError']);
    const none = await image({ prompt: 'x [ark:unsafe-image=0]' });
    expect([none.status, none.json.error.code]).toEqual([400, 'OutputImageSensitiveContentDetected']);
    // The model may decide on fewer images than max_images; inputs + max_images ≤ 15.
    const fewer = await image({ prompt: 'x [ark:images=1]', sequential_image_generation: 'auto', sequential_image_generation_options: { max_images: 4 } });
    expect(fewer.json.data).toHaveLength(1);
    const tooMany = await image({ prompt: 'x', image: [frame, frame], sequential_image_generation: 'auto', sequential_image_generation_options: { max_images: 14 } });
    expect(tooMany.json.error?.param).toBe('sequential_image_generation_options.max_images');
  });

  it('streams partial_succeeded, partial_failed and completed with `event:` names, then [DONE]; a bad parameter is a 400 before any event', async () => {
    const res = await image({ prompt: 'x [ark:unsafe-image=1]', stream: true, sequential_image_generation: 'auto', sequential_image_generation_options: { max_images: 3 }, size: '1280x720' });
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    const frames = res.text.split('\n\n').filter(Boolean);
    expect(frames.at(-1)).toBe('data: [DONE]');
    const events = frames.slice(0, -1).map((f) => ({ event: /^event: (.+)$/m.exec(f)![1], data: JSON.parse(/^data: (.+)$/m.exec(f)![1]!) as Json }));
    expect(events.map((e) => [e.event, e.data.type, e.data.image_index])).toEqual([
      ['image_generation.partial_succeeded', 'image_generation.partial_succeeded', 0],
      ['image_generation.partial_failed', 'image_generation.partial_failed', 1],
      ['image_generation.partial_succeeded', 'image_generation.partial_succeeded', 2],
      ['image_generation.completed', 'image_generation.completed', undefined],
    ]);
    expect(events[1]!.data.error.code).toBe('OutputImageSensitiveContentDetected');
    expect(events[3]!.data.usage.generated_images).toBe(2);
    const bad = await image({ prompt: 'x', stream: true, size: '2x2' });
    expect([bad.status, bad.headers.get('content-type'), bad.json.error.code]).toEqual([400, 'application/json', 'InvalidParameter']);
  });

  it('answers url results on another origin, refused once they expire', async () => {
    const res = await image({ prompt: 'x', response_format: 'url' });
    const url = res.json.data[0].url as string;
    expect(new URL(url).origin).toBe(fake.storageUrl);
    expect(url).toContain('X-Tos-Signature=');
    expect((await fetch(url)).status).toBe(200);
    fake.expire(url);
    const gone = await fetch(url);
    expect([gone.status, ((await gone.json()) as Json).Code]).toEqual([403, 'AccessDenied']);
  });
});

describe('Ark fake: Seedance', () => {
  const create = (body: Record<string, unknown>, key?: string) =>
    call('/contents/generations/tasks', { body: { model: 'seedance-1-0-pro-250528', resolution: '720p', ratio: '16:9', duration: 5, ...body }, ...(key && { key }) });

  it('runs a task through queued, running and succeeded, with content.video_url and usage only when done', async () => {
    const created = await create({ content: [{ type: 'text', text: 'a boat [phases]' }] });
    expect(created.status).toBe(200);
    const id = created.json.id as string;
    const states: string[] = [];
    let done: Json = {};
    for (let i = 0; i < 300 && done.status !== 'succeeded'; i++) {
      done = (await call(`/contents/generations/tasks/${id}`, { method: 'GET' })).json;
      if (states.at(-1) !== done.status) states.push(done.status);
      if (done.status !== 'succeeded') expect(done).not.toHaveProperty('content');
      await new Promise((r) => setTimeout(r, 10));
    }
    expect(states).toEqual(['queued', 'running', 'succeeded']);
    expect(done).toMatchObject({ id, model: 'seedance-1-0-pro-250528', error: null, resolution: '720p', ratio: '16:9', duration: 5, framespersecond: 24, usage: { completion_tokens: expect.any(Number) } });
    const bytes = Buffer.from(await (await fetch(done.content.video_url)).arrayBuffer());
    expect(bytes.subarray(4, 8).toString('latin1')).toBe('ftyp');
    // Another account does not see it.
    expect((await call(`/contents/generations/tasks/${id}`, { method: 'GET', key: 'ark-images-only' })).json.error?.code).toBe('ResourceNotFound');
  });

  it('enforces each model\'s inputs, durations and resolutions', async () => {
    const text = [{ type: 'text', text: 'x' }];
    const img = (role?: string) => ({ type: 'image_url', image_url: { url: frame }, ...(role && { role }) });
    const cases: [Record<string, unknown>, string][] = [
      [{ model: 'seedance-1-0-pro-fast-251015', content: [...text, img('first_frame'), img('last_frame')] }, 'content'],
      [{ model: 'seedance-1-0-lite-t2v-250428', content: [...text, img()] }, 'content'],
      [{ model: 'seedance-1-0-lite-i2v-250428', content: text }, 'content'],
      [{ model: 'seedance-1-0-lite-i2v-250428', content: [...text, img('reference_image')], resolution: '1080p' }, 'resolution'],
      [{ model: 'seedance-1-0-pro-250528', content: [...text, img('reference_image')] }, 'content'],
      [{ model: 'dreamina-seedance-2-0-260128', content: text, resolution: '1080p' }, 'resolution'],
      [{ model: 'seedance-1-5-pro-251215', content: text, duration: 3 }, 'duration'],
      [{ content: text, duration: 13 }, 'duration'],
      [{ content: [...text, img('first_frame'), img('reference_image')] }, 'content'],
      [{ model: 'seedance-1-0-lite-i2v-250428', content: [...text, img('reference_image')], camera_fixed: true }, 'camera_fixed'],
    ];
    for (const [body, param] of cases) {
      const res = await create(body);
      expect([res.status, res.json.error?.code, res.json.error?.param], JSON.stringify(body).slice(0, 120)).toEqual([400, 'InvalidParameter', param]);
    }
    const small = await sharp({ create: { width: 300, height: 300, channels: 3, background: '#000' } }).png().toBuffer();
    const tooSmall = await create({ content: [...text, { type: 'image_url', image_url: { url: `data:image/png;base64,${small.toString('base64')}` } }] });
    expect(tooSmall.json.error?.param).toBe('content[1].image_url.url');
    const refs = await create({ model: 'seedance-1-0-lite-i2v-250428', content: [...text, img('reference_image'), img('reference_image')], resolution: '720p' });
    expect(refs.status).toBe(200);
    expect(fake.tasks.get(refs.json.id)!.images.map((i) => i.role)).toEqual(['reference_image', 'reference_image']);
  });

  it('cancels a queued task, refuses to cancel a running one, and deletes a finished one', async () => {
    const queued = await create({ content: [{ type: 'text', text: 'wait [ark:stay-queued]' }] });
    expect((await call(`/contents/generations/tasks/${queued.json.id}`, { method: 'DELETE' })).status).toBe(200);
    expect((await call(`/contents/generations/tasks/${queued.json.id}`, { method: 'GET' })).json.status).toBe('cancelled');
    expect((await call(`/contents/generations/tasks/${queued.json.id}`, { method: 'DELETE' })).status).toBe(400);

    const running = await create({ content: [{ type: 'text', text: 'busy [ark:stay-running]' }] });
    await new Promise((r) => setTimeout(r, 80));
    const refused = await call(`/contents/generations/tasks/${running.json.id}`, { method: 'DELETE' });
    expect([refused.status, refused.json.error.code]).toEqual([400, 'InvalidParameter']);
    expect(fake.statusOf(running.json.id)).toBe('running');

    const failed = await create({ content: [{ type: 'text', text: 'x [ark:unsafe-video]' }] });
    await new Promise((r) => setTimeout(r, 200));
    const body = (await call(`/contents/generations/tasks/${failed.json.id}`, { method: 'GET' })).json;
    expect(body).toMatchObject({ status: 'failed', error: { code: 'OutputVideoSensitiveContentDetected' } });
    expect((await call(`/contents/generations/tasks/${failed.json.id}`, { method: 'DELETE' })).status).toBe(200);
    expect((await call(`/contents/generations/tasks/${failed.json.id}`, { method: 'GET' })).status).toBe(404);
  });
});
