/**
 * The one place dependencies are built, once, in order: repositories → providers and pool →
 * settlement and task runners → services. main.ts, the scripts and the tests call createRuntime;
 * nothing else holds a database or configuration. Nothing is assigned after creation.
 *
 * Handlers see only the AppContext part (config, log, metrics, services); the task engines get the
 * runners and the notifier; tests may also reach the repositories.
 */
import { LargeBodyBudget } from './services/media/large-body-budget.ts';
import { randomBytes } from 'node:crypto';
import type { Kysely } from 'kysely';
import type { DB } from '../generated/db.d.ts';
import type { Config } from './config.ts';
import { createTransactor } from './db/transaction.ts';
import { deriveKey } from './lib/signing.ts';
import type { Logger } from './logger.ts';
import type { Metrics } from './metrics.ts';
import { MemberHealth } from './pool/member-health.ts';
import { Pool } from './pool/pool.ts';
import { createProviderRegistry, type ProviderAdapters, type ProviderKind, type ProviderRegistry } from './providers/registry.ts';
import { ApiKeyRepository } from './repositories/api-key.repository.ts';
import { CreditRepository } from './repositories/credit.repository.ts';
import { FileRepository } from './repositories/file.repository.ts';
import { HealthRepository } from './repositories/health.repository.ts';
import { ImageTaskRepository } from './repositories/image-task.repository.ts';
import { LedgerRepository } from './repositories/ledger.repository.ts';
import { ModelRepository } from './repositories/model.repository.ts';
import { MemberHealthRepository } from './repositories/member-health.repository.ts';
import { RoutingRepository } from './repositories/routing.repository.ts';
import { VideoTaskRepository } from './repositories/video-task.repository.ts';
import { WebhookRepository } from './repositories/webhook.repository.ts';
import { createAdminServices, type AdminServices } from './services/admin/index.ts';
import { AuthService } from './services/auth.service.ts';
import { RequestRateLimiter } from './services/limits/request-rate.ts';
import { CreditService } from './services/credit.service.ts';
import { FileService } from './services/file.service.ts';
import { ImageRunner } from './services/image/image-runner.ts';
import { ImageService } from './services/image/image.service.ts';
import { ModelService } from './services/model.service.ts';
import { QuoteTokens } from './services/quote-token.ts';
import { ReadinessService } from './services/readiness.service.ts';
import { Settlement } from './services/tasks/settlement.ts';
import { TaskNotifier } from './services/tasks/task-notifier.ts';
import { DOWNLOAD_RETRY, VideoRunner } from './services/video/video-runner.ts';
import { VideoService } from './services/video/video.service.ts';
import { WebhookOutbox, webhookUrlTtlSeconds } from './services/webhooks/webhook-outbox.ts';
import { WebhookRunner, type WebhookRunnerDeps } from './services/webhooks/webhook-runner.ts';
import { WebhookSecrets } from './services/webhooks/webhook-secrets.ts';
import { WebhookTester } from './services/webhooks/webhook-tester.ts';
import { MediaInputs } from './services/media/media-inputs.ts';
import { FilesystemMediaStore, type MediaStore } from './storage/media-store.ts';
import { S3MediaStore } from './storage/s3-media-store.ts';
import { MediaSweeper } from './services/media/media-sweeper.ts';
import { TaskSweeper } from './services/tasks/task-sweeper.ts';
import { TaskSweepRepository } from './repositories/task-sweep.repository.ts';
import { TaskAttemptRepository } from './repositories/task-attempt.repository.ts';
import { UsageRepository } from './repositories/usage.repository.ts';
import { registerBatchCounters, registerOperatorGauges } from './metrics.ts';
import { SweeperRepository } from './repositories/sweeper.repository.ts';

export interface Services {
  auth: AuthService;
  models: ModelService;
  credits: CreditService;
  files: FileService;
  videos: VideoService;
  images: ImageService;
  readiness: ReadinessService;
  webhookSecrets: WebhookSecrets;
  webhookTester: WebhookTester;
  admin: AdminServices;
  /** Requests per minute of keys and accounts: in Redis with REDIS_URL, else this process's memory (services/limits/). */
  requestRates: RequestRateLimiter;
  /** Request media held in memory at once (LARGE_BODY_BUDGET_BYTES): large multipart edits and JSON edits' named inputs. */
  largeBodies: LargeBodyBudget;
  /**
   * Drops this instance's cached API keys, image models and pool candidates: after an admin change
   * through this instance, and whenever the cluster listener hears of a change anywhere.
   */
  invalidateCaches(): void;
}

/** What HTTP handlers see. */
export interface AppContext {
  readonly config: Config;
  readonly log: Logger;
  readonly metrics: Metrics;
  readonly services: Services;
}

export interface Repositories {
  models: ModelRepository;
  ledger: LedgerRepository;
  videoTasks: VideoTaskRepository;
  imageTasks: ImageTaskRepository;
  routing: RoutingRepository;
  files: FileRepository;
  webhooks: WebhookRepository;
}

