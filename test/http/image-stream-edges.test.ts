/**
 * Image event streams at their edges: a long upstream call keeps the stream alive with SSE comments
 * (a proxy's idle timeout would cut it), `Accept` weights decide between JSON and a stream, and what
 * an OpenAI-compatible upstream may stream differently from OpenAI (found by a review): an error frame
 * with no `event:` line (its payload's `type` says it), partials numbered from 1 or more of them than
 * asked for. A 5xx error event carries the request id as a JSON error does. What fails before any
 * upstream call (no capacity) is answered with its status, not as a 200 stream's error event. `custom` is a bare
 * OpenAI-compatible upstream whose stream each test writes; the OpenAI fake serves the rest.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf } from '../support/tasks.ts';
import { addUpstreamMember, plainImageModel } from '../support/upstreams.ts';

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let server: TestServer;
let fake: OpenAIImagesFake;
let key: string;
/** A key whose group is served by `custom` (a hand-written OpenAI-compatible SSE upstream). */
let customKey: string;
let custom: Server;
let customUrl: string;
/** What the custom upstream streams for the next request (raw SSE text). */
let customBody = '';
let png: Buffer;

beforeAll(async () => {
  png = await sharp({ create: { width: 1024, height: 1024, channels: 3, background: '#336699' } }).png().toBuffer();
  fake = await startOpenAIImagesFake({ apiKeys: ['sk-rev'] });
  custom = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(customBody);
    });
  });
  await new Promise<void>((r) => custom.listen(0, '127.0.0.1', r));
  customUrl = `http://127.0.0.1:${(custom.address() as AddressInfo).port}/v1`;

  // A wait for a free member three keep-alive periods long: nothing may commit the stream's status meanwhile.
  server = await startTestServer({ env: { STREAM_KEEPALIVE_MS: '200', IMAGE_CAPACITY_WAIT_MS: '600' } });
  await seedCatalog(server.db);
  await seedCatalog(server.db, [plainImageModel('gpt-img')]);
  key = await keyServedBy(`${fake.url}/v1`, 'sk-rev');
  customKey = await keyServedBy(customUrl, 'sk-custom');
});

/** A key of a new account whose group's one member is the OpenAI(-compatible) upstream at `baseUrl`, serving 'gpt-img' as gpt-image-1. */
async function keyServedBy(baseUrl: string, apiKey: string, concurrencyLimit: number | null = null): Promise<string> {
  const account = await createAccount(server.db, { balance: 1000 });
  const group = await createGroup(server.db);
  await addUpstreamMember(server.db, server.secretKey, {
    groupId: group.id,
    provider: 'openai',
    baseUrl,
    credentials: { api_key: apiKey },
    models: ['gpt-img'],
    modelMap: { 'gpt-img': 'gpt-image-1' },
    concurrencyLimit,
  });
  return (await createApiKey(server.db, { accountId: account.id, groupId: group.id })).key;
}

afterAll(async () => {
  await server?.close();
  await fake?.close();
  await new Promise((r) => custom?.close(r));
});

async function send(path: string, body: Json | FormData, headers: Record<string, string> = {}, apiKey = key) {
  const res = await fetch(`${server.directUrl}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${apiKey}`, ...(!(body instanceof FormData) && { 'Content-Type': 'application/json' }), ...headers },
    body: body instanceof FormData ? body : JSON.stringify(body),
  });
  return { status: res.status, taskId: res.headers.get('x-task-id')!, contentType: res.headers.get('content-type') ?? '', text: await res.text() };
}

const generate = (body: Json, headers: Record<string, string> = {}, apiKey = key) =>
  send('/v1/images/generations', { prompt: 'a harbour at noon', model: 'gpt-img', ...body }, headers, apiKey);

function frames(text: string): { event: string; data: Json }[] {
  return text
    .trim()
    .split('\n\n')
    .filter((f) => /^data: /m.test(f))
    .map((f) => ({ event: /^event: (.*)$/m.exec(f)?.[1] ?? '', data: JSON.parse(/^data: (.*)$/m.exec(f)![1]!) as Json }));
}

