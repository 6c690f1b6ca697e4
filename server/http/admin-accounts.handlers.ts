/** Admin API: accounts and their credits. */
import type { AppContext } from '../context.ts';
import { sendJson, type HandlerMap } from './types.ts';

/** A query integer: the validator coerces it, but Express 5 may hand back the raw string. */
export function queryInt(value: unknown): number | undefined {
  return value === undefined ? undefined : Number(value);
}

export function adminAccountsHandlers(
  ctx: AppContext,
): Pick<HandlerMap, 'createAccount' | 'listAccounts' | 'getAccount' | 'updateAccount' | 'adjustAccountCredits'> {
  const { accounts } = ctx.services.admin;
  return {
    async createAccount(req, res) {
      const account = await accounts.create(req.body);
      ctx.log.info({ accountId: account.id, initialCredits: req.body.initial_credits ?? 0 }, 'admin: account created');
      sendJson(res, 'createAccount', 201, account);
    },
    async listAccounts(req, res) {
      const { cursor, status } = req.query;
      sendJson(res, 'listAccounts', 200, await accounts.list({ limit: queryInt(req.query.limit), cursor, status }));
    },
    async getAccount(req, res) {
      sendJson(res, 'getAccount', 200, await accounts.get(req.params.account_id));
    },
    async updateAccount(req, res) {
      const account = await accounts.update(req.params.account_id, req.body);
      ctx.log.info({ accountId: account.id, changes: req.body }, 'admin: account updated');
      sendJson(res, 'updateAccount', 200, account);
    },
    async adjustAccountCredits(req, res) {
      const result = await accounts.adjustCredits(req.params.account_id, req.body);
      // Money moved by hand: always leave a trace with the amount and the reason (a replay moved nothing, and says so).
      const fields = { accountId: result.account.id, entryId: result.entry.id, amount: result.entry.amount, reason: result.entry.reason, balance: result.account.balance };
      ctx.log.info(fields, result.replayed ? 'admin: credit adjustment already applied under its idempotency key; nothing changed' : 'admin: credits adjusted');
      sendJson(res, 'adjustAccountCredits', 200, result);
    },
  };
}
