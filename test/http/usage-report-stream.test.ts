/**
 * A usage report on a large install (a month by hour of 60 accounts: 44,640 rows, 18 MB of JSON;
 * 175 accounts' 130,200 rows behave the same and only take longer to insert) is streamed:
 * GET /admin/v1/usage reads its rows through a cursor while the client takes the answer, its JSON
 * and CSV the same as a whole answer's; a failure after the answer began cuts the connection (never
 * a short report that looks whole); a client that leaves, or stops reading for ten times
 * STREAM_WRITE_IDLE_MS, ends the statement's transaction. Its refusals are 400s naming the
 * parameter (year 0000 too, which PostgreSQL has not), and the admin CLI prints what the API
 * answers, with exit code 2 for a refused query.
 */
import { request, type IncomingMessage } from 'node:http';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { contractSchema } from '../../server/contract-schemas.ts';
import { USAGE_CSV_COLUMNS } from '../../server/services/admin/usage.service.ts';
import { TABLE_ROWS } from '../../scripts/admin/usage.ts';
import { adminCli } from '../support/admin-cli.ts';
import { ADMIN_TOKEN, startTestServer, type TestServer } from '../support/http-harness.ts';

const ACCOUNTS = 60;
const HOURS = 744;
const FROM = '2026-01-01T00:00:00Z';
const TO = '2026-02-01T00:00:00Z';
const HOURLY = `from=${FROM}&to=${TO}&granularity=hour`;
/** Eight days by hour: 11,520 rows, 12 batches of the cursor and more than the CLI's table shows. */
const DAYS = ['--from', FROM, '--to', '2026-01-09T00:00:00Z', '--granularity', 'hour'];
const DAYS_QUERY = `from=${FROM}&to=2026-01-09T00:00:00Z&granularity=hour`;

let server: TestServer;

beforeAll(async () => {
  // A client that takes nothing for 3 s (ten times this) is cut off.
  server = await startTestServer({ env: { STREAM_WRITE_IDLE_MS: '300' } });
  // One capture of 0.001 credits per account and hour, written in one statement (the entries name
  // no real hold, key or task: the report reads only their account, kind, amount and time).
  await server.db.transaction().execute(async (trx) => {
    await sql`set local session_replication_role = replica`.execute(trx);
    await sql`insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id, created_at)
      select 'acct_' || lpad(a::text, 3, '0'), 'key_x', 'hold_' || a || '_' || h, 'capture', 1000, 'img_' || a || '_' || h,
             ${FROM}::timestamptz + h * interval '1 hour' + interval '5 minutes'
      from generate_series(1, ${ACCOUNTS}) a, generate_series(0, ${HOURS - 1}) h`.execute(trx);
  });
}, 120_000);
afterAll(async () => server?.close());

/** The expected row of account `a` (1-based) in hour `h` (0-based). */
function row(a: number, h: number) {
  return {
    period_start: new Date(Date.parse(FROM) + h * 3_600_000).toISOString(),
    account_id: `acct_${String(a).padStart(3, '0')}`,
    api_key_id: null,
    model: null,
    provider: null,
    credits_spent: 0.001,
    credits_refunded: 0,
    video_tasks_queued: 0,
    video_tasks_in_progress: 0,
    video_tasks_completed: 0,
    video_tasks_failed: 0,
    image_tasks_processing: 0,
    image_tasks_needs_attention: 0,
    image_tasks_completed: 0,
    image_tasks_failed: 0,
    images_requested: 0,
    images_delivered: 0,
  };
}

/** GET /admin/v1/usage?`query` straight to the server (node:http: its pace is this test's). */
function get(query: string, accept = 'application/json'): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = request(`${server.directUrl}/admin/v1/usage?${query}`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, Accept: accept } }, resolve);
    req.on('error', reject);
    req.end();
  });
}

