/** The handler map: one entry per operationId of the contract (a missing one is a compile error). */
import type { AppContext } from '../context.ts';
import { ApiError } from '../errors.ts';
import { adminAccountsHandlers } from './admin-accounts.handlers.ts';
import { adminApiKeysHandlers } from './admin-api-keys.handlers.ts';
import { adminCatalogHandlers } from './admin-catalog.handlers.ts';
import { adminGroupsHandlers } from './admin-groups.handlers.ts';
import { adminSwitchesHandlers } from './admin-switches.handlers.ts';
import { creditsHandlers } from './credits.handlers.ts';
import { modelsHandlers } from './models.handlers.ts';
import { filesHandlers } from './files.handlers.ts';
import { operationsHandlers } from './operations.handlers.ts';
import { videosHandlers } from './videos.handlers.ts';
import type { HandlerMap, OperationHandler, OperationId } from './types.ts';

/** Operations whose issue has not landed yet; listed in README.md under "Not yet available". */
export function notImplemented<K extends OperationId>(): OperationHandler<K> {
  return () => {
    throw new ApiError(501, 'not_implemented', 'This operation is not implemented yet.');
  };
}

export function createHandlers(ctx: AppContext): HandlerMap {
  return {
    ...modelsHandlers(ctx),
    ...creditsHandlers(ctx),
    ...operationsHandlers(ctx),
    createImage: notImplemented(),
    editImage: notImplemented(),
    getImageTask: notImplemented(),
    ...videosHandlers(ctx),
    ...filesHandlers(ctx),
    ...adminAccountsHandlers(ctx),
    ...adminApiKeysHandlers(ctx),
    ...adminGroupsHandlers(ctx),
    ...adminCatalogHandlers(ctx),
    ...adminSwitchesHandlers(ctx),
    getTask: notImplemented(),
    settleImageTask: notImplemented(),
  };
}
