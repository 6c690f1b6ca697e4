/** Builds the admin services (shared by the admin HTTP handlers and the admin CLI). */
import type { Kysely } from 'kysely';
import type { DB } from '../../../generated/db.d.ts';
import { AccountRepository } from '../../repositories/account.repository.ts';
import { ApiKeyAdminRepository } from '../../repositories/api-key-admin.repository.ts';
import { CapabilitySwitchRepository } from '../../repositories/capability-switch.repository.ts';
import { CatalogRepository } from '../../repositories/catalog.repository.ts';
import { GroupRepository } from '../../repositories/group.repository.ts';
import type { AuthService } from '../auth.service.ts';
import { AccountAdminService } from './account-admin.service.ts';
import { ApiKeyAdminService } from './api-key-admin.service.ts';
import { CatalogAdminService } from './catalog-admin.service.ts';
import { CapabilitySwitchService } from './capability-switch.service.ts';
import { GroupAdminService } from './group-admin.service.ts';

export interface AdminServices {
  accounts: AccountAdminService;
  apiKeys: ApiKeyAdminService;
  groups: GroupAdminService;
  catalog: CatalogAdminService;
  switches: CapabilitySwitchService;
}

/**
 * `auth` only needs `invalidate()`: key and account changes must drop cached key lookups.
 * `secretKey` may be a loader, so that the CLI needs MEDIAGATE_SECRET_KEY only to store credentials.
 */
export function createAdminServices(deps: {
  db: Kysely<DB>;
  secretKey: Buffer | (() => Buffer);
  auth: Pick<AuthService, 'invalidate'>;
}): AdminServices {
  const { secretKey } = deps;
  const accounts = new AccountRepository(deps.db);
  const groups = new GroupRepository(deps.db);
  const catalog = new CatalogRepository(deps.db);
  return {
    accounts: new AccountAdminService(accounts, deps.auth),
    apiKeys: new ApiKeyAdminService(new ApiKeyAdminRepository(deps.db), accounts, groups, deps.auth),
    groups: new GroupAdminService(groups, catalog, typeof secretKey === 'function' ? secretKey : () => secretKey),
    catalog: new CatalogAdminService(catalog),
    switches: new CapabilitySwitchService(new CapabilitySwitchRepository(deps.db)),
  };
}
