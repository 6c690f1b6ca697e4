/**
 * The one place dependencies are built: config -> db -> repositories -> services. main.ts and the
 * tests call createContext; nothing else holds a database or configuration.
 */
import type { Kysely } from 'kysely';
import type { DB } from '../generated/db.d.ts';
import type { Config } from './config.ts';
import type { Logger } from './logger.ts';
import type { Metrics } from './metrics.ts';
import { ApiKeyRepository } from './repositories/api-key.repository.ts';
import { CreditRepository } from './repositories/credit.repository.ts';
import { FileRepository } from './repositories/file.repository.ts';
import { LedgerRepository } from './repositories/ledger.repository.ts';
import { ModelRepository } from './repositories/model.repository.ts';
import { VideoTaskRepository } from './repositories/video-task.repository.ts';
import { createAdminServices, type AdminServices } from './services/admin/index.ts';
import { AuthService } from './services/auth.service.ts';
import { CreditService } from './services/credit.service.ts';
import { FileService } from './services/file.service.ts';
import { ModelService } from './services/model.service.ts';
import { QuoteTokens } from './services/quote-token.ts';
import { deriveKey } from './services/signing.ts';
import { VideoService } from './services/video/video.service.ts';
import { FilesystemMediaStore } from './storage/media-store.ts';

export interface Services {
  auth: AuthService;
  models: ModelService;
  credits: CreditService;
  files: FileService;
  videos: VideoService;
  admin: AdminServices;
}

/** Repositories shared by services and workers. */
export interface Repositories {
  models: ModelRepository;
  ledger: LedgerRepository;
  videoTasks: VideoTaskRepository;
  files: FileRepository;
}

export interface AppContext {
  config: Config;
  db: Kysely<DB>;
  log: Logger;
  metrics: Metrics;
  secretKey: Buffer;
  repositories: Repositories;
  services: Services;
  /** Set by main.ts when this process runs workers: wakes the task engine. */
  wakeWorkers: () => void;
}

export function createRepositories(db: Kysely<DB>): Repositories {
  return { models: new ModelRepository(db), ledger: new LedgerRepository(db), videoTasks: new VideoTaskRepository(db), files: new FileRepository(db) };
}

export function createServices(
  deps: { config: Config; db: Kysely<DB>; log: Logger; secretKey: Buffer },
  repositories: Repositories,
  wake: () => void,
): Services {
  const { config, db, log, secretKey } = deps;
  const files = new FileService(repositories.files, new FilesystemMediaStore(config.mediaDir), deriveKey(secretKey, 'file-url'), config.publicBaseUrl, config.fileUrlTtlSeconds);
  const auth = new AuthService(new ApiKeyRepository(db), log, config.keyCacheTtlMs);
  return {
    auth,
    admin: createAdminServices({ db, secretKey, auth }),
    models: new ModelService(repositories.models),
    credits: new CreditService(new CreditRepository(db)),
    files,
    videos: new VideoService({
      tasks: repositories.videoTasks,
      models: repositories.models,
      ledger: repositories.ledger,
      files,
      quotes: new QuoteTokens(deriveKey(secretKey, 'quote-token'), config.quoteTtlSeconds),
      log,
      options: { maxMediaInputCount: config.maxMediaInputCount, maxMediaInputBytes: config.maxMediaInputBytes, maxLifetimeSeconds: config.taskMaxLifetimeSeconds },
      onCreated: wake,
    }),
  };
}

export function createContext(deps: { config: Config; db: Kysely<DB>; log: Logger; metrics: Metrics; secretKey: Buffer }): AppContext {
  const repositories = createRepositories(deps.db);
  const ctx: AppContext = { ...deps, repositories, services: undefined as unknown as Services, wakeWorkers: () => undefined };
  // Late-bound so that main.ts can install the engine's wake-up after the context exists.
  ctx.services = createServices(deps, repositories, () => ctx.wakeWorkers());
  return ctx;
}
