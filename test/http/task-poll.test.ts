/**
 * Task polls (GET /v1/videos/{id}, GET /v1/images/{task_id}) take a path ahead of the body parsers
 * and the validator (http/task-poll.ts), and a terminal video task is served from memory where the
 * cluster channel keeps it right (issue 34). Everything a poll promises still holds: owner-only
 * 404, no-store, a signed URL made afresh that never outlives the media's expiry, the validator's
 * 400 for what it refuses, and a change to a terminal row (an operator, retention) seen at once.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({ clusterListener: true });
  await seedCatalog(server.db);
});
afterAll(async () => {
  await server?.close();
});

async function createVideo(key: string): Promise<string> {
  const res = await fetch(`${server.directUrl}/v1/videos/generations`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'a fox', model: 'local-video-1', seconds: 4, aspectRatio: '16:9', resolution: '720p', client_request_id: `poll-${Math.random()}` }),
  });
  const body = (await res.json()) as { id: string };
  expect(res.status, JSON.stringify(body)).toBe(202);
  return body.id;
}

const poll = (key: string | undefined, path: string) => fetch(`${server.directUrl}${path}`, { headers: key ? { Authorization: `Bearer ${key}` } : {} });

/** Waits until the server has heard NOTIFY mediagate_config (its caches were dropped). */
async function untilNotified(check: () => Promise<boolean>) {
  for (let i = 0; i < 100; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error('the change was never seen');
}

describe('task polls', () => {
  it('answer the owner only, with no-store and a request id; others and strangers get what the validated route gives', async () => {
    const owner = await createCustomer(server.db, { balance: 10 });
    const other = await createCustomer(server.db, { balance: 10 });
    const id = await createVideo(owner.key);
    const res = await poll(owner.key, `/v1/videos/${id}`);
    expect(res.status).toBe(200);
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect(res.headers.get('x-request-id')).toMatch(/^req_/);
    expect(await res.json()).toMatchObject({ id, object: 'video.task' });
    const foreign = await poll(other.key, `/v1/videos/${id}`);
    expect(foreign.status).toBe(404);
    expect(((await foreign.json()) as { error: { code: string } }).error.code).toBe('task_not_found');
    const anonymous = await poll(undefined, `/v1/videos/${id}`);
    expect(anonymous.status).toBe(401);
    // What the fast path leaves to the validator: an unknown query parameter is still 400.
    const query = await poll(owner.key, `/v1/videos/${id}?foo=1`);
    expect(query.status).toBe(400);
    // An image task's poll is no-store too.
    const image = await fetch(`${server.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${owner.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'x', model: 'local-image-1', n: 1, response_format: 'url' }),
    });
    const imageId = image.headers.get('x-task-id')!;
    const imagePoll = await poll(owner.key, `/v1/images/${imageId}`);
    expect(imagePoll.status).toBe(200);
    expect(imagePoll.headers.get('cache-control')).toBe('no-store');
    expect(await imagePoll.json()).toMatchObject({ id: imageId, object: 'image.task' });
    expect((await poll(other.key, `/v1/images/${imageId}`)).status).toBe(404);
  });

  it('serve a terminal video task without a query, and see a change to its row at once', async () => {
    const owner = await createCustomer(server.db, { balance: 10 });
    const other = await createCustomer(server.db, { balance: 10 });
    const id = await createVideo(owner.key);
    await sql`update video_tasks set status = 'failed', error_code = 'upstream_error', error_message = 'The upstream failed.', completed_at = now() where id = ${id}`.execute(server.db);
    const first = (await (await poll(owner.key, `/v1/videos/${id}`)).json()) as { status: string; error?: { message: string } };
    expect(first).toMatchObject({ status: 'failed', error: { message: 'The upstream failed.' } });

    // Served from memory now: a change made without its NOTIFY (triggers off in that session) is not seen.
    await server.db.transaction().execute(async (trx) => {
      await sql`set local session_replication_role = replica`.execute(trx);
      await sql`update video_tasks set error_message = 'Changed behind the gateway.' where id = ${id}`.execute(trx);
    });
    for (let i = 0; i < 3; i++) expect(((await (await poll(owner.key, `/v1/videos/${id}`)).json()) as { error?: { message: string } }).error?.message).toBe('The upstream failed.');
    // Kept for its owner only.
    expect((await poll(other.key, `/v1/videos/${id}`)).status).toBe(404);

    // An operator (or retention) changes the terminal row: NOTIFY drops what was kept.
    await sql`update video_tasks set error_message = 'Refunded by an operator.' where id = ${id}`.execute(server.db);
    await untilNotified(async () => ((await (await poll(owner.key, `/v1/videos/${id}`)).json()) as { error?: { message: string } }).error?.message === 'Refunded by an operator.');
  });

  it("drop a kept terminal task when its owner deletes the task's video here, without waiting for the database's notification", async () => {
    const owner = await createCustomer(server.db, { balance: 10 });
    const id = await createVideo(owner.key);
    const output = await server.ctx.services.files.save({ accountId: owner.accountId, purpose: 'video_output', contentType: 'video/mp4', taskId: id }, Buffer.from('not played'));
    await sql`update video_tasks set status = 'completed', output_file_id = ${output.id}, completed_at = now() where id = ${id}`.execute(server.db);
    const done = (await (await poll(owner.key, `/v1/videos/${id}`)).json()) as { status: string; video_url?: string };
    expect(done).toMatchObject({ status: 'completed', video_url: expect.any(String) });

    // This instance's own change: no notification comes (the terminal-row trigger is off meanwhile).
    await sql`alter table video_tasks disable trigger video_tasks_terminal_notify`.execute(server.db);
    try {
      const deleted = await fetch(`${server.directUrl}/v1/files/${output.id}`, { method: 'DELETE', headers: { Authorization: `Bearer ${owner.key}` } });
      expect(deleted.status).toBe(200);
      const after = (await (await poll(owner.key, `/v1/videos/${id}`)).json()) as { status: string; video_url?: string };
      expect(after.status).toBe('completed');
      expect(after.video_url).toBeUndefined();
    } finally {
      await sql`alter table video_tasks enable trigger video_tasks_terminal_notify`.execute(server.db);
    }
  });
});
