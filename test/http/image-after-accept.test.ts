/**
 * An image the upstream answered 2xx for is never generated again elsewhere: a failure after the
 * 2xx (an answer that breaks off, is not JSON, or holds no usable image) is not moved to the spare
 * member, nor run again by a respond-async task; the client gets 502 upstream_error and the hold is
 * released. Gemini's n parallel calls: one that fails leaves the others' images delivered, and only
 * those charged. Through the public API against the fake OpenAI Images and Gemini upstreams.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startGeminiFake, type GeminiFake } from '../fakes/gemini.ts';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import type { Fault } from '../fakes/fake-http.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';
import { IMAGE_PRO, NANO_BANANA, addUpstreamMember } from '../support/upstreams.ts';

type Json = Record<string, any>;

let server: TestServer;
let openai: OpenAIImagesFake;
let gemini: GeminiFake;

beforeAll(async () => {
  openai = await startOpenAIImagesFake({ apiKeys: ['sk-top', 'sk-spare'] });
  gemini = await startGeminiFake({ apiKeys: ['gm-top', 'gm-spare'] });
  server = await startTestServer({ workers: true });
  await seedCatalog(server.db, [IMAGE_PRO, NANO_BANANA]);
});
afterAll(async () => {
  await server?.close();
  await openai?.close();
  await gemini?.close();
});
beforeEach(() => {
  openai.faults.clear();
  gemini.faults.clear();
});

/** A customer whose group has a preferred member (`*-top`) and a spare (`*-spare`) of `provider`. */
async function customer(provider: 'openai' | 'gemini') {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  const members = provider === 'openai'
    ? { baseUrl: `${openai.url}/v1`, models: [IMAGE_PRO.id], modelMap: { [IMAGE_PRO.id]: 'gpt-image-1.5' }, keys: ['sk-top', 'sk-spare'] }
    : { baseUrl: `${gemini.url}/v1beta`, models: [NANO_BANANA.id], modelMap: {}, keys: ['gm-top', 'gm-spare'] };
  for (const [i, key] of members.keys.entries()) {
    await addUpstreamMember(server.db, server.secretKey, {
      groupId: group.id,
      name: i === 0 ? 'top' : 'spare',
      provider,
      baseUrl: members.baseUrl,
      credentials: { api_key: key },
      models: members.models,
      modelMap: members.modelMap,
      priority: i === 0 ? 10 : 0,
    });
  }
  const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
  return { key: key.key };
}

async function generate(key: string, body: Json, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Json, taskId: res.headers.get('x-task-id')! };
}

/** The API keys of the generation requests the fake Gemini received since `from`, in order. */
const geminiKeys = (from: number) => gemini.requests.slice(from).filter((r) => r.path.includes(':streamGenerateContent')).map((r) => r.headers['x-goog-api-key']);

const notAnImage = Buffer.from('these bytes are valid base64, but no image').toString('base64');

