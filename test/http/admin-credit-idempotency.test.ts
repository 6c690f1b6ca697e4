/**
 * Operator credit adjustments under an `idempotency_key` (POST /admin/v1/accounts/{id}/credits): a
 * retry of the same adjustment answers the original entry and applies nothing again — sent twice,
 * sent ten times at once, sent after an answer lost with the commit (503 database_unavailable) — the
 * same key with another amount or reason is 409 idempotency_conflict, and an attempt that was refused
 * (or rolled back while its twin waited) keeps no key, so its retry applies.
 */
import { randomBytes } from 'node:crypto';
import { createServer as createHttpServer, type Server } from 'node:http';
import { connect, createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import createClient from 'openapi-fetch';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { paths } from '../../generated/api.d.ts';
import { createApp, httpServerOptions } from '../../server/app.ts';
import { loadConfig } from '../../server/config.ts';
import { createRuntime } from '../../server/context.ts';
import { createDatabase } from '../../server/db/database.ts';
import { createHandlers } from '../../server/http/handlers.ts';
import { createLogger } from '../../server/logger.ts';
import { createMetrics } from '../../server/metrics.ts';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';
import { createTestDatabase, type TestDatabase } from '../setup/test-database.ts';
import { createAccount } from '../support/factories.ts';
import { ADMIN_TOKEN, startTestServer, type ApiClient, type TestServer } from '../support/http-harness.ts';

type Db = TestServer['db'];

const adjust = (client: ApiClient, accountId: string, body: { amount: number; reason: string; idempotency_key?: string }) =>
  client.POST('/admin/v1/accounts/{account_id}/credits', { params: { path: { account_id: accountId } }, body });

/** The account's counters and its manual ledger entries: what a retry must leave as it was. */
async function stateOf(db: Db, accountId: string) {
  const row = await db.selectFrom('accounts').select(['balance', 'totalEarned', totalSpentOf('accounts').as('totalSpent')]).where('id', '=', accountId).executeTakeFirstOrThrow();
  const ledger = await db.selectFrom('ledgerEntries').select(['id', 'kind', 'amount', 'reason']).where('accountId', '=', accountId).where('kind', 'in', ['grant', 'debit']).orderBy('id').execute();
  return { balance: row.balance / 1e6, totalEarned: row.totalEarned / 1e6, totalSpent: row.totalSpent / 1e6, ledger: ledger.map((e) => ({ ...e, id: `led_${e.id}` })) };
}

describe('credit adjustments with an idempotency key', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer();
  });
  afterAll(async () => server?.close());

  it('the same key twice: one entry, one balance change; the retry answers the original entry and the account as it is now', async () => {
    const { id } = await createAccount(server.db, { balance: 0 });
    const body = { amount: 50, reason: 'Top-up, invoice 2026-0142', idempotency_key: 'invoice-2026-0142' };
    const first = await adjust(server.admin(), id, body);
    expect(first.response.status).toBe(200);
    expect(first.data!.account).toMatchObject({ balance: 50, total_earned: 50 });
    // Another adjustment between the two (no key): the retry shows it in the account, not in its entry.
    expect((await adjust(server.admin(), id, { amount: -5, reason: 'correction' })).response.status).toBe(200);

    const retry = await adjust(server.admin(), id, body);
    expect(retry.response.status).toBe(200);
    expect(retry.data!.entry).toEqual(first.data!.entry);
    expect([first.data!.replayed, retry.data!.replayed]).toEqual([false, true]);
    expect(retry.data!.account).toMatchObject({ balance: 45, total_earned: 50, total_spent: 5 });
    const after = await stateOf(server.db, id);
    expect(after).toEqual({
      balance: 45,
      totalEarned: 50,
      totalSpent: 5,
      ledger: [
        { id: first.data!.entry.id, kind: 'grant', amount: 50_000_000, reason: 'Top-up, invoice 2026-0142' },
        { id: expect.any(String), kind: 'debit', amount: 5_000_000, reason: 'correction' },
      ],
    });
  });

  it('a debit retried under its key is applied once', async () => {
    const { id } = await createAccount(server.db, { balance: 100 });
    const body = { amount: -30, reason: 'refund reversal', idempotency_key: 'debit-1' };
    const [a, b] = [await adjust(server.admin(), id, body), await adjust(server.admin(), id, body)];
    expect([a.response.status, b.response.status]).toEqual([200, 200]);
    expect(b.data!.entry).toEqual(a.data!.entry);
    expect(a.data!.entry).toMatchObject({ kind: 'debit', amount: -30, balance_change: -30 });
    expect(await stateOf(server.db, id)).toMatchObject({ balance: 70, totalSpent: 30 });
  });

  it('the same key with another amount or reason is 409 idempotency_conflict naming the key, and changes nothing', async () => {
    const { id } = await createAccount(server.db, { balance: 0 });
    const first = await adjust(server.admin(), id, { amount: 50, reason: 'Top-up', idempotency_key: 'k-409' });
    expect(first.response.status).toBe(200);
    const before = await stateOf(server.db, id);
    for (const body of [
      { amount: 60, reason: 'Top-up', idempotency_key: 'k-409' },
      { amount: -50, reason: 'Top-up', idempotency_key: 'k-409' },
      { amount: 50, reason: 'Top-up again', idempotency_key: 'k-409' },
    ]) {
      const { response, error } = await adjust(server.admin(), id, body);
      expect(response.status).toBe(409);
      expect(error?.error).toEqual({
        message: `This 'idempotency_key' was already used on this account for an adjustment with another amount or reason (ledger entry ${first.data!.entry.id}, 50 credits); nothing was changed. Send a new 'idempotency_key' for a new adjustment.`,
        type: 'conflict_error',
        code: 'idempotency_conflict',
        param: 'idempotency_key',
      });
    }
    expect(await stateOf(server.db, id)).toEqual(before);
  });

  it('keys are per account: the same key on another account is a new adjustment', async () => {
    const [one, two] = [await createAccount(server.db, { balance: 0 }), await createAccount(server.db, { balance: 0 })];
    const body = { amount: 7, reason: 'shared key', idempotency_key: 'same-key' };
    const a = await adjust(server.admin(), one.id, body);
    const b = await adjust(server.admin(), two.id, body);
    expect([a.response.status, b.response.status]).toEqual([200, 200]);
    expect(b.data!.entry.id).not.toBe(a.data!.entry.id);
    expect((await stateOf(server.db, one.id)).balance).toBe(7);
    expect((await stateOf(server.db, two.id)).balance).toBe(7);
  });

  it('ten requests at once with one key: applied once, every answer the same entry', async () => {
    const { id } = await createAccount(server.db, { balance: 0 });
    const body = { amount: 12.5, reason: 'console double click', idempotency_key: 'burst' };
    const results = await Promise.all(Array.from({ length: 10 }, () => adjust(server.admin(), id, body)));
    expect(results.map((r) => r.response.status)).toEqual(Array(10).fill(200));
    const entries = new Set(results.map((r) => JSON.stringify(r.data!.entry)));
    expect(entries.size).toBe(1);
    const after = await stateOf(server.db, id);
    expect(after).toEqual({ balance: 12.5, totalEarned: 12.5, totalSpent: 0, ledger: [{ id: results[0]!.data!.entry.id, kind: 'grant', amount: 12_500_000, reason: 'console double click' }] });
  });

  it('a refused attempt keeps no key: the same debit under its key applies once the balance allows it', async () => {
    const { id } = await createAccount(server.db, { balance: 10 });
    const debit = { amount: -30, reason: 'annual fee', idempotency_key: 'fee-2026' };
    const refused = await adjust(server.admin(), id, debit);
    expect(refused.response.status).toBe(402);
    expect(refused.error?.error.code).toBe('insufficient_balance');
    expect((await adjust(server.admin(), id, { amount: 50, reason: 'Top-up' })).response.status).toBe(200);

    const retried = await adjust(server.admin(), id, debit);
    expect(retried.response.status).toBe(200);
    expect(retried.data!.account).toMatchObject({ balance: 30, total_spent: 30 });
    expect((await stateOf(server.db, id)).ledger.map((e) => [e.kind, e.amount])).toEqual([
      ['grant', 10_000_000],
      ['grant', 50_000_000],
      ['debit', 30_000_000],
    ]);
  });

  it('a twin waits for the attempt that holds its key, and applies when that attempt rolls back', async () => {
    const { id } = await createAccount(server.db, { balance: 0 });
    // Another session claims the key as an adjustment does first, and has not ended.
    const other = new pg.Client({ connectionString: server.config.databaseUrl });
    await other.connect();
    try {
      await other.query('begin');
      await other.query(`insert into credit_adjustment_keys (account_id, idempotency_key, amount, reason, ledger_entry_id) values ($1, 'twin', 20000000, 'twin', nextval(pg_get_serial_sequence('ledger_entries', 'id')))`, [id]);
      const twin = adjust(server.admin(), id, { amount: 20, reason: 'twin', idempotency_key: 'twin' });
      // The twin is blocked on the key (a lock wait), not answered.
      await expect
        .poll(async () => (await other.query<{ n: number }>(`select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`)).rows[0]!.n, { timeout: 10_000 })
        .toBe(1);
      await other.query('rollback');
      const { response, data } = await twin;
      expect(response.status).toBe(200);
      expect(data!.account).toMatchObject({ balance: 20, total_earned: 20 });
    } finally {
      await other.end();
    }
    expect((await stateOf(server.db, id)).ledger.map((e) => [e.kind, e.amount])).toEqual([['grant', 20_000_000]]);
  });

  it('an unknown account is 404 account_not_found with a key too, and keeps no key', async () => {
    const { response, error } = await adjust(server.admin(), 'acct_doesNotExist', { amount: 5, reason: 'x', idempotency_key: 'k' });
    expect(response.status).toBe(404);
    expect(error?.error.code).toBe('account_not_found');
    expect(await server.db.selectFrom('creditAdjustmentKeys').selectAll().where('accountId', '=', 'acct_doesNotExist').execute()).toEqual([]);
  });

  it('a key of 1 to 255 characters: empty or longer is 400 invalid_request naming idempotency_key', async () => {
    const { id } = await createAccount(server.db, { balance: 0 });
    for (const key of ['', 'k'.repeat(256)]) {
      const { response, error } = await adjust(server.direct(ADMIN_TOKEN), id, { amount: 5, reason: 'x', idempotency_key: key });
      expect(response.status).toBe(400);
      expect(error?.error).toMatchObject({ code: 'invalid_request', param: 'idempotency_key' });
    }
    expect((await adjust(server.admin(), id, { amount: 5, reason: 'x', idempotency_key: 'k'.repeat(255) })).response.status).toBe(200);
    expect((await stateOf(server.db, id)).balance).toBe(5);
  });
});

