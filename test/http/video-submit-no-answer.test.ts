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
import { StorageUnavailable } from '../../server/storage/storage-error.ts';
import { seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { createLocalVideo, twoMemberVideoKey, until, waitVideoFinished } from '../support/tasks.ts';

/** Each submit: the member it went to and the task. A prompt's words script its submits' answers. */
const submits: { memberId: string; taskId: string }[] = [];
/** What the stand-in says of itself (VideoProvider.findsEarlierSubmit), set by a test. */
let findsEarlierSubmit = false;
const provider: VideoProvider = {
  pollIntervalMs: 0,
  get findsEarlierSubmit() {
    return findsEarlierSubmit;
  },
  submit: async (account, job) => {
    submits.push({ memberId: account.memberId, taskId: job.taskId });
    const nth = submits.filter((s) => s.taskId === job.taskId).length;
    const noAnswer = () => new ProviderError('retryable', 'the upstream video submit timed out', { maybeAccepted: true });
    if (nth === 1 && job.prompt.includes('no answer')) throw noAnswer();
    if (nth === 1 && job.prompt.includes('refused')) throw new ProviderError('retryable', 'the upstream video submit could not be reached');
    if (nth <= 3 && job.prompt.includes('never answered')) throw noAnswer();
    // The media store failing while an input is read into the body (upstreamFetch throws it as it is).
    if (nth >= 2 && nth <= 3 && job.prompt.includes('store fails')) throw new StorageUnavailable('input/ab/file', Object.assign(new Error('S3 answered 503 SlowDown'), { code: 'SlowDown' }));
    if (nth === 2 && job.prompt.includes('then busy')) throw new ProviderError('rate_limited', 'the upstream is busy', { retryAfterMs: 10 });
    if (nth === 1 && job.prompt.includes('store down')) throw new StorageUnavailable('input/ab/file', Object.assign(new Error('S3 answered 503 SlowDown'), { code: 'SlowDown' }));
    // What a statement of the step meets when PostgreSQL restarts (an admin shutdown of the session).
    if (nth === 1 && job.prompt.includes('database gone')) throw Object.assign(new Error('terminating connection due to administrator command'), { severity: 'FATAL', code: '57P01' });
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



describe('a video submit without an answer', () => {
  it('is resubmitted to the same member, never to another one, and the task completes once', async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'no answer at first');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(2);
    expect(mine[1]!.memberId).toBe(mine[0]!.memberId);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', id).execute();
    expect(entries.map((e) => e.kind).sort()).toEqual(['capture', 'hold']);
  });

  it('moves to the other member when the first one provably never got it (a refused connection)', async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'refused at first');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(2);
    expect(mine[1]!.memberId).not.toBe(mine[0]!.memberId);
  });

  it('is not sent a third time when the resubmit gets no answer either: failed and refunded: at most two jobs left upstream, never three', async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'never answered');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('failed');
    expect(task.error).toMatchObject({ code: 'upstream_error' });
    expect(task.error?.message).toMatch(/None of the 2 submits of this job got an answer.*refunded/);
    // Refunded as the contract says: quotedCredits unchanged, actualCredits 0.
    expect(task.billing).toMatchObject({ kind: 'snapshot', quotedCredits: expect.any(Number), actualCredits: 0 });
    expect(task.billing.kind === 'snapshot' && task.billing.quotedCredits).toBeGreaterThan(0);
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(2);
    expect(mine[1]!.memberId).toBe(mine[0]!.memberId);
    const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('taskId', '=', id).execute();
    expect(entries.map((e) => e.kind).sort()).toEqual(['hold', 'release']);
  });

  it('does not count a resubmit the upstream answered (it took nothing): the next one is still sent', async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'no answer then busy');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(3);
    expect(new Set(mine.map((s) => s.memberId)).size).toBe(1);
    const row = await server.db.selectFrom('videoTasks').select(['unansweredSubmits', 'upstreamJobId']).where('id', '=', id).executeTakeFirstOrThrow();
    expect(row.upstreamJobId).toBe(`job-${id}-${submits.indexOf(mine[2]!) + 1}`);
    expect(row.unansweredSubmits).toBe(2);
  });

  it('does not count a submit the media store cut short (the upstream never had its whole body): the task completes', async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'no answer, then the store fails twice');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const mine = submits.filter((s) => s.taskId === id);
    expect(mine).toHaveLength(4);
    expect(new Set(mine.map((s) => s.memberId)).size).toBe(1);
  });

  it('leaves a media store failure as the gateway\'s own (its last error names the store, not the provider) and retries', async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'the store down at first');
    const { task } = await waitVideoFinished(server, key, id);
    expect(task.status).toBe('completed');
    const row = await server.db.selectFrom('videoTasks').select('lastError').where('id', '=', id).executeTakeFirstOrThrow();
    expect(row.lastError).toBe('The media store cannot be written.');
  });

  it('does not count an unreachable database as the task\'s failure: the step stops and resumes after its lease', async () => {
    const { key } = await twoMemberVideoKey(server.db);
    const id = await createLocalVideo(server, key, 'the database gone at first');
    await until(() => server.logs.some((l) => l.includes(id) && l.includes('the database is unavailable')), 10_000, 'the step to stop');
    const row = await server.db.selectFrom('videoTasks').select(['lastError', 'retries', 'upstreamJobId']).where('id', '=', id).executeTakeFirstOrThrow();
    expect(row).toEqual({ lastError: null, retries: 0, upstreamJobId: null });
  });

  it('goes on resubmitting where the adapter finds an earlier submit\'s job (no second job can start)', async () => {
    findsEarlierSubmit = true;
    try {
      const { key } = await twoMemberVideoKey(server.db);
      const id = await createLocalVideo(server, key, 'never answered, found later');
      const { task } = await waitVideoFinished(server, key, id);
      expect(task.status).toBe('completed');
      expect(submits.filter((s) => s.taskId === id)).toHaveLength(4);
    } finally {
      findsEarlierSubmit = false;
    }
  });
});