/** Everything a process runs on: the handlers' context plus what the task engines need. */
export interface Runtime extends AppContext {
  readonly repositories: Repositories;
  readonly providers: ProviderRegistry;
  readonly pool: Pool;
  readonly settlement: Settlement;
  readonly runners: { readonly video: VideoRunner; readonly image: ImageRunner; readonly webhook: WebhookRunner };
  readonly notifier: TaskNotifier;
  /** Where media bytes live (the filesystem or an S3-compatible bucket). */
  readonly mediaStore: MediaStore;
  /** Keeps the media store and the files table in step (expired, unlanded, orphaned media). */
  readonly mediaSweeper: MediaSweeper;
  /** Ends overdue tasks no worker claims and settles holds of ended tasks (services/tasks/task-sweeper.ts). */
  readonly taskSweeper: TaskSweeper;
}

export interface RuntimeDeps {
  config: Config;
  db: Kysely<DB>;
  log: Logger;
  metrics: Metrics;
  secretKey: Buffer;
  /** Base of signed file URLs: PUBLIC_BASE_URL, or the address the server listens on. */
  publicBaseUrl: string;
  /**
   * The process hears the cluster channel (db/cluster-listener.ts, as main.ts runs it), so caches
   * that only its NOTIFY keeps right may be used: terminal video tasks served without a query.
   */
  clusterListener?: boolean;
}

/** Replaceable parts (tests inject failing providers or stores). */
export interface RuntimeOverrides {
  mediaStore?: MediaStore;
  providers?: Partial<Record<ProviderKind, ProviderAdapters>>;
  /** Seams of every request to a client's URL (webhooks, media URL inputs): a DNS resolver, extra trusted CAs (tests' loopback servers). */
  outboundFetch?: WebhookRunnerDeps['fetchOptions'];
}

