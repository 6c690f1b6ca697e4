/**
 * GET /v1/credits after spending (product spec §2.2): `balance` has every hold deducted,
 * `total_spent` counts what was captured (an account's column plus its spend shards, where a
 * settlement that captures its whole hold writes), and `credits_used` counts captured and held
 * credits alike.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createWorkers } from '../../server/workers/index.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';

let server: TestServer;

beforeAll(async () => {
  // No workers: the video's hold stays held until the test runs the engines.
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

describe('GET /v1/credits after spending (§2.2)', () => {
  it('counts a captured image and a held video, then the video once captured', async () => {
    const c = await createCustomer(server.db, { balance: 10, creditLimit: 5 });
    const credits = async () => {
      const { data, response } = await server.client(c.key).GET('/v1/credits');
      expect(response.status).toBe(200);
      return { account: data!.account, used: data!.api_key.credits_used, remaining: data!.api_key.credits_remaining };
    };

    // 1 credit (local-image-1 at 1K), captured at once.
    const image = await server.client(c.key).POST('/v1/images/generations', { body: { prompt: 'x', model: 'local-image-1' } });
    expect(image.response.status).toBe(200);
    // 2 s at 360p, 0.05 credits a second: 0.1 credits held until the task ends.
    const video = await server.client(c.key).POST('/v1/videos/generations', {
      body: { client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' },
    });
    expect(video.response.status).toBe(202);
    const videoId = video.data!.id;
    expect((await holdOf(server.db, videoId)).status).toBe('held');

    expect(await credits()).toEqual({ account: { balance: 8.9, total_earned: 10, total_spent: 1, status: 'active' }, used: 1.1, remaining: 3.9 });

    const workers = createWorkers(server.ctx);
    workers.start();
    try {
      await until(async () => (await holdOf(server.db, videoId)).status === 'captured', 30_000, 'the video hold to be captured');
    } finally {
      await workers.stop();
    }
    expect(await holdOf(server.db, videoId)).toEqual({ amount: 100_000, status: 'captured', captured: 100_000 });

    expect(await credits()).toEqual({ account: { balance: 8.9, total_earned: 10, total_spent: 1.1, status: 'active' }, used: 1.1, remaining: 3.9 });
  });
});
