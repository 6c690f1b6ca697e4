/**
 * The one place dependencies are built: config -> db -> repositories -> services. main.ts and the
 * tests call createContext; nothing else holds a database or configuration.
 */
import { randomBytes } from 'node:crypto';
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
import { ImageTaskRepository } from './repositories/image-task.repository.ts';
import { RoutingRepository } from './repositories/routing.repository.ts';
import type { ImageProvider } from './providers/image-provider.ts';
import { LocalImageProvider } from './providers/local/local-image.provider.ts';
import { ImageService } from './services/image/image.service.ts';
import type { MediaStore } from './storage/media-store.ts';
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
  images: ImageService;
  admin: AdminServices;
}

/** Repositories shared by services and workers. */
export interface Repositories {
  models: ModelRepository;
  ledger: LedgerRepository;
  videoTasks: VideoTaskRepository;
  imageTasks: ImageTaskRepository;
  routing: RoutingRepository;
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
  /** Set by main.ts when this process runs workers: wakes the task engines. */
  wakeWorkers: () => void;
  /** This process's lease owner id for the synchronous image tasks its requests run. */
  instanceId: string;
}

/** Replaceable parts (tests inject failing providers or stores). */
export interface ContextOverrides {
  mediaStore?: MediaStore;
  imageProviders?: Map<string, ImageProvider>;
}

/** Providers with an adapter in this build (the others can be configured but not run yet). */
export const PROVIDERS_WITH_ADAPTERS = ['local'] as const;

export function createRepositories(db: Kysely<DB>): Repositories {
  return {
    models: new ModelRepository(db, PROVIDERS_WITH_ADAPTERS),
    ledger: new LedgerRepository(db),
    videoTasks: new VideoTaskRepository(db),
    imageTasks: new ImageTaskRepository(db),
    routing: new RoutingRepository(db),
    files: new FileRepository(db),
  };
}

export function createServices(
  deps: { config: Config; db: Kysely<DB>; log: Logger; secretKey: Buffer },
  repositories: Repositories,
  wake: () => void,
  overrides: ContextOverrides = {},
): Services {
  const { config, db, log, secretKey } = deps;
  const store = overrides.mediaStore ?? new FilesystemMediaStore(config.mediaDir);
  const files = new FileService(repositories.files, store, deriveKey(secretKey, 'file-url'), config.publicBaseUrl ?? `http://localhost:${config.port}`, config.fileUrlTtlSeconds);
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
    images: new ImageService({
      tasks: repositories.imageTasks,
      models: repositories.models,
      routing: repositories.routing,
      ledger: repositories.ledger,
      files,
      providers: overrides.imageProviders ?? new Map<string, ImageProvider>([['local', new LocalImageProvider()]]),
      db,
      log,
      options: { sizeParam: config.imageSizeParam, leaseMs: config.taskLeaseMs, maxEditImages: config.maxEditImages },
    }),
  };
}

export function createContext(
  deps: { config: Config; db: Kysely<DB>; log: Logger; metrics: Metrics; secretKey: Buffer },
  overrides: ContextOverrides = {},
): AppContext {
  const repositories = createRepositories(deps.db);
  const ctx: AppContext = {
    ...deps,
    repositories,
    services: undefined as unknown as Services,
    wakeWorkers: () => undefined,
    instanceId: `api_${process.pid}_${randomBytes(4).toString('hex')}`,
  };
  // Late-bound so that main.ts can install the engines' wake-up after the context exists.
  ctx.services = createServices(deps, repositories, () => ctx.wakeWorkers(), overrides);
  return ctx;
}
