/**
 * What a synchronous image request leaves in the log and the HTTP metrics when its client leaves
 * (http/access-log.ts writes the request's line when the connection closes, which may be before the
 * task settles), and that a failed synchronous image writes no line of its own at info while a
 * respond-async one still does (Settlement.failImage).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LocalImageProvider } from '../../server/providers/local/local-image.provider.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';
import type { ImageProvider } from '../../server/providers/types.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until, waitImageTask } from '../support/tasks.ts';

type Json = Record<string, any>;

const local = new LocalImageProvider();
const aborted = (signal: AbortSignal) =>
  new Promise<void>((resolve) => (signal.aborted ? resolve() : signal.addEventListener('abort', () => resolve(), { once: true })));

/**
 * The local provider, held by the prompt: `two then wait` delivers two images, then waits for the
 * request's abort; `wait` waits for it before any image; `refuse` is refused as invalid. `started`
 * resolves once a held job is running (the task exists, the client may leave).
 */
function heldProvider() {
  let started!: () => void;
  const state = { started: new Promise<void>((resolve) => (started = resolve)) };
  const provider: ImageProvider = {
    async generate(account, job, signal, events) {
      if (job.prompt === 'refuse') throw new ProviderError('invalid_request', 'the upstream does not like this prompt');
      if (job.prompt === 'wait') {
        started();
        await aborted(signal);
        return;
      }
      await local.generate(account, job, signal, {
        partial: events.partial,
        image: async (index, image) => {
          await events.image(index, image);
          if (index === 1) {
            started();
            await aborted(signal);
          }
        },
      });
    },
  };
  return { provider, state, reset: () => (state.started = new Promise<void>((resolve) => (started = resolve))) };
}

const held = heldProvider();
let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({ workers: true, overrides: { providers: { local: { image: held.provider } } } });
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

const linesOf = (taskId: string) => server.logs.map((l) => JSON.parse(l) as Json).filter((l) => l.taskId === taskId);

function generate(key: string, body: Json, headers: Record<string, string>, signal?: AbortSignal) {
  return fetch(`${server.directUrl}/v1/images/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'local-image-1', ...body }),
    signal,
  });
}

describe('a synchronous image whose client leaves before it settles', () => {
  it('a stream that delivered 2 of 4 images logs what it captured on a line of its own, after the request line', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    held.reset();
    const client = new AbortController();
    const res = await generate(c.key, { prompt: 'two then wait', n: 4, stream: true }, { 'X-Request-Id': 'left-mid-stream' }, client.signal);
    const taskId = res.headers.get('x-task-id')!;
    const reader = res.body!.getReader();
    let text = '';
    while (text.split('event: image_generation.completed').length - 1 < 2) text += new TextDecoder().decode((await reader.read()).value);
    await held.state.started;
    client.abort();

    const task = await waitImageTask(server.db, taskId, (r) => r.status !== 'processing');
    expect(task).toMatchObject({ status: 'completed', delivered: 2, actualCredits: 2_000_000 });
    expect(await holdOf(server.db, taskId)).toEqual({ amount: 4_000_000, status: 'captured', captured: 2_000_000 });
    const settled = await until(() => linesOf(taskId).find((l) => l.msg === 'image task settled after its client went away'), 10_000, 'the settlement line');
    expect(settled).toMatchObject({ level: 30, reqId: 'left-mid-stream', taskId, delivered: 2, capturedMicroCredits: 2_000_000 });
    // The request's line went out when the connection closed: it has the task, not the charge.
    const request = linesOf(taskId).filter((l) => l.msg === 'client went away before the response ended');
    expect(request).toHaveLength(1);
    expect(request[0]).toMatchObject({ reqId: 'left-mid-stream', status: 200, operation: 'createImage', taskId, n: 4 });
    expect(request[0]).not.toHaveProperty('capturedMicroCredits');
  });

  it('a JSON answer left before its head went out is counted and logged as 499, and its release is logged once', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    held.reset();
    const metric = 'mediagate_http_requests_total{operation="createImage",method="POST",status="499"}';
    const count = async () => Number((await server.ctx.metrics.registry.metrics()).split('\n').find((l) => l.startsWith(metric))?.split(' ')[1] ?? 0);
    const before = await count();
    const client = new AbortController();
    const pending = generate(c.key, { prompt: 'wait', n: 2 }, { 'X-Request-Id': 'left-before-head' }, client.signal).catch((err: unknown) => err);
    await held.state.started;
    client.abort();
    expect(await pending).toBeInstanceOf(Error);

    const task = await until(() => server.db.selectFrom('imageTasks').select(['id', 'status', 'errorCode']).where('accountId', '=', c.accountId).where('status', '!=', 'processing').executeTakeFirst(), 10_000, 'the task to end');
    expect(task).toMatchObject({ status: 'failed', errorCode: 'client_disconnected' });
    const settled = await until(() => linesOf(task.id).find((l) => l.msg === 'image task settled after its client went away'), 10_000, 'the settlement line');
    expect(settled).toMatchObject({ reqId: 'left-before-head', delivered: 0, capturedMicroCredits: 0 });
    const request = linesOf(task.id).filter((l) => l.reqId === 'left-before-head' && l.msg !== 'image task settled after its client went away');
    expect(request).toEqual([expect.objectContaining({ msg: 'client went away before the response ended', status: 499, operation: 'createImage' })]);
    expect(await count()).toBe(before + 1);
    // The settlement line says it: the failure itself is no second line at info.
    expect(linesOf(task.id).filter((l) => l.msg === 'image task failed; credits released')).toEqual([]);
  });
});

describe('a failed image task', () => {
  it('synchronous: its failure is on its request line (a warning), with no line of its own at info', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { prompt: 'refuse' }, { 'X-Request-Id': 'refused-sync' });
    expect(res.status).toBe(400);
    const taskId = res.headers.get('x-task-id')!;
    await res.text();
    await until(() => linesOf(taskId).some((l) => l.msg === 'request'), 10_000, 'the request line');
    expect((await server.db.selectFrom('imageTasks').select('status').where('id', '=', taskId).executeTakeFirstOrThrow()).status).toBe('failed');
    expect(linesOf(taskId).filter((l) => l.msg === 'request')).toEqual([expect.objectContaining({ level: 40, status: 400, reqId: 'refused-sync', errorCode: expect.any(String) })]);
    expect(linesOf(taskId).filter((l) => l.level <= 30)).toEqual([]);
  });

  it('streamed: the request line (status 200) names the error the stream ended with', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { prompt: 'refuse', stream: true }, { 'X-Request-Id': 'refused-stream' });
    expect(res.status).toBe(200);
    const taskId = res.headers.get('x-task-id')!;
    expect(await res.text()).toContain('event: error');
    const line = await until(() => linesOf(taskId).find((l) => l.msg === 'request'), 10_000, 'the request line');
    expect(line).toMatchObject({ status: 200, reqId: 'refused-stream', errorCode: expect.any(String) });
  });

  it('respond-async: its failure is logged, apart from its request', async () => {
    const c = await createCustomer(server.db, { balance: 10 });
    const res = await generate(c.key, { prompt: 'refuse' }, { Prefer: 'respond-async' });
    expect(res.status).toBe(202);
    const taskId = res.headers.get('x-task-id')!;
    const failed = await until(() => linesOf(taskId).find((l) => l.msg === 'image task failed; credits released'), 10_000, 'the failure line');
    expect(failed).toMatchObject({ level: 30, code: 'upstream_rejected' });
  });
});
