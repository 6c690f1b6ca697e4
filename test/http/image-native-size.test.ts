/**
 * A `resize: native` model keeps the upstream's image at its own size, so the runner reads that size
 * from the image (nativeSize in services/image/image-runner.ts) for the file it stores. An image
 * whose header declares no pixel size (0 wide) was still made, and billed, by the upstream: the
 * failure is `maybeAccepted`, so a background task fails at once, released, instead of trying again
 * and paying for a second image. The marking lives in the runner, so this goes through the public
 * API, against the fake OpenAI Images upstream.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CatalogModelDefinition } from '../../server/catalog/capabilities.ts';
import { startOpenAIImagesFake, type OpenAIImagesFake } from '../fakes/openai-images.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';
import { IMAGE_PRO, addUpstreamMember } from '../support/upstreams.ts';

const NATIVE: CatalogModelDefinition = { ...IMAGE_PRO, id: 'image-pro-native', capabilities: { ...IMAGE_PRO.capabilities, resize: 'native' } };

let server: TestServer;
let openai: OpenAIImagesFake;
let key: string;

beforeAll(async () => {
  openai = await startOpenAIImagesFake({ apiKeys: ['sk-native'] });
  server = await startTestServer({ workers: true });
  await seedCatalog(server.db, [NATIVE]);
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  await addUpstreamMember(server.db, server.secretKey, {
    groupId: group.id,
    provider: 'openai',
    baseUrl: `${openai.url}/v1`,
    credentials: { api_key: 'sk-native' },
    models: [NATIVE.id],
    modelMap: { [NATIVE.id]: 'gpt-image-1.5' },
  });
  key = (await createApiKey(server.db, { accountId: account.id, groupId: group.id })).key;
});
afterAll(async () => {
  await server?.close();
  await openai?.close();
});

/** A PNG whose IHDR says 0 pixels wide: no size to record (the header is read, the image never decoded). */
async function pngWithoutWidth(): Promise<Buffer> {
  const png = await sharp({ create: { width: 8, height: 8, channels: 3, background: '#f80' } }).png().toBuffer();
  png.writeUInt32BE(0, 16);
  return png;
}

describe('resize: native, an upstream image without a pixel size', () => {
  it('fails a background task at once (maybe accepted): released, no second generation', async () => {
    const before = openai.calls.length;
    openai.faults.push('generations', { status: 200, body: { created: 1, data: [{ b64_json: (await pngWithoutWidth()).toString('base64') }] } });
    const res = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', Prefer: 'respond-async' },
      body: JSON.stringify({ model: NATIVE.id, prompt: 'a lighthouse' }),
    });
    expect(res.status).toBe(202);
    const taskId = res.headers.get('x-task-id')!;
    const task = await until(
      async () => {
        const row = await server.db.selectFrom('imageTasks').select(['status', 'errorCode', 'errorMessage', 'retries']).where('id', '=', taskId).executeTakeFirstOrThrow();
        return row.status === 'failed' || row.status === 'completed' ? row : undefined;
      },
      30_000,
      'the task to end',
    );
    expect([task.status, task.errorCode, task.retries]).toEqual(['failed', 'upstream_error', 0]);
    expect(task.errorMessage).toContain('without a pixel size');
    expect(openai.calls.length - before).toBe(1);
    expect(await holdOf(server.db, taskId)).toEqual({ amount: 40_000, status: 'released', captured: 0 });
  });
});
