/** The handler map: one entry per operationId of the contract (a missing one is a compile error). */
import type { AppContext } from '../context.ts';
import { adminAccountsHandlers } from './admin-accounts.handlers.ts';
import { adminApiKeysHandlers } from './admin-api-keys.handlers.ts';
import { adminCatalogHandlers } from './admin-catalog.handlers.ts';
import { adminGroupsHandlers } from './admin-groups.handlers.ts';
import { adminSwitchesHandlers } from './admin-switches.handlers.ts';
import { creditsHandlers } from './credits.handlers.ts';
import { docsHandlers } from './docs.handlers.ts';
import { modelsHandlers } from './models.handlers.ts';
import { adminTasksHandlers } from './admin-tasks.handlers.ts';
import { adminOperationsHandlers } from './admin-operations.handlers.ts';
import { filesHandlers } from './files.handlers.ts';
import { imagesHandlers } from './images.handlers.ts';
import { operationsHandlers } from './operations.handlers.ts';
import { videosHandlers } from './videos.handlers.ts';
import { webhooksHandlers } from './webhooks.handlers.ts';
import type { HandlerMap } from './types.ts';

export function createHandlers(ctx: AppContext): HandlerMap {
  return {
    ...modelsHandlers(ctx),
    ...creditsHandlers(ctx),
    ...operationsHandlers(ctx),
    ...docsHandlers(ctx.config.publicBaseUrl, ctx.config.adminToken !== undefined),
    ...imagesHandlers(ctx),
    ...videosHandlers(ctx),
    ...filesHandlers(ctx),
    ...webhooksHandlers(ctx),
    ...adminAccountsHandlers(ctx),
    ...adminApiKeysHandlers(ctx),
    ...adminGroupsHandlers(ctx),
    ...adminCatalogHandlers(ctx),
    ...adminSwitchesHandlers(ctx),
    ...adminTasksHandlers(ctx),
    ...adminOperationsHandlers(ctx),
  };
}
