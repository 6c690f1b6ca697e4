/**
 * A poll's thrown failure is its status call's, not the job's: one the adapter read as the request's
 * (a 400/422 on a status call, say through a relay in front of the upstream) or as policy is asked
 * again, and the running, billed job is collected; it never fails the task as the client's fault.
 * A job that failed comes back as `{ state: 'failed' }` and still fails the task. A scripted stand-in.
 */
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { VideoProvider } from '../../server/providers/types.ts';
import { seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { createLocalVideo, twoMemberVideoKey, waitVideoFinished } from '../support/tasks.ts';

/** Polls per task; a prompt's words script the first poll's answer. */
const polls = new Map<string, number>();
const provider: VideoProvider = {
  pollIntervalMs: 0,
  submit: async (_account, job) => `job|${job.taskId}|${job.prompt}`,
  poll: async (_account, jobId) => {
    const [, taskId, prompt] = jobId.split('|') as [string, string, string];
    const nth = (polls.get(taskId) ?? 0) + 1;
    polls.set(taskId, nth);
    if (nth === 1 && prompt.includes('refused status')) throw new ProviderError('invalid_request', 'the upstream video status answered HTTP 400', { upstreamStatus: 400 });
    if (nth === 1 && prompt.includes('policy status')) throw new ProviderError('policy', 'the upstream video status answered a refusal', { upstreamStatus: 403 });
    if (prompt.includes('job refused')) return { state: 'failed', error: new ProviderError('invalid_request', 'the upstream refused the prompt') };
    return { state: 'succeeded', output: {} };
  },
  download: async () => ({ stream: Readable.from([Buffer.from('mp4 bytes')]), contentType: 'video/mp4', bytes: 9 }),
};

describe('a video poll whose status call is refused', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ workers: true, overrides: { providers: { local: { video: provider } } } });
    await seedCatalog(server.db);
  });
  afterAll(async () => server?.close());

  it.each(['refused status', 'policy status'])('%s: asked again, the job collected and charged once', async (prompt) => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, prompt);
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    expect(polls.get(id)).toBe(2);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', id).execute();
    expect(entries.map((e) => e.kind).sort()).toEqual(['capture', 'hold']);
  });

  it('a job the upstream failed for the request still fails the task as the upstream refusing it, refunded', async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'job refused');
    const { task } = await waitVideoFinished(server, key, id);
    expect([task.status, task.error?.code]).toEqual(['failed', 'upstream_rejected']);
  });
});
