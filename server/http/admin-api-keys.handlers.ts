/** Admin API: API keys. */
import type { AppContext } from '../context.ts';
import { queryInt } from './admin-accounts.handlers.ts';
import { noStore } from './auth.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function adminApiKeysHandlers(ctx: AppContext): Pick<HandlerMap, 'createApiKey' | 'listApiKeys' | 'getApiKey' | 'updateApiKey'> {
  const { apiKeys } = ctx.services.admin;
  return {
    async createApiKey(req, res) {
      // The only response that carries the full key: never cache it.
      noStore(res);
      sendJson(res, 'createApiKey', 201, await apiKeys.create(req.body));
    },
    async listApiKeys(req, res) {
      const { cursor, account_id: accountId } = req.query;
      sendJson(res, 'listApiKeys', 200, await apiKeys.list({ limit: queryInt(req.query.limit), cursor, accountId }));
    },
    async getApiKey(req, res) {
      sendJson(res, 'getApiKey', 200, await apiKeys.get(req.params.key_id));
    },
    async updateApiKey(req, res) {
      sendJson(res, 'updateApiKey', 200, await apiKeys.update(req.params.key_id, req.body));
    },
  };
}