export function createRuntime(deps: RuntimeDeps, overrides: RuntimeOverrides = {}): Runtime {
  const { config, db, log, metrics, secretKey } = deps;
  const tx = createTransactor(db, log);
  const providers = createProviderRegistry({ mediaDir: config.mediaDir, localRenderDelayMs: config.localRenderDelayMs, videoPollIntervalMs: config.videoPollIntervalMs }, overrides.providers);
  // Group commit of the hot path's holds and completions (db/statement-batcher.ts); DB_BATCH_MAX=1 turns it off.
  const batching = config.dbBatchMax > 1 ? { maxBatch: config.dbBatchMax, maxInFlight: config.dbBatchInFlight } : (false as const);
  const repositories: Repositories = {
    models: new ModelRepository(db, { image: providers.kindsFor('image'), video: providers.kindsFor('video'), credentialFree: providers.credentialFreeKinds() }),
    ledger: new LedgerRepository(db, batching),
    videoTasks: new VideoTaskRepository(db),
    imageTasks: new ImageTaskRepository(db, batching),
    routing: new RoutingRepository(db),
    files: new FileRepository(db),
    webhooks: new WebhookRepository(db),
  };
  const pool = new Pool(repositories.routing, providers, tx, new MemberHealth(new MemberHealthRepository(db), metrics, log.child({ component: 'pool' })), secretKey, {
    candidateCacheMs: config.poolCacheTtlMs,
  });
  const notifier = new TaskNotifier();
  const store = overrides.mediaStore ?? (config.s3 ? new S3MediaStore(config.s3) : new FilesystemMediaStore(config.mediaDir));
  const files = new FileService(repositories.files, store, tx, deriveKey(secretKey, 'file-url'), deps.publicBaseUrl, config.fileUrlTtlSeconds, {
    urls: config.mediaUrls,
    outputRetentionDays: config.outputRetentionDays,
  });
  // Links in webhook bodies outlive the whole retry schedule (its jitter and attempts' time limits included) by a day.
  const outbox = new WebhookOutbox(files, webhookUrlTtlSeconds(config.webhookRetryScheduleMs, config.webhookTimeoutMs));
  const settlement = new Settlement({ tx, log, ledger: repositories.ledger, videoTasks: repositories.videoTasks, imageTasks: repositories.imageTasks, outbox });
  const webhookSecrets = new WebhookSecrets(repositories.webhooks, secretKey, config.webhookSecretOverlapSeconds);
  const attempts = new TaskAttemptRepository(db);
  const runners = {
    video: new VideoRunner({
      tasks: repositories.videoTasks,
      pool,
      providers,
      files,
      settlement,
      attempts,
      maxOutputBytes: config.maxVideoOutputBytes,
      downloadRetry: { ...DOWNLOAD_RETRY, maxRetries: config.videoDownloadRetries },
    }),
    image: new ImageRunner({ tasks: repositories.imageTasks, pool, providers, files, settlement, attempts }),
    webhook: new WebhookRunner({
      repo: repositories.webhooks,
      tx,
      secrets: webhookSecrets,
      metrics,
      scheduleMs: config.webhookRetryScheduleMs,
      timeoutMs: config.webhookTimeoutMs,
      hostConcurrency: config.webhookHostConcurrency,
      accountConcurrency: config.webhookAccountConcurrency,
      allowPrivate: config.allowPrivateTargets,
      fetchOptions: overrides.outboundFetch,
    }),
  };
  const media = new MediaInputs(files, { urlTimeoutMs: config.mediaUrlTimeoutMs, allowPrivate: config.allowPrivateTargets, fetch: overrides.outboundFetch });
  const auth = new AuthService(new ApiKeyRepository(db), log, config.keyCacheTtlMs, Date.now, config.defaultLimits);
  const largeBodies = new LargeBodyBudget({ largeBodyBytes: config.largeBodyBytes, budgetBytes: config.largeBodyBudgetBytes, waitMs: config.largeBodyWaitMs });
  const services: Services = {
    largeBodies,
    auth,
    // Only the API counts requests: a worker kept an idle Redis connection, and logged its outages.
    requestRates: new RequestRateLimiter({
      redisUrl: config.role === 'worker' ? undefined : config.redisUrl,
      keyPrefix: config.redisKeyPrefix,
      log: log.child({ component: 'request-rates' }),
    }),
    models: new ModelService(repositories.models),
    credits: new CreditService(new CreditRepository(db)),
    files,
    readiness: new ReadinessService(new HealthRepository(db), log),
    webhookSecrets,
    webhookTester: new WebhookTester({
      secrets: webhookSecrets,
      log,
      publicBaseUrl: deps.publicBaseUrl,
      send: { timeoutMs: config.webhookTimeoutMs, allowPrivate: config.allowPrivateTargets, fetchOptions: overrides.outboundFetch },
    }),
    admin: createAdminServices({
      db,
      log,
      secretKey,
      settlement,
      taskMaxLifetimeSeconds: config.taskMaxLifetimeSeconds,
      outputUrl: (fileId, purpose) => files.downloadUrl(fileId, purpose),
    }),
    videos: new VideoService({
      keepTerminalTasks: deps.clusterListener ? 10_000 : 0,
      tasks: repositories.videoTasks,
      models: repositories.models,
      ledger: repositories.ledger,
      files,
      media,
      quotes: new QuoteTokens(deriveKey(secretKey, 'quote-token'), config.quoteTtlSeconds),
      auth,
      log,
      notifier,
      providers,
      options: {
        maxMediaInputCount: config.maxMediaInputCount,
        maxMediaInputBytes: config.maxMediaInputBytes,
        allowPrivateTargets: config.allowPrivateTargets,
        maxLifetimeSeconds: config.taskMaxLifetimeSeconds,
        inputRetentionDays: config.inputRetentionDays,
      },
    }),
    images: new ImageService({
      tasks: repositories.imageTasks,
      models: repositories.models,
      ledger: repositories.ledger,
      files,
      media,
      runner: runners.image,
      notifier,
      auth,
      log,
      instanceId: `api_${process.pid}_${randomBytes(4).toString('hex')}`,
      options: {
        sizeParam: config.imageSizeParam,
        leaseMs: config.taskLeaseMs,
        maxEditImages: config.maxEditImages,
        capacityWaitMs: config.imageCapacityWaitMs,
        maxEditFileBytes: config.maxEditFileBytes,
        maxEditBodyBytes: config.maxEditBodyBytes,
        inputPinSeconds: config.taskMaxLifetimeSeconds + 86_400,
        inputRetentionDays: config.inputRetentionDays,
        modelCacheTtlMs: config.modelCacheTtlMs,
      },
      largeBodies,
    }),
    invalidateCaches() {
      auth.invalidate();
      services.images.invalidateCaches();
      services.videos.invalidateCaches();
      pool.invalidate();
    },
  };
  const mediaSweeper = new MediaSweeper({ files: repositories.files, sweepers: new SweeperRepository(db), store, tx, log: log.child({ component: 'media-sweeper' }) });
  const taskSweeper = new TaskSweeper({
    repo: new TaskSweepRepository(db),
    sweepers: new SweeperRepository(db),
    ledger: repositories.ledger,
    settlement,
    videoRunner: runners.video,
    imageRunner: runners.image,
    db,
    log: log.child({ component: 'task-sweeper' }),
    taskMaxLifetimeSeconds: config.taskMaxLifetimeSeconds,
  });
  const usage = new UsageRepository(db);
  registerOperatorGauges(metrics.registry, () => usage.operatorStats());
  registerBatchCounters(metrics.registry, { hold: () => repositories.ledger.holdBatchStats(), completion: () => repositories.imageTasks.completionBatchStats() });
  return Object.freeze({ config, log, metrics, services: Object.freeze(services), repositories, providers, pool, settlement, runners, notifier, mediaStore: store, mediaSweeper, taskSweeper });
}
