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
      sendJson(res, 'createAccount', 201, await accounts.create(req.body));
    },
    async listAccounts(req, res) {
      const { cursor, status } = req.query;
      sendJson(res, 'listAccounts', 200, await accounts.list({ limit: queryInt(req.query.limit), cursor, status }));
    },
    async getAccount(req, res) {
      sendJson(res, 'getAccount', 200, await accounts.get(req.params.account_id));
    },
    async updateAccount(req, res) {
      sendJson(res, 'updateAccount', 200, await accounts.update(req.params.account_id, req.body));
    },
    async adjustAccountCredits(req, res) {
      sendJson(res, 'adjustAccountCredits', 200, await accounts.adjustCredits(req.params.account_id, req.body));
    },
  };
}
