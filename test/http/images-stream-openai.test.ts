/**
 * Image requests served by an OpenAI upstream (the fake OpenAI Images upstream, `gpt-image-1` and
 * `dall-e-3`), on what the answer reports past the images themselves:
 * - the `usage` of a streamed `*.completed` event is the image's as the upstream reported it
 *   (ImageStreamUsage): a streamed upstream call's `completed` frame, or its share of a JSON
 *   answer's; zero only when the upstream reported none;
 * - a failure after some images were delivered is blamed as a failure before any would be (a
 *   refusal of the client's prompt stays a content_policy_violation), and only the delivered
 *   images are charged;
 * - `partial_images` without streaming is ignored: one upstream call for all the images, no stream;
 * - `Accept: text/event-stream` streams a multipart edit as `stream: true` would;
 * - `moderation: low` (OpenAI's parameter) reaches a GPT image upstream's generation, and no other.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startOpenAIImagesFake, type ImageCall, type ImageUsage, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, waitImageTask } from '../support/tasks.ts';
import { addUpstreamMember, plainImageModel } from '../support/upstreams.ts';

type Json = Record<string, any>;

let server: TestServer;
let fake: OpenAIImagesFake;
let key: string;
/** Upstream calls that reach moderation from now on; `refuse` blocks those whose number it names (1-based). */
const moderation = { seen: 0, refuse: (_call: number): boolean => false };

beforeAll(async () => {
  fake = await startOpenAIImagesFake({ apiKeys: ['sk-usage'], moderate: () => moderation.refuse(++moderation.seen) });
  // The task engines run here: a respond-async task is made in the background.
  server = await startTestServer({ workers: true });
  await seedCatalog(server.db);
  await seedCatalog(server.db, [plainImageModel('gpt-img'), plainImageModel('dalle')]);
  const account = await createAccount(server.db, { balance: 1000 });
  const group = await createGroup(server.db);
  await addUpstreamMember(server.db, server.secretKey, {
    groupId: group.id,
    provider: 'openai',
    baseUrl: `${fake.url}/v1`,
    credentials: { api_key: 'sk-usage' },
    models: ['gpt-img', 'dalle'],
    modelMap: { 'gpt-img': 'gpt-image-1', dalle: 'dall-e-3' },
  });
  key = (await createApiKey(server.db, { accountId: account.id, groupId: group.id })).key;
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

/** From now on, upstream call number `k` (1-based) is refused by moderation when `refuse(k)`. */
function moderateCalls(refuse: (call: number) => boolean) {
  moderation.seen = 0;
  moderation.refuse = refuse;
}

async function send(path: string, body: Json | FormData, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.directUrl}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, ...(!(body instanceof FormData) && { 'Content-Type': 'application/json' }), ...headers },
    body: body instanceof FormData ? body : JSON.stringify(body),
  });
  return { status: res.status, taskId: res.headers.get('x-task-id')!, contentType: res.headers.get('content-type') ?? '', text: await res.text() };
}

const generate = (body: Json, headers: Record<string, string> = {}) => send('/v1/images/generations', { prompt: 'a harbour at noon', model: 'gpt-img', ...body }, headers);

function frames(text: string): { event: string; data: Json }[] {
  return text
    .trim()
    .split('\n\n')
    .map((f) => ({ event: /^event: (.*)$/m.exec(f)![1]!, data: JSON.parse(/^data: (.*)$/m.exec(f)![1]!) as Json }));
}

/** The calls the fake received while `run` ran. */
async function callsDuring<T>(run: () => Promise<T>): Promise<{ result: T; calls: ImageCall[] }> {
  const before = fake.calls.length;
  const result = await run();
  return { result, calls: fake.calls.slice(before) };
}

/** The usage a streamed `completed` frame of the upstream carries (the SDK's event shape). */
function streamed(usage: ImageUsage | undefined) {
  const { output_tokens_details: _none, ...rest } = usage!;
  return rest;
}

const ZERO = { input_tokens: 0, output_tokens: 0, total_tokens: 0, input_tokens_details: { text_tokens: 0, image_tokens: 0 } };

