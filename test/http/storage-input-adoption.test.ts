/**
 * A client that goes away after sending its whole body, while its task is still being created,
 * must not take the staged inputs away from the hold that is about to adopt them: the request ends
 * with a task whose inputs are there (it runs, and a retry under the same client_request_id gets
 * it), and nothing unadopted is left behind once the request has been answered.
 *
 * The client leaves once the hold is reached (a gate on `holdAndInsertTask`), and the hold waits
 * until the server has seen it leave and any removal of staged inputs started then has finished:
 * the order a slow inspection of a large input gives, made certain.
 */
import { randomUUID } from 'node:crypto';
import { connect } from 'node:net';
import sharp from 'sharp';
import { afterAll, beforeAll, expect, it, vi } from 'vitest';
import { InputStaging } from '../../server/services/media/input-staging.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { until, waitImageTask, waitVideoFinished } from '../support/tasks.ts';

let server: TestServer;
let png: string;
/** Called when a hold is about to be placed. */
let holdReached: (() => void) | undefined;
const discards = vi.spyOn(InputStaging.prototype, 'discardUnadopted');

beforeAll(async () => {
  server = await startTestServer({ workers: true });
  await seedCatalog(server.db);
  png = `data:image/png;base64,${(await sharp({ create: { width: 320, height: 180, channels: 4, background: { r: 10, g: 200, b: 90, alpha: 0.5 } } }).png().toBuffer()).toString('base64')}`;
  const ledger = server.ctx.repositories.ledger;
  const hold = ledger.holdAndInsertTask.bind(ledger);
  ledger.holdAndInsertTask = (async (...args: Parameters<typeof hold>) => {
    holdReached?.();
    // The client is gone (the access log wrote its line at the response's close), and what its
    // close started has finished.
    await until(() => server.logs.some((line) => line.includes('client went away before the response ended')), 10_000, 'the server to see the client leave');
    await Promise.allSettled(discards.mock.results.map((r) => r.value as Promise<number>));
    return hold(...args);
  }) as typeof ledger.holdAndInsertTask;
});
afterAll(async () => {
  discards.mockRestore();
  await server?.close();
});

/** POSTs `body` whole, and closes the connection once its hold is about to be placed, before any answer. */
async function sendAndLeave(key: string, path: string, body: string, headers: Record<string, string> = {}): Promise<void> {
  const url = new URL(server.directUrl);
  const extra = Object.entries(headers).map(([name, value]) => `${name}: ${value}\r\n`).join('');
  const reached = new Promise<void>((resolve) => (holdReached = resolve));
  const socket = connect(Number(url.port), url.hostname, () => {
    socket.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\n${extra}Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  });
  await reached;
  holdReached = undefined;
  socket.destroy();
}

/** Input files of the account that no task adopted. */
const strayInputs = (accountId: string) => server.db.selectFrom('files').select('id').where('accountId', '=', accountId).where('purpose', '=', 'input').where('taskId', 'is', null).execute();

it('a video whose client left while it was created keeps its inputs: it runs, and a retry gets it', async () => {
  server.logs.length = 0;
  const c = await createCustomer(server.db);
  const crid = randomUUID();
  const body = JSON.stringify({ client_request_id: crid, prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', firstFrame: png });
  const before = discards.mock.calls.length;
  await sendAndLeave(c.key, '/v1/videos/generations', body);
  const task = await until(() => server.db.selectFrom('videoTasks').select(['id', 'inputFileIds']).where('clientRequestId', '=', crid).executeTakeFirst(), 10_000, 'the task');
  expect(task.inputFileIds).toHaveLength(1);
  expect(await server.db.selectFrom('files').select('id').where('id', 'in', task.inputFileIds).execute()).toHaveLength(1);
  // The request is over (its answer ended, to nobody): nothing unadopted is left.
  await until(() => discards.mock.calls.length > before, 10_000, 'the staged inputs to be cleaned up');
  await Promise.allSettled(discards.mock.results.map((r) => r.value as Promise<number>));
  expect(await strayInputs(c.accountId)).toEqual([]);

  const retry = await fetch(`${server.directUrl}/v1/videos/generations`, { method: 'POST', headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' }, body });
  expect(retry.status).toBe(202);
  expect(((await retry.json()) as { id: string }).id).toBe(task.id);
  const { task: done } = await waitVideoFinished(server, c.key, task.id);
  expect(done.status).toBe('completed');
});

it('a respond-async JSON edit whose client left while it was created keeps its inputs and runs', async () => {
  server.logs.length = 0;
  const c = await createCustomer(server.db);
  const body = JSON.stringify({ model: 'local-image-1', prompt: 'x', images: [png] });
  await sendAndLeave(c.key, '/v1/images/edits', body, { Prefer: 'respond-async' });
  const task = await until(() => server.db.selectFrom('imageTasks').select(['id', 'inputFileIds']).where('accountId', '=', c.accountId).executeTakeFirst(), 10_000, 'the task');
  expect(await server.db.selectFrom('files').select('id').where('id', 'in', task.inputFileIds).execute()).toHaveLength(1);
  const done = await waitImageTask(server.db, task.id, (row) => row.status === 'completed' || row.status === 'failed');
  expect(done.status).toBe('completed');
  // Its one staged input is the task's: nothing is left unadopted.
  expect(await strayInputs(c.accountId)).toEqual([]);
});
