/** Builds the admin services (shared by the admin HTTP handlers and the admin CLI). */
import type { Kysely } from 'kysely';
import type { DB } from '../../../generated/db.d.ts';
import { AccountRepository } from '../../repositories/account.repository.ts';
import { ApiKeyAdminRepository } from '../../repositories/api-key-admin.repository.ts';
import { CapabilitySwitchRepository } from '../../repositories/capability-switch.repository.ts';
import { CatalogRepository } from '../../repositories/catalog.repository.ts';
import { GroupRepository } from '../../repositories/group.repository.ts';
import { createTransactor } from '../../db/transaction.ts';
import type { Logger } from '../../logger.ts';
import { ImageTaskRepository } from '../../repositories/image-task.repository.ts';
import { OperatorListsRepository } from '../../repositories/operator-lists.repository.ts';
import { TaskAttemptRepository } from '../../repositories/task-attempt.repository.ts';
import { UsageRepository } from '../../repositories/usage.repository.ts';
import { VideoTaskRepository } from '../../repositories/video-task.repository.ts';
import { WebhookRepository } from '../../repositories/webhook.repository.ts';
import type { Settlement } from '../tasks/settlement.ts';
import { FileRepository } from '../../repositories/file.repository.ts';
import { TaskAdminService, type OutputUrl } from './task-admin.service.ts';
import { AccountAdminService } from './account-admin.service.ts';
import { ApiKeyAdminService } from './api-key-admin.service.ts';
import { CatalogAdminService } from './catalog-admin.service.ts';
import { CapabilitySwitchService } from './capability-switch.service.ts';
import { GroupAdminService } from './group-admin.service.ts';
import { WebhookAdminService } from './webhook-admin.service.ts';
import { LedgerAdminService } from './ledger-admin.service.ts';
import { UsageService } from './usage.service.ts';

export interface AdminServices {
  accounts: AccountAdminService;
  apiKeys: ApiKeyAdminService;
  groups: GroupAdminService;
  catalog: CatalogAdminService;
  switches: CapabilitySwitchService;
  tasks: TaskAdminService;
  webhooks: WebhookAdminService;
  ledger: LedgerAdminService;
  usage: UsageService;
}

/**
 * `secretKey` may be a loader, so that the CLI needs MEDIAGATE_SECRET_KEY only to store credentials.
 * `settlement` is the runtime's (the one place tasks are settled); the CLI has none and cannot
 * settle tasks.
 */
export function createAdminServices(deps: {
  db: Kysely<DB>;
  log: Logger;
  secretKey: Buffer | (() => Buffer);
  settlement?: Settlement;
  /** TASK_MAX_LIFETIME_SECONDS (default 3600): an image task's deadline in its detail. */
  taskMaxLifetimeSeconds?: number;
  /** Signs the download URLs of a task's outputs (the runtime's FileService; the CLI signs its own). */
  outputUrl?: OutputUrl;
}): AdminServices {
  const { db, log, secretKey } = deps;
  const tx = createTransactor(db, log);
  const accounts = new AccountRepository(db);
  const groups = new GroupRepository(db);
  const catalog = new CatalogRepository(db);
  const videoTasks = new VideoTaskRepository(db);
  const imageTasks = new ImageTaskRepository(db);
  const lists = new OperatorListsRepository(db);
  const webhooks = new WebhookAdminService({ webhooks: new WebhookRepository(db), videoTasks, lists, tx });
  return {
    accounts: new AccountAdminService(accounts, tx),
    apiKeys: new ApiKeyAdminService(new ApiKeyAdminRepository(deps.db), accounts, groups),
    groups: new GroupAdminService(groups, catalog, typeof secretKey === 'function' ? secretKey : () => secretKey),
    catalog: new CatalogAdminService(catalog, tx),
    switches: new CapabilitySwitchService(new CapabilitySwitchRepository(deps.db)),
    tasks: new TaskAdminService({
      imageTasks,
      videoTasks,
      lists,
      attempts: new TaskAttemptRepository(db),
      webhooks,
      settlement: deps.settlement,
      files: new FileRepository(db),
      outputUrl: deps.outputUrl,
      taskMaxLifetimeSeconds: deps.taskMaxLifetimeSeconds ?? 3600,
    }),
    webhooks,
    ledger: new LedgerAdminService(lists),
    usage: new UsageService(new UsageRepository(db)),
  };
}