describe('the usage of a streamed completed event', () => {
  it("is the usage of the upstream's completed frame, for each image", async () => {
    const { result, calls } = await callsDuring(() => generate({ n: 2, stream: true, partial_images: 1 }));
    expect(calls.map((c) => [c.n, c.stream, c.status])).toEqual([
      [1, true, 200],
      [1, true, 200],
    ]);
    const completed = frames(result.text).filter((f) => f.event === 'image_generation.completed');
    expect(completed.map((f) => f.data.image_index)).toEqual([0, 1]);
    expect(completed.map((f) => f.data.usage)).toEqual(calls.map((c) => streamed(c.usage)));
    expect(completed[0]!.data.usage.total_tokens).toBeGreaterThan(0);
  });

  it("is each image's share of a JSON answer's usage, the shares adding up to it", async () => {
    // Without partials the upstream is not asked to stream: one JSON answer for all three images.
    const { result, calls } = await callsDuring(() => generate({ n: 3, stream: true, prompt: 'a harbour at noon, in ink' }));
    expect(calls.map((c) => [c.n, c.stream])).toEqual([[3, false]]);
    const usage = calls[0]!.usage!;
    const shares = frames(result.text)
      .filter((f) => f.event === 'image_generation.completed')
      .map((f) => f.data.usage as typeof ZERO);
    expect(shares).toHaveLength(3);
    const sum = (pick: (u: typeof ZERO) => number) => shares.reduce((s, u) => s + pick(u), 0);
    expect([sum((u) => u.input_tokens), sum((u) => u.output_tokens), sum((u) => u.total_tokens), sum((u) => u.input_tokens_details.text_tokens), sum((u) => u.input_tokens_details.image_tokens)]).toEqual([
      usage.input_tokens,
      usage.output_tokens,
      usage.total_tokens,
      usage.input_tokens_details.text_tokens,
      usage.input_tokens_details.image_tokens,
    ]);
    // Output tokens are per image (the same size and quality): an even split.
    expect(shares.map((u) => u.output_tokens)).toEqual(Array(3).fill(usage.output_tokens / 3));
  });

  it("of an edit is the usage of the upstream's image_edit.completed frame, input image tokens included", async () => {
    const form = new FormData();
    for (const [name, value] of Object.entries({ prompt: 'paint it blue', model: 'gpt-img', stream: 'true', partial_images: '1' })) form.append(name, value);
    const input = await sharp({ create: { width: 256, height: 256, channels: 3, background: '#808080' } }).png().toBuffer();
    form.append('image', new Blob([input], { type: 'image/png' }), 'in.png');
    const { result, calls } = await callsDuring(() => send('/v1/images/edits', form));
    expect(calls.map((c) => [c.route, c.stream, c.status])).toEqual([['edits', true, 200]]);
    const completed = frames(result.text).filter((f) => f.event === 'image_edit.completed');
    expect(completed.map((f) => f.data.usage)).toEqual([streamed(calls[0]!.usage)]);
    expect(completed[0]!.data.usage.input_tokens_details.image_tokens).toBeGreaterThan(0);
  });

  it('is zero when the upstream reports no usage (dall-e)', async () => {
    const { result, calls } = await callsDuring(() => generate({ model: 'dalle', stream: true }));
    expect(calls.map((c) => [c.model, c.status, c.usage])).toEqual([['dall-e-3', 200, undefined]]);
    expect(frames(result.text).map((f) => [f.event, f.data.usage])).toEqual([['image_generation.completed', ZERO]]);
  });
});

describe("the upstream's revised prompt (dall-e-3)", () => {
  it('is on each image of the answer and of the task looked up after', async () => {
    const res = await generate({ model: 'dalle', prompt: 'a lighthouse at dusk' });
    expect(res.status).toBe(200);
    const revised = 'a lighthouse at dusk, rendered in rich detail.';
    expect((JSON.parse(res.text) as Json).data).toEqual([expect.objectContaining({ revised_prompt: revised })]);
    const lookup = await fetch(`${server.directUrl}/v1/images/${res.taskId}`, { headers: { Authorization: `Bearer ${key}` } });
    expect(((await lookup.json()) as Json).data).toEqual([expect.objectContaining({ revised_prompt: revised })]);
  });
});

describe('partial_images without streaming', () => {
  it('is ignored by a JSON request: one upstream call for every image, not streamed', async () => {
    const { result, calls } = await callsDuring(() => generate({ n: 3, partial_images: 3 }));
    expect(result.status).toBe(200);
    expect((JSON.parse(result.text) as Json).data).toHaveLength(3);
    expect(calls.map((c) => [c.n, c.stream, c.params.partial_images])).toEqual([[3, false, undefined]]);
  });

  it('is ignored by a respond-async request: one upstream call for every image, not streamed', async () => {
    const { result, calls } = await callsDuring(async () => {
      const queued = await generate({ n: 2, partial_images: 2 }, { Prefer: 'respond-async' });
      expect(queued.status).toBe(202);
      expect((await waitImageTask(server.db, queued.taskId, (r) => r.status !== 'processing')).status).toBe('completed');
      return queued;
    });
    expect(calls.map((c) => [c.n, c.stream, c.params.partial_images])).toEqual([[2, false, undefined]]);
    expect(await holdOf(server.db, result.taskId)).toEqual({ amount: 2_000_000, status: 'captured', captured: 2_000_000 });
  });
});

