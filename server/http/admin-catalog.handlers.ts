/** Admin API: the model catalog and its prices. */
import type { AppContext } from '../context.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function adminCatalogHandlers(
  ctx: AppContext,
): Pick<HandlerMap, 'listCatalogModels' | 'createCatalogModel' | 'getCatalogModel' | 'updateCatalogModel'> {
  const { catalog } = ctx.services.admin;
  return {
    async listCatalogModels(req, res) {
      sendJson(res, 'listCatalogModels', 200, await catalog.list(req.query.kind));
    },
    async createCatalogModel(req, res) {
      sendJson(res, 'createCatalogModel', 201, await catalog.create(req.body));
    },
    async getCatalogModel(req, res) {
      sendJson(res, 'getCatalogModel', 200, await catalog.get(req.params.model_id));
    },
    async updateCatalogModel(req, res) {
      sendJson(res, 'updateCatalogModel', 200, await catalog.update(req.params.model_id, req.body));
    },
  };
}
