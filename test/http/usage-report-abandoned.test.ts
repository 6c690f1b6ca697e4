/**
 * A usage report whose client leaves before the answer began. Its first batch waits for the whole
 * statement (its grouping and order need every fact first), which on a large install takes seconds;
 * meanwhile the report holds one of the instance's report slots (a quarter of DB_POOL_MAX) and a
 * connection. A client gone has the statement cancelled in PostgreSQL, its transaction ended and
 * its slot given back at once, not when the statement would have ended.
 *
 * The statement is made slow the way this test controls: another connection holds an ACCESS
 * EXCLUSIVE lock on ledger_entries, which every report reads, so the report's backend waits in its
 * statement (the cursor's DECLARE, the lock being taken as the query is planned) until the lock is
 * released or the statement is cancelled — the same backend and request path as a first FETCH that
 * runs for long.
 */
import { request, type ClientRequest, type IncomingMessage } from 'node:http';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

const QUERY = 'from=2026-01-01T00:00:00Z&to=2026-01-08T00:00:00Z&granularity=day&group_by=provider';

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => server?.close());

/** GET /admin/v1/usage straight to the server; the request, to destroy, and its answer. */
function get(): { req: ClientRequest; answer: Promise<IncomingMessage> } {
  const req = request(`${server.directUrl}/admin/v1/usage?${QUERY}`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
  const answer = new Promise<IncomingMessage>((resolve, reject) => {
    req.on('response', resolve);
    req.on('error', reject);
  });
  req.end();
  return { req, answer };
}

async function text(res: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of res) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

interface Backend {
  pid: number;
  state: string;
  waitEventType: string | null;
}

/** The backends running a report's statement (its cursor's DECLARE or a FETCH from it). */
async function reportStatements(): Promise<Backend[]> {
  const { rows } = await sql<Backend>`
    select pid, state, wait_event_type from pg_stat_activity
    where datname = current_database() and pid <> pg_backend_pid() and state = 'active'
      and (query like 'declare usage_report %' or query like 'fetch forward % from usage_report')
    order by pid`.execute(server.db);
  return rows;
}

/**
 * What the backends `pids` do now, but the one asking (back in the pool, a report's connection may
 * serve this very query) and any the pool closed meanwhile.
 */
async function backends(pids: number[]): Promise<{ pid: number; state: string; query: string }[]> {
  const { rows } = await sql<{ pid: number; state: string; query: string }>`
    select pid, state, query from pg_stat_activity where pid = any(${pids}::int[]) and pid <> pg_backend_pid() order by pid`.execute(server.db);
  return rows;
}

async function until<T>(what: () => Promise<T>, done: (value: T) => boolean, ms = 10_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const value = await what();
    if (done(value) || Date.now() > end) return value;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe('GET /admin/v1/usage whose client leaves before the answer began', { timeout: 60_000 }, () => {
  it('cancels the statement in PostgreSQL, ends its transaction and frees its slot for the next report', async () => {
    const slots = Math.max(1, Math.floor(server.config.dbPoolMax / 4));
    const locker = new pg.Client({ connectionString: server.config.databaseUrl! });
    await locker.connect();
    let locked = true;
    try {
      await locker.query('begin');
      await locker.query('lock table ledger_entries in access exclusive mode');

      // Every report slot of the instance taken by a report whose statement waits.
      const abandoned = Array.from({ length: slots }, () => get());
      for (const a of abandoned) a.answer.catch(() => undefined);
      // Until each waits on the lock (a statement just sent shows active before it reaches the lock).
      const waiting = await until(reportStatements, (r) => r.length === slots && r.every((b) => b.waitEventType === 'Lock'));
      expect(waiting).toEqual(Array.from({ length: slots }, () => ({ pid: expect.any(Number), state: 'active', waitEventType: 'Lock' })));
      const pids = waiting.map((b) => b.pid);

      // Their clients leave (a closed tab) while the lock is still held.
      for (const a of abandoned) a.req.destroy();
      expect(await until(reportStatements, (r) => r.length === 0)).toEqual([]);
      // Each backend's transaction ended too: idle in the pool (or closed), not idle in transaction.
      const after = await until(
        () => backends(pids),
        (rows) => rows.every((b) => b.state === 'idle'),
      );
      expect(after.filter((b) => b.state !== 'idle')).toEqual([]);
      const ended = server.logs.filter((line) => line.includes('usage report ended: its client went away'));
      expect(ended).toHaveLength(slots);
      expect(server.logs.filter((line) => line.includes('"request failed"') && line.includes('/admin/v1/usage'))).toEqual([]);

      // The slots are free: the next report is taken (its statement waits for the lock in turn), not
      // refused 503 server_busy; it answers once the lock is released.
      const next = get();
      let answered: IncomingMessage | undefined;
      void next.answer.then((res) => (answered = res));
      await until(reportStatements, (r) => r.length === 1 || answered !== undefined);
      await locker.query('rollback');
      locked = false;
      const res = await next.answer;
      const body = await text(res);
      expect([res.statusCode, body]).toEqual([200, JSON.stringify({ from: '2026-01-01T00:00:00.000Z', to: '2026-01-08T00:00:00.000Z', granularity: 'day', group_by: ['provider'], rows: [] })]);
    } finally {
      if (locked) await locker.query('rollback').catch(() => undefined);
      await locker.end();
    }
  });
});
