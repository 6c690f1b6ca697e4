/**
 * A key deactivated, or an account suspended, after a request was authenticated (its body can
 * stream for minutes) stops the request at the credit hold: 403 api_key_inactive or
 * account_suspended, as authentication answers, with nothing held, charged or created. The hold
 * statement guards the key's and the account's rows it already updates (and, for a free
 * generation, reads them), so every path of it is checked: a synchronous image (group commit), a
 * background image, a streamed video body, a free task, a cap on generations in flight, a batch,
 * and a change that commits while the hold waits for the row.
 */
import { randomUUID } from 'node:crypto';
import { request } from 'node:http';
import pg from 'pg';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../server/lib/ids.ts';
import { LedgerRepository, type HoldResult, type TaskInsert } from '../../server/repositories/ledger.repository.ts';
import { NO_LIMITS, type RequestLimits } from '../../server/services/limits/client-limits.ts';
import { createApiKey, createCustomer, seedCatalog } from '../support/factories.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';
import { accountState, until } from '../support/tasks.ts';

type Json = Record<string, any>;
type Customer = Awaited<ReturnType<typeof createCustomer>>;

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer();
  await seedCatalog(server.db);
});
afterAll(async () => server?.close());

/** What authentication handed the request, before the operator's change. */
const authOf = (c: Customer, limits: RequestLimits = NO_LIMITS) => ({ accountId: c.accountId, apiKeyId: c.apiKeyId, groupId: c.groupId, limits });

async function deactivateKey(keyId: string) {
  const { response } = await server.admin().PATCH('/admin/v1/api-keys/{key_id}', { params: { path: { key_id: keyId } }, body: { is_active: false } });
  expect(response.status).toBe(200);
}

async function suspendAccount(accountId: string) {
  const { response } = await server.admin().PATCH('/admin/v1/accounts/{account_id}', { params: { path: { account_id: accountId } }, body: { status: 'suspended' } });
  expect(response.status).toBe(200);
}

/** No hold, no ledger entry but the factory's grant, no task of either kind, the balance and the key's usage untouched. */
async function expectNothingHeld(c: Customer, balance: number) {
  const state = await accountState(server.db, c.accountId, c.apiKeyId);
  expect(state).toEqual({ balance: balance * 1_000_000, creditsUsed: 0, holds: [], tasks: 0 });
  const images = await server.db.selectFrom('imageTasks').select('id').where('accountId', '=', c.accountId).execute();
  expect(images).toEqual([]);
  const entries = await server.db.selectFrom('ledgerEntries').select('kind').where('accountId', '=', c.accountId).where('kind', '<>', 'grant').execute();
  expect(entries).toEqual([]);
}

describe('an image request whose key or account changed after authentication', () => {
  for (const async of [false, true]) {
    const which = async ? 'a background image' : 'a synchronous image';

    it(`${which}: a deactivated key is 403 api_key_inactive, nothing held or created`, async () => {
      const c = await createCustomer(server.db, { balance: 10 });
      const auth = authOf(c);
      const prepared = await server.ctx.services.images.prepare(auth, 'generation', { prompt: 'x', model: 'local-image-1', n: 2 });
      await deactivateKey(c.apiKeyId);
      await expect(server.ctx.services.images.start(auth, prepared, { async })).rejects.toMatchObject({ status: 403, code: 'api_key_inactive' });
      await expectNothingHeld(c, 10);
    });

    it(`${which}: a suspended account is 403 account_suspended, nothing held or created`, async () => {
      const c = await createCustomer(server.db, { balance: 10 });
      const auth = authOf(c);
      const prepared = await server.ctx.services.images.prepare(auth, 'generation', { prompt: 'x', model: 'local-image-1', n: 2 });
      await suspendAccount(c.accountId);
      await expect(server.ctx.services.images.start(auth, prepared, { async })).rejects.toMatchObject({ status: 403, code: 'account_suspended' });
      await expectNothingHeld(c, 10);
    });
  }

  it('under a cap on generations in flight (the gated statement) is refused the same way, the cap not reached', async () => {
    const capped: RequestLimits = { key: { requestsPerMinute: null, maxInFlight: 3 }, account: { requestsPerMinute: null, maxInFlight: 3 } };
    for (const [change, code] of [[deactivateKey, 'api_key_inactive'], [suspendAccount, 'account_suspended']] as const) {
      const c = await createCustomer(server.db, { balance: 10 });
      const auth = authOf(c, capped);
      const prepared = await server.ctx.services.images.prepare(auth, 'generation', { prompt: 'x', model: 'local-image-1', n: 1 });
      await change(code === 'api_key_inactive' ? c.apiKeyId : c.accountId);
      await expect(server.ctx.services.images.start(auth, prepared, { async: true })).rejects.toMatchObject({ status: 403, code });
      await expectNothingHeld(c, 10);
    }
  });

  it('an account with a key still active is refused for the account, even where the key quota would refuse too', async () => {
    const c = await createCustomer(server.db, { balance: 10, creditLimit: 1 });
    const auth = authOf(c);
    const prepared = await server.ctx.services.images.prepare(auth, 'generation', { prompt: 'x', model: 'local-image-1', n: 2 });
    await suspendAccount(c.accountId);
    await expect(server.ctx.services.images.start(auth, prepared, { async: true })).rejects.toMatchObject({ status: 403, code: 'account_suspended' });
    await expectNothingHeld(c, 10);
  });
});