describe('Accept: text/event-stream on a multipart edit (§6.1)', () => {
  it('streams the edit without a stream field: partial and completed frames, the upstream call streamed, the image charged', async () => {
    const form = new FormData();
    for (const [name, value] of Object.entries({ prompt: 'paint it green', model: 'gpt-img', partial_images: '1' })) form.append(name, value);
    const input = await sharp({ create: { width: 256, height: 256, channels: 3, background: '#406080' } }).png().toBuffer();
    form.append('image', new Blob([input], { type: 'image/png' }), 'in.png');
    const { result, calls } = await callsDuring(() => send('/v1/images/edits', form, { Accept: 'text/event-stream' }));
    expect([result.status, result.contentType]).toEqual([200, 'text/event-stream; charset=utf-8']);
    expect(calls.map((c) => [c.route, c.stream, c.status])).toEqual([['edits', true, 200]]);
    const events = frames(result.text);
    expect(events.map((f) => f.event)).toEqual(['image_edit.partial_image', 'image_edit.completed']);
    expect(events.map((f) => f.data.type)).toEqual(['image_edit.partial_image', 'image_edit.completed']);
    expect((await sharp(Buffer.from(events[1]!.data.b64_json as string, 'base64')).metadata()).format).toBe('png');
    expect(await holdOf(server.db, result.taskId)).toEqual({ amount: 1_000_000, status: 'captured', captured: 1_000_000 });
  });
});

describe('an upstream failure after some images were delivered', () => {
  it("in a stream, a refusal of the second image is the client's content_policy_violation, and only the first is charged", async () => {
    moderateCalls((call) => call === 2);
    const { result, calls } = await callsDuring(() => generate({ n: 2, stream: true, partial_images: 1 }));
    moderateCalls(() => false);
    expect(calls.map((c) => [c.status, c.error?.code ?? null])).toEqual([
      [200, null],
      [400, 'moderation_blocked'],
    ]);
    const events = frames(result.text);
    expect(events.map((f) => f.event)).toEqual(['image_generation.partial_image', 'image_generation.completed', 'error']);
    expect(events[2]!.data).toMatchObject({
      type: 'error',
      error: { type: 'invalid_request_error', code: 'content_policy_violation', message: expect.stringMatching(/content policy.* 1 of 2 images were delivered and only those are charged\.$/) },
    });
    expect(await holdOf(server.db, result.taskId)).toEqual({ amount: 2_000_000, status: 'captured', captured: 1_000_000 });
  });

  it('in a JSON answer, the same refusal answers 200 with the delivered image, and only it is charged', async () => {
    // dall-e-3 makes one image per call, so a JSON request can be refused after its first image.
    moderateCalls((call) => call === 2);
    const { result, calls } = await callsDuring(() => generate({ model: 'dalle', n: 2 }));
    moderateCalls(() => false);
    expect(calls.map((c) => [c.n, c.status])).toEqual([
      [1, 200],
      [1, 400],
    ]);
    expect(result.status).toBe(200);
    expect((JSON.parse(result.text) as Json).data).toHaveLength(1);
    expect(await holdOf(server.db, result.taskId)).toEqual({ amount: 2_000_000, status: 'captured', captured: 1_000_000 });
  });

  // Last: the rate limit leaves the member cooling down.
  it("in a stream, the upstream's rate limit of the second image keeps its no_upstream_capacity code", async () => {
    // Armed while the first call is answered, so only the second one meets it.
    moderateCalls((call) => {
      if (call === 1) fake.rateLimitNext('generations', 7);
      return false;
    });
    const { result, calls } = await callsDuring(() => generate({ n: 2, stream: true, partial_images: 1 }));
    moderateCalls(() => false);
    expect(calls.map((c) => c.status)).toEqual([200, 429]);
    const events = frames(result.text);
    expect(events.map((f) => f.event)).toEqual(['image_generation.partial_image', 'image_generation.completed', 'error']);
    expect(events[2]!.data).toMatchObject({ error: { type: 'server_error', code: 'no_upstream_capacity', message: expect.stringMatching(/1 of 2 images were delivered and only those are charged\.$/) } });
    expect(await holdOf(server.db, result.taskId)).toEqual({ amount: 2_000_000, status: 'captured', captured: 1_000_000 });
  });
});

describe('moderation', () => {
  it("'low' is passed on to a GPT image generation; 'auto' (the default) and dall-e send none; an unknown value is 400", async () => {
    // The member rested from what the tests before did to it (cooldowns after their failures).
    await server.db.deleteFrom('memberHealth').execute();
    server.ctx.services.invalidateCaches();
    moderateCalls(() => false);
    const low = await callsDuring(() => generate({ moderation: 'low' }));
    expect(low.result.status, low.result.text).toBe(200);
    expect(low.calls.map((c) => c.params.moderation)).toEqual(['low']);
    const auto = await callsDuring(() => generate({ moderation: 'auto' }));
    expect(auto.calls.map((c) => c.params.moderation)).toEqual([undefined]);
    // dall-e-3 has no such parameter (the fake refuses it as OpenAI does): the request still succeeds.
    const dalle = await callsDuring(() => generate({ model: 'dalle', moderation: 'low' }));
    expect([dalle.result.status, dalle.calls.map((c) => c.params.moderation)]).toEqual([200, [undefined]]);
    const bad = await generate({ moderation: 'none' });
    expect(bad.status).toBe(400);
  });
});
