/**
 * A video submit the upstream answered 2xx but without the job's id (a proxy that rewrote the
 * answer, say) may be running there, billed to that account: it is never sent to another member,
 * where a second account would run it again (design §8). It is asked again of the same member with
 * the same idempotency key, as a submit that timed out is. Two members of the fake OpenAI videos
 * upstream serve the model; the higher one's first create answers 200 without an id.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startOpenAIVideosFake, type OpenAIVideosFake } from '../fakes/openai-video-upstream.ts';
import { createAccount, createApiKey, createGroup, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { waitVideoFinished } from '../support/tasks.ts';
import { SORA_2, addUpstreamMember } from '../support/upstreams.ts';

let server: TestServer;
let fake: OpenAIVideosFake;
beforeAll(async () => {
  fake = await startOpenAIVideosFake({ apiKeys: ['sk-first', 'sk-second'], jobDurationMs: 200, record: true });
  server = await startTestServer({ workers: true, env: { VIDEO_POLL_INTERVAL_MS: '100' } });
  await seedCatalog(server.db, [SORA_2]);
});
afterAll(async () => {
  await server?.close();
  await fake?.close();
});

describe('a video submit answered 2xx without a job id', () => {
  it('is asked again of the same member, never sent to another account, and the task completes there', async () => {
    const account = await createAccount(server.db, { balance: 10 });
    const group = await createGroup(server.db);
    const member = (name: string, priority: number) =>
      addUpstreamMember(server.db, server.secretKey, { groupId: group.id, name, provider: 'openai', baseUrl: `${fake.url}/v1`, credentials: { api_key: `sk-${name}` }, models: [SORA_2.id], priority });
    const first = await member('first', 10);
    await member('second', 0);
    const key = await createApiKey(server.db, { accountId: account.id, groupId: group.id });
    fake.faults.push('create', { status: 200, body: { object: 'video', status: 'queued' } });

    const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ client_request_id: `accepted-${Date.now()}`, prompt: 'a boat', model: SORA_2.id, seconds: 4, aspectRatio: '16:9', resolution: '720p' }),
    });
    expect(res.status).toBe(202);
    const { id } = (await res.json()) as { id: string };
    const { task } = await waitVideoFinished(server, key.key, id);

    expect(task.status).toBe('completed');
    const submits = fake.requests.filter((r) => r.method === 'POST' && r.headers['idempotency-key'] === id).map((r) => r.headers.authorization);
    expect(submits).toEqual(['Bearer sk-first', 'Bearer sk-first']);
    const row = await server.db.selectFrom('videoTasks').select('memberId').where('id', '=', id).executeTakeFirstOrThrow();
    expect(row.memberId).toBe(first.id);
  });
});
