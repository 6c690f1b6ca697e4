/**
 * What an image request cost, as its client sees it: every ImageTask carries `billing`
 * (ImageBilling), in the `202` of `Prefer: respond-async`, the task lookup and the listing. The
 * price per image and the quote (n × price) are held at creation; what was charged (`actualCredits`
 * for `delivered` images) shows once the task is settled: all n on a whole completion, the images a
 * cut stream delivered, and after an operator's refund the images that stayed charged.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fenceOf } from '../../server/repositories/leased-tasks.ts';
import { NO_LIMITS } from '../../server/services/limits/client-limits.ts';
import { gatedImageProvider } from '../fakes/providers.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';

/** local-image-1's 1K price in this file: a quarter credit (micro-credits), so credits and counts differ. */
const PRICE_MICRO = 250_000;

/** The local images, the second and later held while `gated.afterFirst` is set. */
const { provider: gatedImages, gate: gated } = gatedImageProvider();

let server: TestServer;
beforeAll(async () => {
  // No task engines: a respond-async task stays processing.
  server = await startTestServer({ overrides: { providers: { local: { image: gatedImages } } } });
  await seedCatalog(server.db);
  await server.db.updateTable('modelPrices').set({ unitPrice: PRICE_MICRO }).where('modelId', '=', 'local-image-1').where('resolution', '=', '1K').execute();
});
afterAll(async () => server?.close());

/** The billing of a task of `n` images at this file's price, `delivered` of them charged. */
const billing = (n: number, delivered: number) => ({
  mode: 'per_item',
  unit: 'image',
  unitPrice: 0.25,
  images: n,
  quotedCredits: 0.25 * n,
  actualCredits: 0.25 * delivered,
  delivered,
});

const lookup = async (key: string, id: string) => {
  const { data, response } = await server.client(key).GET('/v1/images/{task_id}', { params: { path: { task_id: id } } });
  expect(response.status).toBe(200);
  return data!;
};

describe('billing on an image task', () => {
  it('a synchronous generation: the lookup shows the quote and n × price charged for n images', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const { response } = await server.client(c.key).POST('/v1/images/generations', { body: { model: 'local-image-1', prompt: 'a lighthouse', n: 2, response_format: 'url' } });
    expect(response.status).toBe(200);
    const id = response.headers.get('x-task-id')!;
    const task = await lookup(c.key, id);
    expect(task).toMatchObject({ id, status: 'completed' });
    expect(task.billing).toEqual(billing(2, 2));
    expect(await holdOf(server.db, id)).toEqual({ amount: 2 * PRICE_MICRO, status: 'captured', captured: 2 * PRICE_MICRO });
  });

  it('a stream cut after 1 of 2 images: delivered 1, actualCredits 1 × price', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    let open!: () => void;
    gated.afterFirst = new Promise((resolve) => (open = resolve));
    try {
      const controller = new AbortController();
      const res = await fetch(`${server.directUrl}/v1/images/generations`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ model: 'local-image-1', prompt: 'a lighthouse', n: 2, stream: true }),
        signal: controller.signal,
      });
      const id = res.headers.get('x-task-id')!;
      const reader = res.body!.getReader();
      let text = '';
      while (!text.includes('event: image_generation.completed')) text += Buffer.from((await reader.read()).value!).toString();
      // The client leaves while the second image is still being made.
      controller.abort();
      const settled = await until(async () => {
        const task = await lookup(c.key, id);
        return task.status !== 'processing' && task;
      }, 10_000, 'the cut stream to settle');
      expect(settled.status).toBe('completed');
      expect(settled.billing).toEqual(billing(2, 1));
      expect(await holdOf(server.db, id)).toEqual({ amount: 2 * PRICE_MICRO, status: 'captured', captured: PRICE_MICRO });
    } finally {
      open?.();
      gated.afterFirst = undefined;
    }
  });

  it('a respond-async 202 shows the quote held and nothing charged yet; the listing shows billing too', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const created = await server.client(c.key).POST('/v1/images/generations', {
      body: { model: 'local-image-1', prompt: 'a lighthouse', n: 3 },
      headers: { Prefer: 'respond-async' },
    });
    expect(created.response.status).toBe(202);
    const asyncId = created.response.headers.get('x-task-id')!;
    expect(created.data).toMatchObject({ id: asyncId, status: 'processing', billing: billing(3, 0) });
    expect((await lookup(c.key, asyncId)).billing).toEqual(billing(3, 0));

    const done = await server.client(c.key).POST('/v1/images/generations', { body: { model: 'local-image-1', prompt: 'a lighthouse', n: 1, response_format: 'url' } });
    expect(done.response.status).toBe(200);
    const doneId = done.response.headers.get('x-task-id')!;

    const { data, response } = await server.client(c.key).GET('/v1/images', { params: { query: { order: 'asc' } } });
    expect(response.status).toBe(200);
    expect(data!.data.map((t) => [t.id, t.status, t.billing])).toEqual([
      [asyncId, 'processing', billing(3, 0)],
      [doneId, 'completed', billing(1, 1)],
    ]);
  });

  it("an operator's refund of a stream that delivered 1 of 2 images shows that image's credits still charged", async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const auth = { accountId: c.accountId, apiKeyId: c.apiKeyId, groupId: c.groupId, limits: NO_LIMITS };
    const images = server.ctx.services.images;
    const task = await images.start(auth, await images.prepare(auth, 'generation', { prompt: 'x', model: 'local-image-1', n: 2, stream: true }), { async: false, stream: true });
    // The stream had sent one image when its outcome became unknown.
    await server.ctx.repositories.imageTasks.needsAttention(fenceOf(task), 'interrupted', { fileIds: [], unrecorded: [], delivered: 1 });
    const waiting = await lookup(c.key, task.id);
    // Nothing is charged while the operator has not settled it: the quote stays held.
    expect([waiting.status, waiting.billing]).toEqual(['needs_attention', billing(2, 0)]);

    const settled = await server.admin().POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: task.id } }, body: { outcome: 'refunded', reason: 'stream cut off' } });
    expect(settled.response.status).toBe(200);
    const refunded = await lookup(c.key, task.id);
    expect([refunded.status, refunded.error?.code, refunded.billing]).toEqual(['failed', 'refunded', billing(2, 1)]);
    expect(await holdOf(server.db, task.id)).toEqual({ amount: 2 * PRICE_MICRO, status: 'captured', captured: PRICE_MICRO });
  });

  it("an operator's refund of a task that delivered nothing shows nothing charged", async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const auth = { accountId: c.accountId, apiKeyId: c.apiKeyId, groupId: c.groupId, limits: NO_LIMITS };
    const images = server.ctx.services.images;
    const task = await images.start(auth, await images.prepare(auth, 'generation', { prompt: 'x', model: 'local-image-1', n: 2 }), { async: false });
    await server.ctx.repositories.imageTasks.needsAttention(fenceOf(task), 'unknown', { fileIds: [], unrecorded: [] });
    const settled = await server.admin().POST('/admin/v1/tasks/{task_id}/settle', { params: { path: { task_id: task.id } }, body: { outcome: 'refunded', reason: 'goodwill' } });
    expect(settled.response.status).toBe(200);
    const refunded = await lookup(c.key, task.id);
    expect([refunded.status, refunded.billing]).toEqual(['failed', billing(2, 0)]);
  });
});