async function text(res: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of res) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/** The server's connections reading a report's cursor, and their state. */
async function cursorReaders(): Promise<{ pid: number; state: string }[]> {
  const { rows } = await sql<{ pid: number; state: string }>`
    select pid, state from pg_stat_activity
    where datname = current_database() and pid <> pg_backend_pid() and query like 'fetch forward % from usage_report'`.execute(server.db);
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

describe('GET /admin/v1/usage on a large install', { timeout: 60_000 }, () => {
  it('streams a month by hour of every account: every row, in order, as the contract says', async () => {
    const res = await get(HOURLY);
    expect(res.statusCode).toBe(200);
    expect([res.headers['content-type'], res.headers['cache-control'], res.headers['transfer-encoding'], res.headers['content-length']]).toEqual([
      'application/json; charset=utf-8',
      'no-store',
      'chunked',
      undefined,
    ]);
    const json = await text(res);
    const report = JSON.parse(json) as { rows: ReturnType<typeof row>[] };
    const validate = contractSchema('AdminUsageReport');
    expect(validate(report), JSON.stringify(validate.errors)).toBe(true);
    expect({ ...report, rows: report.rows.length }).toEqual({ from: '2026-01-01T00:00:00.000Z', to: '2026-02-01T00:00:00.000Z', granularity: 'hour', group_by: ['account'], rows: ACCOUNTS * HOURS });
    // Ordered by period, then account; each row its own hour's capture.
    for (const i of [0, 1, ACCOUNTS, 999, 1000, 33_333, ACCOUNTS * HOURS - 1]) expect(report.rows[i]).toEqual(row((i % ACCOUNTS) + 1, Math.floor(i / ACCOUNTS)));
    expect(json).toBe(JSON.stringify(report));
  });

  it('streams CSV: the header, then a line per row of the JSON', async () => {
    const report = JSON.parse(await text(await get(DAYS_QUERY))) as { rows: ReturnType<typeof row>[] };
    const csv = await get(DAYS_QUERY, 'text/csv');
    expect([csv.statusCode, csv.headers['content-type'], csv.headers['transfer-encoding']]).toEqual([200, 'text/csv; charset=utf-8', 'chunked']);
    const lines = (await text(csv)).split('\n');
    expect(lines).toEqual([
      USAGE_CSV_COLUMNS.join(','),
      ...report.rows.map((r) => USAGE_CSV_COLUMNS.map((c) => r[c] ?? '').join(',')),
      '',
    ]);
    expect(lines).toHaveLength(1 + ACCOUNTS * 8 * 24 + 1);
  });

  it('reads rows as the client takes them, and a failure after the answer began cuts the connection, never a short report', async () => {
    const res = await get(HOURLY);
    expect(res.statusCode).toBe(200);
    // The first bytes, then nothing taken: the report must wait for this client, its cursor open.
    const first = await new Promise<Buffer>((resolve) => res.once('data', resolve));
    res.pause();
    expect(first.toString()).toBe('{"from":"2026-01-01T00:00:00.000Z","to":"2026-02-01T00:00:00.000Z","granularity":"hour","group_by":["account"],"rows":[');
    // Waiting for this client: idle in its transaction on two looks 300 ms apart (a busy machine may
    // still be between two fetches, the socket's buffers not yet full, at the first).
    const waiting = async () => {
      const a = await cursorReaders();
      await new Promise((resolve) => setTimeout(resolve, 300));
      return JSON.stringify(a) === JSON.stringify(await cursorReaders()) ? a : [];
    };
    const readers = await until(waiting, (r) => r.length === 1 && r[0]!.state === 'idle in transaction');
    expect(readers).toEqual([{ pid: expect.any(Number), state: 'idle in transaction' }]);

    // The database goes away midway (its connection ended): the client's body ends in an error.
    await sql`select pg_terminate_backend(${readers[0]!.pid})`.execute(server.db);
    res.resume();
    await expect(text(res)).rejects.toThrow(/aborted/);
    expect(res.complete).toBe(false);
    // Logged as the database's failure (the access log's line only sees a body that did not end).
    const failed = async () => server.logs.filter((line) => line.includes('"request failed"') && line.includes('/admin/v1/usage')).map((line) => (JSON.parse(line) as { code: string }).code);
    expect(await until(failed, (codes) => codes.length > 0)).toEqual(['database_unavailable']);

    // The server answers the next report (the pool dropped the ended connection).
    const next = await get(`from=${FROM}&to=2026-01-01T01:00:00Z&granularity=hour`);
    expect([next.statusCode, (JSON.parse(await text(next)) as { rows: unknown[] }).rows.length]).toEqual([200, ACCOUNTS]);
  });

  it('a client that leaves midway ends the report: its transaction and connection are given back', async () => {
    const res = await get(HOURLY, 'text/csv');
    await new Promise((resolve) => res.once('data', resolve));
    res.pause();
    expect(await until(cursorReaders, (r) => r.length === 1)).toHaveLength(1);
    res.destroy();
    expect(await until(cursorReaders, (r) => r.length === 0)).toEqual([]);
  });

  it('a client that stops reading is cut off after ten times STREAM_WRITE_IDLE_MS, and its report ended', async () => {
    const res = await get(HOURLY);
    await new Promise((resolve) => res.once('data', resolve));
    res.pause();
    expect(await until(cursorReaders, (r) => r.length === 1)).toHaveLength(1);
    expect(await until(cursorReaders, (r) => r.length === 0)).toEqual([]);
    res.resume();
    await expect(text(res)).rejects.toThrow(/aborted/);
    expect(server.logs.filter((line) => line.includes('usage report cut off: its client stopped reading'))).toHaveLength(1);
  });

  it('reads at most a quarter of the pool of reports at once (2 of 10): the next is 503 server_busy, and the rest of the gateway is served', async () => {
    const open = [await get(HOURLY), await get(HOURLY)];
    try {
      for (const res of open) {
        expect(res.statusCode).toBe(200);
        await new Promise((resolve) => res.once('data', resolve));
        res.pause();
      }
      expect(await until(cursorReaders, (r) => r.length === 2)).toHaveLength(2);
      const refused = await get(HOURLY);
      const body = JSON.parse(await text(refused)) as { error: { code: string; message: string } };
      expect([refused.statusCode, body.error.code, refused.headers['retry-after']]).toEqual([503, 'server_busy', '5']);
      expect(body.error.message).toBe('2 usage reports are being read from this instance; retry in 5 s.');
      const accounts = await fetch(`${server.directUrl}/admin/v1/accounts`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
      expect(accounts.status).toBe(200);
      expect((await fetch(`${server.directUrl}/readyz`)).status).toBe(200);
    } finally {
      for (const res of open) res.destroy();
    }
    expect(await until(cursorReaders, (r) => r.length === 0)).toEqual([]);
    const next = await get(`from=${FROM}&to=2026-01-01T01:00:00Z&granularity=hour`);
    expect([next.statusCode, (JSON.parse(await text(next)) as { rows: unknown[] }).rows.length]).toEqual([200, ACCOUNTS]);
  });

  it('refuses to before from, a range too long, and times PostgreSQL cannot hold, with a 400 naming the parameter', async () => {
    for (const [query, param, message] of [
      [`from=${TO}&to=${FROM}`, 'to', "'to' must be after 'from'."],
      [`from=${FROM}&to=2026-03-01T00:00:00Z&granularity=hour`, 'to', "A report by hour covers at most 31 days; shorten the range between 'from' and 'to' or report by day."],
      ['from=0000-01-01T00:00:00Z&to=0000-01-02T00:00:00Z', 'from', "'from' must be from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z (UTC)."],
      ['from=0001-01-01T00:30:00%2B01:00&to=0001-01-02T00:00:00Z', 'from', "'from' must be from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z (UTC)."],
      ['from=9999-12-31T00:00:00Z&to=9999-12-31T23:00:00-05:00', 'to', "'to' must be from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z (UTC)."],
    ] as const) {
      const res = await get(query);
      expect([query, res.statusCode, JSON.parse(await text(res))]).toEqual([query, 400, { error: { message, type: 'invalid_request_error', code: 'invalid_request', param } }]);
    }
  });
});

describe('the admin CLI on the same install', { timeout: 60_000 }, () => {
  const cli = (...args: string[]) => adminCli(['usage', ...args], { DATABASE_URL: server.config.databaseUrl!, MEDIAGATE_SECRET_KEY: server.secretKey.toString('hex') });
  const api = async (query: string, accept?: string) => text(await get(query, accept));

  it('prints the whole report as --csv and --json exactly as the API answers it, and the table up to its limit', async () => {
    const csv = await cli(...DAYS, '--csv');
    expect([csv.code, csv.stderr]).toEqual([0, '']);
    expect(csv.stdout).toBe(await api(DAYS_QUERY, 'text/csv'));

    // A day by hour: 1,440 rows, two batches of the cursor.
    const day = ['--from', FROM, '--to', '2026-01-02T00:00:00Z', '--granularity', 'hour'];
    const json = await cli(...day, '--json');
    expect([json.code, json.stderr]).toEqual([0, '']);
    const report = JSON.parse(json.stdout) as object;
    expect(json.stdout).toBe(`${JSON.stringify(report, null, 2)}\n`);
    expect(JSON.stringify(report)).toBe(await api(`from=${FROM}&to=2026-01-02T00:00:00Z&granularity=hour`));

    const table = await cli(...DAYS);
    expect([table.code, table.stderr]).toEqual([0, '']);
    const lines = table.stdout.trimEnd().split('\n');
    expect(lines).toHaveLength(1 + TABLE_ROWS + 1);
    expect(lines[0]).toMatch(/^period_start +account_id +credits_spent +credits_refunded +video_tasks_queued/);
    expect(lines[1]).toMatch(/^2026-01-01T00:00:00\.000Z +acct_001 +0\.001 +0 +0 /);
    expect(lines.at(-1)).toBe(`(the table stops at ${TABLE_ROWS} rows; --csv or --json prints the whole report)`);
  });

  it('exits 2 for a query the API refuses, with its message, and prints nothing', async () => {
    for (const [args, message] of [
      [['--from', TO, '--to', FROM], "error: 'to' must be after 'from'. (invalid_request, to)\n"],
      [['--from', FROM, '--to', '2026-03-01T00:00:00Z', '--granularity', 'hour'], "error: A report by hour covers at most 31 days; shorten the range between 'from' and 'to' or report by day. (invalid_request, to)\n"],
      [['--from', '0000-01-01T00:00:00Z', '--to', '0000-01-02T00:00:00Z'], "error: 'from' must be from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z (UTC). (invalid_request, from)\n"],
    ] as const) {
      expect([args, await cli(...args)]).toEqual([args, { code: 2, stdout: '', stderr: message }]);
    }
  });
});