describe('an OpenAI answer that fails after its 200', () => {
  const cases: { what: string; fault: Fault; message: RegExp }[] = [
    { what: 'breaks off mid-body', fault: { cutAfterBytes: 200 }, message: /broke off before its answer was complete/ },
    { what: 'is not JSON', fault: { status: 200, body: Buffer.from('<html><body>Service temporarily unavailable</body></html>'), headers: { 'content-type': 'text/html' } }, message: /answered something other than JSON/ },
    { what: 'holds no image', fault: { status: 200, body: { created: 1, data: [] } }, message: /answered no image/ },
    { what: 'holds an image that cannot be decoded', fault: { status: 200, body: { created: 1, data: [{ b64_json: notAnImage }] } }, message: /could not be decoded/ },
  ];

  for (const { what, fault, message } of cases) {
    it(`${what}: is not retried on the spare member; 502 upstream_error, the hold released`, async () => {
      const c = await customer('openai');
      const before = openai.calls.length;
      openai.faults.push('generations', fault);
      const r = await generate(c.key, { model: IMAGE_PRO.id, prompt: 'a lighthouse', size: '1024x1024' });
      expect(r.status).toBe(502);
      expect(r.body.error.code).toBe('upstream_error');
      expect(r.body.error.message).toMatch(/^The upstream failed: /);
      expect(r.body.error.message).toMatch(message);
      expect(r.body.error.message).toContain('nothing was charged');
      // The upstream made one generation, on the preferred member; the spare was never asked.
      expect(openai.calls.slice(before).map((call) => call.apiKey)).toEqual(['sk-top']);
      expect(await holdOf(server.db, r.taskId)).toEqual({ amount: 40_000, status: 'released', captured: 0 });
      const task = await server.db.selectFrom('imageTasks').select(['status', 'errorCode']).where('id', '=', r.taskId).executeTakeFirstOrThrow();
      expect(task).toEqual({ status: 'failed', errorCode: 'upstream_error' });
    });
  }

  it('breaks off in a respond-async task: the task fails at once, released, without a second generation', async () => {
    const c = await customer('openai');
    const before = openai.calls.length;
    openai.faults.push('generations', { cutAfterBytes: 200 });
    const r = await generate(c.key, { model: IMAGE_PRO.id, prompt: 'a lighthouse', size: '1024x1024' }, { Prefer: 'respond-async' });
    expect(r.status).toBe(202);
    const task = await until(async () => {
      const row = await server.db.selectFrom('imageTasks').select(['status', 'errorCode', 'retries']).where('id', '=', r.taskId).executeTakeFirstOrThrow();
      return row.status === 'failed' || row.status === 'completed' ? row : undefined;
    }, 30_000, 'the task to end');
    expect(task).toEqual({ status: 'failed', errorCode: 'upstream_error', retries: 0 });
    expect(openai.calls.slice(before).map((call) => call.apiKey)).toEqual(['sk-top']);
    expect(await holdOf(server.db, r.taskId)).toEqual({ amount: 40_000, status: 'released', captured: 0 });
  });
});

describe('a Gemini answer that fails after its 200', () => {
  it('a stream that breaks off mid-frame is not retried on the spare member; 502 upstream_error, the hold released', async () => {
    const c = await customer('gemini');
    const from = gemini.requests.length;
    gemini.faults.push('generate', { cutAfterBytes: 300 });
    const r = await generate(c.key, { model: NANO_BANANA.id, prompt: 'a banana' });
    expect(r.status).toBe(502);
    expect(r.body.error.code).toBe('upstream_error');
    expect(r.body.error.message).toMatch(/^The upstream failed: the upstream image generation broke off before its answer was complete\. .*nothing was charged\.$/);
    expect(geminiKeys(from)).toEqual(['gm-top']);
    const hold = await holdOf(server.db, r.taskId);
    expect([hold.status, hold.captured]).toEqual(['released', 0]);
  });
});

describe('Gemini n=3 when one of its calls fails', () => {
  it('delivers the two images that came back and charges for those two only; no call goes to the spare', async () => {
    const c = await customer('gemini');
    const from = gemini.requests.length;
    // Whichever call arrives first gets the 500; the member has no concurrency limit, so all three run at once.
    gemini.serverErrorNext('generate', 500);
    const r = await generate(c.key, { model: NANO_BANANA.id, prompt: 'three bananas', n: 3 });
    expect(r.status).toBe(200);
    expect(r.body.data).toHaveLength(2);
    for (const image of r.body.data as Json[]) expect(Buffer.from(image.b64_json as string, 'base64').subarray(1, 4).toString('latin1')).toBe('PNG');
    expect(geminiKeys(from)).toEqual(['gm-top', 'gm-top', 'gm-top']);
    const hold = await holdOf(server.db, r.taskId);
    expect(hold.status).toBe('captured');
    expect(hold.captured * 3).toBe(hold.amount * 2);
    const task = await server.db.selectFrom('imageTasks').select(['status', 'delivered']).where('id', '=', r.taskId).executeTakeFirstOrThrow();
    expect(task).toEqual({ status: 'completed', delivered: 2 });
  });
});
