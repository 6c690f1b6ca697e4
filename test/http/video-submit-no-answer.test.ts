/**
 * A video submit that got no answer (a timeout: the upstream may have taken the job) is never sent
 * to another member, where a second account would run it again: the task keeps its member and
 * resubmits there with the same idempotency key. A submit that provably never left (a refused
 * connection) still fails over. Two local members serve the model; the provider is a scripted stand-in.
 */
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { VideoProvider } from '../../server/providers/types.ts';
import { createAccount, createApiKey, createGroup, createMember, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { waitVideoFinished } from '../support/tasks.ts';

/** Each submit: the member it went to and the task. The first submit of a prompt fails as `first` says. */
const submits: { memberId: string; taskId: string }[] = [];
const failedOnce = new Set<string>();
const provider: VideoProvider = {
  pollIntervalMs: 0,
  submit: async (account, job) => {
    submits.push({ memberId: account.memberId, taskId: job.taskId });
    if (!failedOnce.has(job.taskId)) {
      failedOnce.add(job.taskId);
      if (job.prompt.includes('no answer')) throw new ProviderError('retryable', 'the upstream video submit timed out', { maybeAccepted: true });
      if (job.prompt.includes('refused')) throw new ProviderError('retryable', 'the upstream video submit could not be reached');
    }
    return `job-${job.taskId}-${submits.length}`;
  },
  poll: async () => ({ state: 'succeeded', output: {} }),
  download: async () => ({ stream: Readable.from([Buffer.from('mp4 bytes')]), contentType: 'video/mp4', bytes: 9 }),
};

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({ workers: true, overrides: { providers: { local: { video: provider } } } });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

async function twoMemberCustomer() {
  const account = await createAccount(server.db, { balance: 100 });
  const group = await createGroup(server.db);
  for (const name of ['a', 'b']) await createMember(server.db, group.id, { name, models: ['local-video-1'] });
  return createApiKey(server.db, { accountId: account.id, groupId: group.id });
}

async function create(key: string, prompt: string): Promise<string> {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ client_request_id: `${prompt}-${Date.now()}`, prompt, model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p' }),
  });
  expect(res.status).toBe(202);
  return ((await res.json()) as { id: string }).id;
}

describe('a video submit without an answer', () => {
  it('is resubmitted to the same member, never to another one, and the task completes once', async () => {
    const { key } = await twoMemberCustomer();
    const id = await create(key, 'no answer at first');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(2);
    expect(mine[1]!.memberId).toBe(mine[0]!.memberId);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', id).execute();
    expect(entries.map((e) => e.kind).sort()).toEqual(['capture', 'hold']);
  });

  it('moves to the other member when the first one provably never got it (a refused connection)', async () => {
    const { key } = await twoMemberCustomer();
    const id = await create(key, 'refused at first');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(2);
    expect(mine[1]!.memberId).not.toBe(mine[0]!.memberId);
  });
});
