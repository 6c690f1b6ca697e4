/**
 * A synchronous image request whose client leaves while its task is still being created (the hold
 * statement waits on a row another transaction holds, as it may under load, or the inputs are
 * fetched by URL): the task must end `client_disconnected` with every credit released, as it does
 * when the client leaves during the generation. The signal used to be taken only once the task had
 * been created, after the connection's `close` had already been emitted, so the whole generation
 * ran and was captured for a client that received nothing. So must a JSON answer whose client
 * leaves while the images' copies are written, before the settlement (its last byte waits for the
 * commit, so it can no longer be complete): it was captured as if delivered.
 */
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { FilesystemMediaStore } from '../../server/storage/media-store.ts';
import { GatedOutputStore } from '../fakes/media-stores.ts';
import { createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { holdOf, until } from '../support/tasks.ts';

let server: TestServer;

beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

describe('a client that leaves while its synchronous image task is being created', () => {
  for (const stream of [false, true]) {
    it(`${stream ? 'a stream' : 'a JSON answer'}: the task fails client_disconnected and nothing is charged`, async () => {
      const c = await createCustomer(server.db, { balance: 10 });
      let release!: () => void;
      const released = new Promise<void>((resolve) => (release = resolve));
      // Another transaction holds the key's row before the request is sent: the request's hold
      // statement waits for it. (Sent at once, the hold could take the row first under load and
      // the lock wait seen below be the settlement's, after the answer had begun.)
      let keyLocked!: () => void;
      const lockTaken = new Promise<void>((resolve) => (keyLocked = resolve));
      const locked = server.db.transaction().execute(async (trx) => {
        await sql`select 1 from api_keys where id = ${c.apiKeyId} for update`.execute(trx);
        keyLocked();
        await released;
      });
      await lockTaken;
      try {
        const client = new AbortController();
        const request = fetch(`${server.directUrl}/v1/images/generations`, {
          method: 'POST',
          headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
          body: JSON.stringify({ prompt: 'a kite', model: 'local-image-1', n: 2, ...(stream && { stream: true }) }),
          signal: client.signal,
        }).catch((err: unknown) => err);
        // The hold statement is waiting on the lock: the request is inside the task's creation.
        await until(async () => {
          const { rows } = await sql<{ n: number }>`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and datname = current_database()`.execute(server.db);
          return rows[0]!.n > 0;
        }, 10_000, 'the hold statement to wait on the lock');
        client.abort();
        expect(await request).toBeInstanceOf(Error);
        // Let the server see the connection close before the creation goes on.
        await new Promise((r) => setTimeout(r, 300));
      } finally {
        // Also when an assertion failed: a transaction left open would hang the server's close.
        release();
        await locked;
      }
      const task = await until(async () => {
        const row = await server.db.selectFrom('imageTasks').select(['id', 'status', 'errorCode', 'delivered']).where('accountId', '=', c.accountId).executeTakeFirst();
        return row && row.status !== 'processing' && row;
      }, 15_000, 'the task to end');
      expect(task).toMatchObject({ status: 'failed', errorCode: 'client_disconnected', delivered: 0 });
      expect(await holdOf(server.db, task.id)).toEqual({ amount: 2_000_000, status: 'released', captured: 0 });
    });
  }
});

describe('a JSON client that leaves while its images are stored, before the settlement', () => {
  const root = mkdtempSync(join(tmpdir(), 'mediagate-gone-copies-'));
  const gated = new GatedOutputStore(new FilesystemMediaStore(root));
  let gatedServer: TestServer;
  beforeAll(async () => {
    gatedServer = await startTestServer({ overrides: { mediaStore: gated } });
    await seedCatalog(gatedServer.db);
  });
  afterAll(async () => {
    await gatedServer?.close();
    rmSync(root, { recursive: true, force: true });
  });

  // One image: an answer under 256 KiB, nothing of it written before the commit. Two: over it, its head already sent.
  it.each([1, 2])('n=%i: the task fails client_disconnected, nothing is charged and its copies are removed', async (n) => {
    const c = await createCustomer(gatedServer.db, { balance: 10 });
    gated.close();
    const client = new AbortController();
    const request = fetch(`${gatedServer.directUrl}/v1/images/generations`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'a kite', model: 'local-image-1', n }),
      signal: client.signal,
    }).catch((err: unknown) => err);
    // The upstream answered and the client was still there: the copies wait at the gate.
    await until(() => gated.waiting === n, 15_000, 'the copies at the gate');
    client.abort();
    const answer = await request;
    // No complete answer: none at all, or a head whose body breaks off.
    if (answer instanceof Response) await expect(answer.arrayBuffer()).rejects.toThrow();
    else expect(answer).toBeInstanceOf(Error);
    // The server saw the connection close: the request's access line, written on the response's
    // close as its signal is aborted, names the task.
    const { id: taskId } = await gatedServer.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).executeTakeFirstOrThrow();
    await until(() => gatedServer.logs.some((l) => l.includes(taskId) && /"msg":"(request|client went away)/.test(l)), 10_000, 'the close seen by the server');
    gated.open();
    const task = await until(async () => {
      const row = await gatedServer.db.selectFrom('imageTasks').select(['id', 'status', 'errorCode', 'delivered', 'resultFileIds']).where('accountId', '=', c.accountId).executeTakeFirst();
      return row && row.status !== 'processing' && row;
    }, 15_000, 'the task to end');
    expect(task).toMatchObject({ status: 'failed', errorCode: 'client_disconnected', delivered: 0 });
    expect(await holdOf(gatedServer.db, task.id)).toEqual({ amount: n * 1_000_000, status: 'released', captured: 0 });
    // No copy is left: no row, and no image file under the store's root.
    expect(await gatedServer.db.selectFrom('files').select('id').where('accountId', '=', c.accountId).execute()).toEqual([]);
    await until(() => listFiles(root).filter((f) => !f.includes('.spare')).length === 0, 5_000, 'the copies removed');
  });
});

function listFiles(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name));
}