describe('a video whose body is still streaming when the key is deactivated', () => {
  let image: Buffer;
  beforeAll(async () => {
    image = await sharp({ create: { width: 200, height: 150, channels: 3, background: { r: 10, g: 120, b: 200 } } }).png().toBuffer();
  });

  /** Writes the body up to past its first data URL, waits until that input is stored, runs `meanwhile`, then writes the rest. */
  function slowVideo(c: Customer, meanwhile: () => Promise<void>) {
    const dataUrl = `data:image/png;base64,${image.toString('base64')}`;
    const json = Buffer.from(
      JSON.stringify({ client_request_id: randomUUID(), prompt: 'a fox', model: 'local-video-1', seconds: 2, aspectRatio: '16:9', resolution: '360p', referenceImages: [dataUrl, dataUrl] }),
    );
    const split = json.indexOf(Buffer.from(dataUrl)) + dataUrl.length + 2; // the first data URL and its closing quote and comma
    const url = new URL(`${server.directUrl}/v1/videos/generations`);
    return new Promise<{ status: number; body: Json }>((resolve, reject) => {
      const req = request(
        { host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { Authorization: `Bearer ${c.key}`, 'Content-Type': 'application/json', 'Content-Length': json.length } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (chunk: Buffer) => chunks.push(chunk));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString()) as Json }));
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.write(json.subarray(0, split));
      // The request was authenticated and its body is being read: its first input is stored.
      until(async () => (await server.db.selectFrom('files').select('id').where('accountId', '=', c.accountId).where('purpose', '=', 'input').execute()).length > 0, 10_000, 'the first input to be stored')
        .then(meanwhile)
        .then(() => req.end(json.subarray(split)), (err: unknown) => {
          req.destroy();
          reject(err);
        });
    });
  }

  it('is 403 api_key_inactive once the body is in: no hold, no task, its inputs removed', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await slowVideo(c, () => deactivateKey(c.apiKeyId));
    expect([res.status, res.body.error?.code]).toEqual([403, 'api_key_inactive']);
    await expectNothingHeld(c, 100);
    await until(async () => (await server.db.selectFrom('files').select('id').where('accountId', '=', c.accountId).execute()).length === 0, 5000, 'stray inputs to be removed');
  });

  it('is 403 account_suspended when the account was suspended meanwhile', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await slowVideo(c, () => suspendAccount(c.accountId));
    expect([res.status, res.body.error?.code]).toEqual([403, 'account_suspended']);
    await expectNothingHeld(c, 100);
  });

  it('is created as before when nothing changed (the same slow body)', async () => {
    const c = await createCustomer(server.db, { balance: 100 });
    const res = await slowVideo(c, async () => undefined);
    expect(res.status).toBe(202);
    expect((await accountState(server.db, c.accountId, c.apiKeyId)).tasks).toBe(1);
  });
});