describe('a grant whose commit answer was lost', () => {
  // A TCP proxy in front of PostgreSQL that, when armed, forwards a COMMIT and then cuts the
  // connection before its answer comes back: the grant is committed, the gateway answers 503.
  const root = fileURLToPath(new URL('../..', import.meta.url));
  let t: TestDatabase;
  let proxy: ReturnType<typeof createTcpServer>;
  let http: Server;
  let client: ApiClient;
  let armed = false;
  const sockets = new Set<Socket>();
  let close: () => Promise<void> = async () => {};

  beforeAll(async () => {
    t = await createTestDatabase();
    const target = new URL(t.url);
    proxy = createTcpServer((socket) => {
      const upstream = connect(Number(target.port || 5432), target.hostname);
      sockets.add(socket).add(upstream);
      upstream.on('data', (d) => socket.write(d));
      upstream.on('error', () => socket.destroy());
      socket.on('error', () => upstream.destroy());
      upstream.on('close', () => socket.destroy());
      socket.on('close', () => upstream.destroy());
      socket.on('data', (d: Buffer) => {
        upstream.write(d);
        if (armed && d[0] === 0x51 /* 'Q' */ && /commit/i.test(d.toString('latin1'))) {
          armed = false;
          upstream.removeAllListeners('data'); // the answer never reaches the gateway
          setTimeout(() => socket.destroy(), 300);
        }
      });
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    const proxied = new URL(t.url);
    proxied.host = `127.0.0.1:${(proxy.address() as AddressInfo).port}`;
    const db = createDatabase(proxied.toString(), { max: 4 });
    const config = loadConfig(
      { DATABASE_URL: proxied.toString(), HOST: '127.0.0.1', PORT: '0', ADMIN_TOKEN, MEDIAGATE_SECRET_KEY: randomBytes(32).toString('hex'), LOG_LEVEL: 'info', DEMO_DATA: '0', MEDIAGATE_DATA_DIR: `${root}.test-data/${randomBytes(6).toString('hex')}` },
      [],
    );
    const log = createLogger('info', new Writable({ write: (_c, _e, cb) => cb() }));
    http = createHttpServer(httpServerOptions(config));
    await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
    const base = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
    const ctx = createRuntime({ config, db, log, metrics: createMetrics({ defaultMetrics: false }), secretKey: Buffer.from(config.secretKey!, 'hex'), publicBaseUrl: base, clusterListener: false });
    http.on('request', createApp(ctx, createHandlers(ctx), { validateResponses: true }));
    client = createClient<paths>({ baseUrl: base, headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
    close = async () => {
      await ctx.services.requestRates.close();
      await db.destroy();
    };
  });

  afterAll(async () => {
    http?.closeAllConnections();
    await new Promise<void>((r) => (http ? http.close(() => r()) : r()));
    await close();
    for (const s of sockets) s.destroy();
    await new Promise<void>((r) => (proxy ? proxy.close(() => r()) : r()));
    await t?.destroy();
  });

  it('is answered 503 database_unavailable although it was applied; its retry under the same key answers the original entry and grants nothing more', async () => {
    const { id } = await createAccount(t.db, { balance: 0 });
    const body = { amount: 50, reason: 'Top-up, invoice 2026-0142', idempotency_key: 'invoice-2026-0142' };
    armed = true;
    const lost = await adjust(client, id, body);
    expect(armed).toBe(false);
    expect(lost.response.status).toBe(503);
    expect(lost.error?.error.code).toBe('database_unavailable');
    const applied = await stateOf(t.db, id);
    expect(applied).toMatchObject({ balance: 50, totalEarned: 50 });
    expect(applied.ledger).toHaveLength(1);

    // The operator (or a billing script) does what the answer says: the same request again.
    const retry = await adjust(client, id, body);
    expect(retry.response.status).toBe(200);
    expect(retry.data!.entry).toMatchObject({ id: applied.ledger[0]!.id, kind: 'grant', amount: 50, reason: 'Top-up, invoice 2026-0142' });
    expect(retry.data!.account).toMatchObject({ balance: 50, total_earned: 50 });
    expect(await stateOf(t.db, id)).toEqual(applied);
  });
});