describe('a long upstream call', () => {
  it('keeps the stream alive with SSE comments while nothing else is sent, and the frames stay whole', async () => {
    fake.holdMs = 1_000;
    try {
      const started = Date.now();
      const res = await fetch(`${server.directUrl}/v1/images/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ prompt: 'a slow harbour', model: 'gpt-img', stream: true }),
      });
      expect(res.status).toBe(200);
      const reader = res.body!.getReader();
      const first = await reader.read();
      expect(Date.now() - started).toBeLessThan(1_000);
      expect(Buffer.from(first.value!).toString('utf8')).toMatch(/^: keep-alive\n\n/);
      let text = Buffer.from(first.value!).toString('utf8');
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += Buffer.from(chunk.value).toString('utf8');
      expect(text.match(/^: keep-alive$/gm)!.length).toBeGreaterThanOrEqual(2);
      expect(frames(text).map((e) => e.event)).toEqual(['image_generation.completed']);
    } finally {
      fake.holdMs = 0;
    }
  });
});

describe('Accept', () => {
  for (const [accept, streamed] of [
    ['application/json, text/event-stream;q=0.1', false],
    ['text/event-stream;q=0.5, application/json;q=0.4', true],
    ['application/json, text/event-stream', true],
    ['TEXT/EVENT-STREAM', true],
    ['text/event-stream;q=0', false],
    ['*/*', false],
  ] as const) {
    it(`'${accept}' answers ${streamed ? 'a stream' : 'JSON'}`, async () => {
      const res = await generate({}, { Accept: accept });
      expect(res.status).toBe(200);
      expect(res.contentType).toMatch(streamed ? /^text\/event-stream/ : /^application\/json/);
    });
  }
});

describe("an OpenAI-compatible upstream's stream", () => {
  const b64 = () => png.toString('base64');
  const partial = (i: number, eventLine = true) =>
    `${eventLine ? 'event: image_generation.partial_image\n' : ''}data: ${JSON.stringify({ type: 'image_generation.partial_image', b64_json: b64(), partial_image_index: i, created_at: 1, size: '1024x1024', quality: 'high', background: 'opaque', output_format: 'png' })}\n\n`;
  const completed = () =>
    `event: image_generation.completed\ndata: ${JSON.stringify({ type: 'image_generation.completed', b64_json: b64(), created_at: 1, size: '1024x1024', quality: 'high', background: 'opaque', output_format: 'png', usage: { input_tokens: 1, output_tokens: 1, total_tokens: 2, input_tokens_details: { text_tokens: 1, image_tokens: 0 } } })}\n\n`;

  it("reads an error frame without an event: line by its payload's type: a refusal is the client's, released", async () => {
    customBody = partial(0, false) + `data: ${JSON.stringify({ type: 'error', code: 'moderation_blocked', message: 'Your request was rejected by the safety system.', param: null })}\n\n`;
    const res = await generate({ stream: true, partial_images: 1 }, {}, customKey);
    const events = frames(res.text);
    expect(events.map((e) => e.event)).toEqual(['image_generation.partial_image', 'error']);
    expect(events[1]!.data.error.code).toBe('content_policy_violation');
    expect(await holdOf(server.db, res.taskId)).toMatchObject({ status: 'released', captured: 0 });
  });

  it('numbers the partials from 0 whatever the upstream says, and relays no more than were asked for', async () => {
    customBody = partial(1) + partial(2) + partial(3) + completed();
    const res = await generate({ stream: true, partial_images: 2 }, {}, customKey);
    const events = frames(res.text);
    expect(events.map((e) => [e.event, e.data.partial_image_index])).toEqual([
      ['image_generation.partial_image', 0],
      ['image_generation.partial_image', 1],
      ['image_generation.completed', undefined],
    ]);
  });

  it('a 5xx error event carries the request id, as the JSON error answer does', async () => {
    // A partial, then the stream ends without the completed frame: 502 upstream_error.
    customBody = partial(0);
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${customKey}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'x', model: 'gpt-img', stream: true, partial_images: 1 }),
    });
    const requestId = res.headers.get('x-request-id');
    const last = frames(await res.text()).at(-1)!;
    expect([last.event, last.data.error.code, last.data.error.request_id]).toEqual(['error', 'upstream_error', requestId]);
    expect(requestId).toMatch(/\S/);
  });
});

describe('a stream refused before any upstream call', () => {
  it('is answered 503 no_upstream_capacity in JSON with Retry-After (SDKs retry it) after the wait, not a 200 stream with an error event', async () => {
    const busyKey = await keyServedBy(`${fake.url}/v1`, 'sk-rev', 1);
    fake.pause();
    try {
      const first = generate({}, {}, busyKey);
      await vi.waitUntil(() => fake.inFlight === 1);
      const res = await fetch(`${server.directUrl}/v1/images/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${busyKey}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ prompt: 'x', model: 'gpt-img', stream: true }),
      });
      const body = (await res.json()) as Json;
      expect([res.status, body.error.code]).toEqual([503, 'no_upstream_capacity']);
      expect(res.headers.get('content-type')).toMatch(/^application\/json/);
      expect(Number(res.headers.get('retry-after'))).toBeGreaterThan(0);
      expect(res.headers.get('x-task-id')).toMatch(/^img_/);
      expect(await holdOf(server.db, res.headers.get('x-task-id')!)).toMatchObject({ status: 'released', captured: 0 });
      fake.resume();
      expect((await first).status).toBe(200);
    } finally {
      fake.resume();
    }
  });
});