describe('the hold statement itself', () => {
  /** An image task row and its hold of `unitPrice` × 1 for customer `c`. */
  function imageHold(ledger: LedgerRepository, c: { accountId: string; apiKeyId: string; groupId: string }, unitPrice: number, opts: { caps?: { key: number | null; account: number | null }; async?: boolean } = {}) {
    const taskId = newId('img');
    const row = {
      id: taskId,
      accountId: c.accountId,
      apiKeyId: c.apiKeyId,
      groupId: c.groupId,
      operation: 'generation',
      model: 'm',
      prompt: 'p',
      params: JSON.stringify({ outputFormat: 'png' }),
      inputFileIds: [],
      maskFileId: null,
      n: 1,
      unitPrice,
      quotedCredits: unitPrice,
      runAsync: opts.async ?? false,
      attempt: 1,
      leaseOwner: 'me',
      memberId: null,
      memberSlots: 1,
    };
    return ledger.holdAndInsertTask(
      { holdId: newId('hold'), accountId: c.accountId, apiKeyId: c.apiKeyId, taskId, amount: unitPrice, inFlightCaps: opts.caps ?? { key: null, account: null } },
      { table: 'imageTasks', row, leaseMs: 60_000 } satisfies TaskInsert,
      undefined,
      opts.async ? 'flushed' : 'unflushed',
    );
  }

  const ledger = () => new LedgerRepository(server.db, false);

  it('refuses a free task (no reservation) for an inactive key or a suspended account, with or without a cap, and lets an active one in', async () => {
    for (const caps of [undefined, { key: 5, account: null }]) {
      const key = await createCustomer(server.db, { balance: 1 });
      await deactivateKey(key.apiKeyId);
      expect((await imageHold(ledger(), key, 0, { caps })).outcome).toBe('api_key_inactive');
      await expectNothingHeld(key, 1);
      const account = await createCustomer(server.db, { balance: 1 });
      await suspendAccount(account.accountId);
      expect((await imageHold(ledger(), account, 0, { caps })).outcome).toBe('account_suspended');
      await expectNothingHeld(account, 1);
      const active = await createCustomer(server.db, { balance: 1 });
      const ok = await imageHold(ledger(), active, 0, { caps });
      expect([ok.outcome, ok.task?.accountId]).toEqual(['ok', active.accountId]);
    }
  });

  it('in a batch (group commit) refuses only the hold of an inactive key, and only that of a suspended account, and places the others', async () => {
    for (const refused of ['api_key_inactive', 'account_suspended'] as const) {
      const batched = new LedgerRepository(server.db, { maxInFlight: 1, maxBatch: 32 });
      const c = await createCustomer(server.db, { balance: 100 });
      const revoked = await createApiKey(server.db, { accountId: c.accountId, groupId: c.groupId });
      const other = await createCustomer(server.db, { balance: 100 });
      const odd = refused === 'api_key_inactive' ? { ...c, apiKeyId: revoked.id } : other;
      if (refused === 'api_key_inactive') await deactivateKey(revoked.id);
      else await suspendAccount(other.accountId);
      const results: HoldResult<TaskInsert>[] = await Promise.all([
        ...Array.from({ length: 4 }, () => imageHold(batched, c, 1_000_000)),
        imageHold(batched, odd, 1_000_000),
        ...Array.from({ length: 4 }, () => imageHold(batched, c, 1_000_000)),
      ]);
      expect(results.map((r) => r.outcome)).toEqual(['ok', 'ok', 'ok', 'ok', refused, 'ok', 'ok', 'ok', 'ok']);
      // They went out as one batch, which the database refused whole: each then ran alone.
      expect(batched.holdBatchStats()).toEqual({ batches: 0, batched: 0, singles: 9, fallbacks: 1 });
      const account = await server.db.selectFrom('accounts').select('balance').where('id', '=', c.accountId).executeTakeFirstOrThrow();
      expect(account.balance).toBe(92_000_000);
      const used = await server.db.selectFrom('apiKeys').select('creditsUsed').where('id', '=', revoked.id).executeTakeFirstOrThrow();
      expect(used.creditsUsed).toBe(0);
      await expectNothingHeld(other, 100);
    }
  });

  describe('while the change is committing', () => {
    let admin: pg.Client;
    beforeAll(async () => {
      admin = new pg.Client({ connectionString: server.config.databaseUrl });
      await admin.connect();
    });
    afterAll(async () => admin?.end());

    /** Runs `change` in a transaction, starts the hold, waits until the hold waits for that transaction's row lock, then commits. */
    async function holdDuring(change: string, params: unknown[], hold: () => Promise<HoldResult<TaskInsert>>) {
      await admin.query('begin');
      await admin.query(change, params);
      const pid = (await admin.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid;
      const held = hold();
      await until(
        async () => (await admin.query<{ n: number }>('select count(*)::int as n from pg_stat_activity where $1 = any(pg_blocking_pids(pid))', [pid])).rows[0]!.n > 0,
        10_000,
        'the hold to wait for the change',
      );
      await admin.query('commit');
      return held;
    }

    it('a key deactivated after the statement began is still told as api_key_inactive (not as its quota)', async () => {
      const c = await createCustomer(server.db, { balance: 10 });
      const result = await holdDuring('update api_keys set is_active = false where id = $1', [c.apiKeyId], () => imageHold(ledger(), c, 1_000_000, { async: true }));
      expect(result.outcome).toBe('api_key_inactive');
      await expectNothingHeld(c, 10);
    });

    it('an account suspended after the statement began is still told as account_suspended (not as its balance)', async () => {
      const c = await createCustomer(server.db, { balance: 10 });
      const result = await holdDuring("update accounts set status = 'suspended' where id = $1", [c.accountId], () => imageHold(ledger(), c, 1_000_000, { async: true }));
      expect(result.outcome).toBe('account_suspended');
      await expectNothingHeld(c, 10);
    });
  });
});
