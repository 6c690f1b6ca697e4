/**
 * An account holds at most Number.MAX_SAFE_INTEGER micro-credits (about 9 billion credits), the
 * most an int8 read back as a number holds exactly: a grant that would take the balance or the
 * total earned past it is 400 invalid_request naming `amount` and changes nothing (it was a 500
 * from reading the row back), a grant up to it passes, and concurrent grants cannot pass it together.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { totalSpentOf } from '../../server/repositories/account.repository.ts';
import { startTestServer, type TestServer } from '../support/http-harness.ts';

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => server?.close());

const MAX = Number.MAX_SAFE_INTEGER; // micro-credits
let seq = 0;

async function bigAccount(initialCredits: number) {
  const { data, response } = await server.admin().POST('/admin/v1/accounts', { body: { name: `big-${Date.now()}-${++seq}`, initial_credits: initialCredits } });
  expect(response.status).toBe(201);
  return data!;
}

const grant = (accountId: string, amount: number) =>
  server.admin().POST('/admin/v1/accounts/{account_id}/credits', { params: { path: { account_id: accountId } }, body: { amount, reason: 'top-up' } });

/** The account's row and its ledger: what a refused grant must leave as it was. */
const stateOf = async (accountId: string) => ({
  row: await server.db.selectFrom('accounts').select(['balance', 'totalEarned', totalSpentOf('accounts').as('totalSpent'), 'updatedAt']).where('id', '=', accountId).executeTakeFirstOrThrow(),
  ledger: await server.db.selectFrom('ledgerEntries').select(['kind', 'amount']).where('accountId', '=', accountId).orderBy('id').execute(),
});

const refusal = {
  message: "The grant would take the account's balance or total earned past 9007199254.740991 credits, the most an account can hold; nothing was changed.",
  type: 'invalid_request_error',
  code: 'invalid_request',
  param: 'amount',
};

describe('a grant past what an account can hold', () => {
  it('is 400 invalid_request naming amount when the balance would pass it, and changes nothing', async () => {
    const account = await bigAccount(9_000_000_000);
    const before = await stateOf(account.id);
    const { response, error } = await grant(account.id, 8_000_000);
    expect(response.status).toBe(400);
    expect(error?.error).toEqual(refusal);
    expect(await stateOf(account.id)).toEqual(before);
  });

  it('is refused when only the total earned would pass it (the balance was debited)', async () => {
    const account = await bigAccount(9_000_000_000);
    expect((await grant(account.id, -8_000_000)).response.status).toBe(200);
    const before = await stateOf(account.id);
    expect(before.row).toMatchObject({ balance: 8_992_000_000_000_000, totalEarned: 9_000_000_000_000_000 });
    const { response, error } = await grant(account.id, 8_000_000);
    expect(response.status).toBe(400);
    expect(error?.error).toEqual(refusal);
    expect(await stateOf(account.id)).toEqual(before);
  });

  it('passes up to exactly the limit, and refuses one micro-credit more', async () => {
    const account = await bigAccount(9_000_000_000);
    const { response } = await grant(account.id, 7_199_254.740991);
    expect(response.status).toBe(200);
    expect((await stateOf(account.id)).row).toMatchObject({ balance: MAX, totalEarned: MAX });
    const more = await grant(account.id, 0.000001);
    expect(more.response.status).toBe(400);
    expect(more.error?.error).toEqual(refusal);
    expect((await server.admin().GET('/admin/v1/accounts/{account_id}', { params: { path: { account_id: account.id } } })).response.status).toBe(200);
  });

  it('concurrent grants that fit one at a time but not together: exactly one passes', async () => {
    const account = await bigAccount(9_000_000_000);
    const results = await Promise.all(Array.from({ length: 6 }, () => grant(account.id, 4_000_000)));
    expect(results.map((r) => r.response.status).sort()).toEqual([200, 400, 400, 400, 400, 400]);
    const after = await stateOf(account.id);
    expect(after.row).toMatchObject({ balance: 9_004_000_000_000_000, totalEarned: 9_004_000_000_000_000 });
    expect(after.ledger.map((e) => e.amount)).toEqual([9_000_000_000_000_000, 4_000_000_000_000]);
  });

  it('an amount too large to be a number of micro-credits at all names the field', async () => {
    const account = await bigAccount(1);
    const { response, error } = await grant(account.id, 1e10);
    expect(response.status).toBe(400);
    expect(error?.error).toMatchObject({ code: 'invalid_request', param: 'amount', message: "'amount' is too large: at most 9007199254.740991 credits." });
    const created = await server.admin().POST('/admin/v1/accounts', { body: { name: `huge-${Date.now()}`, initial_credits: 1e10 } });
    expect(created.response.status).toBe(400);
    expect(created.error?.error).toMatchObject({ code: 'invalid_request', param: 'initial_credits', message: "'initial_credits' is too large: at most 9007199254.740991 credits." });
  });

  it('an unknown account is still 404 account_not_found', async () => {
    const { response, error } = await grant('acct_nope', 8_000_000);
    expect(response.status).toBe(404);
    expect(error?.error.code).toBe('account_not_found');
  });
});
