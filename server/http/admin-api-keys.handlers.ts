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
      const created = await apiKeys.create(req.body);
      ctx.log.info({ apiKeyId: created.id, accountId: created.account_id, groupId: created.group_id, creditLimit: created.credit_limit }, 'admin: api key created');
      sendJson(res, 'createApiKey', 201, created);
    },
    async listApiKeys(req, res) {
      const { cursor, account_id: accountId } = req.query;
      sendJson(res, 'listApiKeys', 200, await apiKeys.list({ limit: queryInt(req.query.limit), cursor, accountId }));
    },
    async getApiKey(req, res) {
      sendJson(res, 'getApiKey', 200, await apiKeys.get(req.params.key_id));
    },
    async updateApiKey(req, res) {
      const key = await apiKeys.update(req.params.key_id, req.body);
      ctx.log.info({ apiKeyId: key.id, changes: req.body }, 'admin: api key updated');
      sendJson(res, 'updateApiKey', 200, key);
    },
  };
}
