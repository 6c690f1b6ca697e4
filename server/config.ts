/**
 * Typed configuration from the environment, validated once at boot. Every variable is listed in
 * README.md's configuration table; keep the two in step.
 */
import { resolve } from 'node:path';
import ipaddr from 'ipaddr.js';
import { DEFAULT_ROOT_DIR } from './db/embedded-layout.ts';
import { parseSecretKey } from './lib/secret-box.ts';

export type Role = 'all' | 'api' | 'worker';

/** A client's limits as they apply: `null` is no limit. */
export interface ClientLimits {
  /** Generation requests per minute. */
  requestsPerMinute: number | null;
  /** Generations in flight at once (synchronous images, background images, unfinished videos). */
  maxInFlight: number | null;
}

export interface Config {
  port: number;
  /** Listen address: loopback by default; any other needs PUBLIC_BASE_URL (checked at load). */
  host: string;
  /** External PostgreSQL; when absent the server starts an embedded one in `dataDir/pg`. */
  databaseUrl: string | undefined;
  dataDir: string;
  /** Root only: where the embedded PostgreSQL keeps binaries and clusters the `postgres` user could not reach. */
  embeddedPgRootDir: string;
  /** 32-byte key for credentials at rest (hex or base64); generated into dataDir when absent. */
  secretKey: string | undefined;
  /** Enables the admin API when set. */
  adminToken: string | undefined;
  logLevel: string;
  validateResponses: boolean;
  /** Base URL of signed file URLs; unset: the address the server actually listens on (a worker, which serves no API, needs it: checked at load). */
  publicBaseUrl: string | undefined;
  dbPoolMax: number;
  /**
   * Group commit of the hot statements (db/statement-batcher.ts): the most credit holds or image
   * completions one statement carries (1: a statement each) and how many such statements run at once.
   */
  dbBatchMax: number;
  dbBatchInFlight: number;
  /** Hot-path statements go to PostgreSQL as named prepared statements (db/prepared.ts). */
  dbPreparedStatements: boolean;
  shutdownGraceMs: number;
  jsonBodyLimitBytes: number;
  keyCacheTtlMs: number;
  /** How long an image model's lookup (catalog, prices, switch, reachability per group) is reused. */
  modelCacheTtlMs: number;
  /** How long a group's members for a model (configuration and shared health) are reused (pool.ts). */
  poolCacheTtlMs: number;
  quoteTtlSeconds: number;
  fileUrlTtlSeconds: number;
  maxMediaInputCount: number;
  maxMediaInputBytes: number;
  /** Largest video a task stores from its upstream; a larger output fails the task. */
  maxVideoOutputBytes: number;
  imageSizeParam: 'accept' | 'reject';
  /** Seed demo data into an empty database (default: only with the embedded database). */
  demoData: boolean;
  /** Webhook and media URLs may point at private networks (on-premises receivers). */
  allowPrivateTargets: boolean;
  /** Bearer token that `/metrics` requires; unset: `/metrics` is not served. */
  metricsToken: string | undefined;
  /** A worker-only process serves /metrics, /healthz and /readyz on this port (unset: no HTTP at all). */
  metricsPort: number | undefined;
  /** Request bodies larger than this count as large (and wait for a slot). */
  largeBodyBytes: number;
  /** Bytes of large bodies read and processed at once per process (each counts its Content-Length, or the whole budget when unknown); the rest wait. */
  largeBodyBudgetBytes: number;
  /** How long a large body waits for a slot before `503 server_busy`. */
  largeBodyWaitMs: number;
  role: Role;
  /** Where the filesystem media store keeps files (shared storage when running several instances). */
  mediaDir: string;
  /** Where media live: this machine's disk (`fs`, MEDIA_DIR) or S3-compatible object storage (`s3`). */
  mediaStore: 'fs' | 's3';
  /** The bucket and how to reach it (MEDIA_STORE=s3); credentials come from the AWS chain. */
  s3: { bucket: string; region: string; endpoint: string | undefined; forcePathStyle: boolean; prefix: string } | undefined;
  /**
   * What media URLs in answers are: presigned by the store (`presigned`: S3 serves the bytes; the
   * default with S3), or Mediagate's own signed `/v1/files/…` URLs that any instance serves from
   * the store (`gateway`: the only kind with the filesystem store).
   */
  mediaUrls: 'presigned' | 'gateway';
  /** Days an output (a generated image or video) is kept, unless its account says otherwise. */
  outputRetentionDays: number;
  /** Days an input (a frame, a reference, an edited image) is kept after its task ended, unless its account says otherwise. */
  inputRetentionDays: number;
  taskLeaseMs: number;
  /** How long a synchronous image request waits for a free upstream member (all at their limit or cooling down) before 503 no_upstream_capacity. */
  imageCapacityWaitMs: number;
  taskPollMs: number;
  taskMaxLifetimeSeconds: number;
  /** Image tasks run at once per process (`0`: no task workers at all). */
  workerConcurrency: number;
  /** Poll interval of upstream video jobs (unset: each adapter's default, 10 s for OpenAI). */
  videoPollIntervalMs: number | undefined;
  /** Retries of a finished job's download (each after the upstream's Retry-After or a backoff) before its task fails and is refunded. */
  videoDownloadRetries: number;
  /**
   * Video task steps (each at most one upstream call) run at once per process, however many jobs
   * are in flight. Polls needed per second × upstream latency must fit (Little's law): 10,000 jobs
   * polled every 10 s at 100–250 ms an answer keep 100–250 calls busy.
   */
  upstreamConcurrency: number;
  /** Image edits: input files per request, bytes per file and per request body (multipart). */
  maxEditImages: number;
  maxEditFileBytes: number;
  maxEditBodyBytes: number;
  /** Extra latency of the local provider per job (demos and crash tests: simulates a slow upstream). */
  localRenderDelayMs: number;
  /** Express `trust proxy` setting: true behind one reverse proxy that sets X-Forwarded-For. */
  trustProxy: boolean;
  /** Webhook deliveries sent at once per process. */
  webhookConcurrency: number;
  /** Webhook deliveries sent at once per process to one target host (host:port): one slow receiver cannot take every slot. */
  webhookHostConcurrency: number;
  /** Webhook deliveries of one account sent at once per process, to any hosts: naming many hosts cannot take every slot. */
  webhookAccountConcurrency: number;
  /** Time limit of one webhook delivery attempt (resolve, connect, send, response). */
  webhookTimeoutMs: number;
  /** Delays between a failed webhook attempt and the next (the published schedule). */
  webhookRetryScheduleMs: number[];
  /** How long the previous webhook secret keeps signing after a rotation. */
  webhookSecretOverlapSeconds: number;
  /** A request body with no byte for this long is cut off (408 body_timeout). */
  bodyIdleTimeoutMs: number;
  /** A request body not complete within this is cut off (408 body_timeout). */
  bodyTimeoutMs: number;
  /**
   * An image answer written with backpressure (an event stream, a JSON answer carrying images)
   * whose client takes none of what is waiting for this long is cut off: the client is gone.
   */
  streamWriteIdleMs: number;
  /** STREAM_KEEPALIVE_MS: an image event stream with no frame for this long gets an SSE comment (http/image-answer.ts). */
  streamKeepAliveMs: number;
  /** Time limit of fetching one https media input. */
  mediaUrlTimeoutMs: number;
  /** Largest file of POST /v1/files. */
  uploadMaxBytes: number;
  /** Expiry of an upload when its request names none, and the longest allowed. */
  uploadDefaultExpirySeconds: number;
  uploadMaxExpirySeconds: number;
  /** The operator's limits of keys and accounts that have none of their own (DEFAULT_KEY_RPM, …). */
  defaultLimits: { key: ClientLimits; account: ClientLimits };
  /** Redis that request rates are counted in, shared by every instance; unset: each instance counts its own. */
  redisUrl: string | undefined;
  /** Prefix of every Redis key (several deployments, or test runs, on one Redis). */
  redisKeyPrefix: string;
}

/** The largest limits an operator can set (the database's checks say the same). */
export const MAX_REQUESTS_PER_MINUTE = 1_000_000;
export const MAX_IN_FLIGHT = 100_000;

/** 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h: eight attempts over about 27.5 hours. */
export const DEFAULT_WEBHOOK_RETRY_SCHEDULE_MS = [5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000];

function msList(env: Env, name: string, fallback: number[]): number[] {
  const raw = env[name]?.trim();
  if (raw === undefined || raw === '') return fallback;
  const parts = raw.split(',').map((p) => p.trim());
  if (parts.length > 20 || parts.some((p) => !/^\d+$/.test(p) || Number(p) > 7 * 86_400_000)) {
    throw new ConfigError(`${name} must be a comma-separated list of at most 20 delays in milliseconds (each at most 7 days), got '${raw}'`);
  }
  return parts.map(Number);
}

export class ConfigError extends Error {}

type Env = Record<string, string | undefined>;

function int(env: Env, name: string, fallback: number, min: number, max = Number.MAX_SAFE_INTEGER): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  if (!/^\d+$/.test(raw.trim())) throw new ConfigError(`${name} must be an integer, got '${raw}'`);
  const n = Number(raw.trim());
  if (n < min || n > max) throw new ConfigError(`${name} must be between ${min} and ${max}, got ${n}`);
  return n;
}

function bool(env: Env, name: string, fallback: boolean): boolean {
  const raw = env[name]?.trim().toLowerCase();
  if (raw === undefined || raw === '') return fallback;
  if (['1', 'true', 'yes', 'on'].includes(raw)) return true;
  if (['0', 'false', 'no', 'off'].includes(raw)) return false;
  throw new ConfigError(`${name} must be a boolean (1/0, true/false), got '${env[name]}'`);
}

function oneOf<T extends string>(env: Env, name: string, values: readonly T[], fallback: T): T {
  const raw = env[name]?.trim();
  if (raw === undefined || raw === '') return fallback;
  if (!(values as readonly string[]).includes(raw)) throw new ConfigError(`${name} must be one of ${values.join(', ')}, got '${raw}'`);
  return raw as T;
}

function nonEmpty(env: Env, name: string): string | undefined {
  const raw = env[name]?.trim();
  return raw ? raw : undefined;
}

/** An optional positive limit: unset is no limit. */
function limit(env: Env, name: string, max: number): number | null {
  return nonEmpty(env, name) === undefined ? null : int(env, name, 0, 1, max);
}

/** `localhost`, 127.0.0.0/8 and ::1: addresses only this machine can reach. */
export function isLoopbackHost(host: string): boolean {
  const bare = host.replace(/^\[(.*)\]$/, '$1');
  if (bare.toLowerCase() === 'localhost') return true;
  if (!ipaddr.isValid(bare)) return false;
  const addr = ipaddr.process(bare);
  return addr.range() === 'loopback';
}

/** Reads `--role api|worker` from argv (overrides ROLE). */
function roleFromArgs(argv: readonly string[]): string | undefined {
  const i = argv.indexOf('--role');
  if (i >= 0) {
    // A bare `--role` (its value lost in a script or a unit file) would otherwise run every role.
    if (argv[i + 1] === undefined) throw new ConfigError('--role needs a value: --role api or --role worker');
    return argv[i + 1];
  }
  return argv.find((a) => a.startsWith('--role='))?.slice('--role='.length);
}

/**
 * A token a client sends as `Authorization: Bearer <token>`: at least 16 characters, visible ASCII
 * only. A header arrives as latin1 bytes and the environment as UTF-8, so a token with `ä` could
 * never match (401 forever, with no clue why), and a browser cannot send it at all.
 */
function bearerToken(env: Env, name: string): string | undefined {
  const token = nonEmpty(env, name);
  if (token === undefined) return undefined;
  if (token.length < 16) throw new ConfigError(`${name} must be at least 16 characters`);
  if (!/^[\x21-\x7e]+$/.test(token)) throw new ConfigError(`${name} must be visible ASCII characters only (letters, digits, punctuation; no spaces): it is sent in an HTTP header`);
  return token;
}

/**
 * Whether `raw` is an http(s) URL. URL.canParse alone takes `media.example.com:8443` (scheme
 * `media.example.com:`) and `minio:9000` (scheme `minio:`), which nothing could fetch.
 */
function isHttpUrl(raw: string): boolean {
  return URL.canParse(raw) && ['http:', 'https:'].includes(new URL(raw).protocol);
}

export function loadConfig(env: Env = process.env, argv: readonly string[] = process.argv.slice(2)): Config {
  const port = int(env, 'PORT', 8080, 0, 65535);
  const adminToken = bearerToken(env, 'ADMIN_TOKEN');
  const metricsToken = bearerToken(env, 'METRICS_TOKEN');
  const role = roleFromArgs(argv) ?? env.ROLE ?? 'all';
  if (!['all', 'api', 'worker'].includes(role)) throw new ConfigError(`--role must be api or worker, got '${role}'`);
  const mediaStore = oneOf(env, 'MEDIA_STORE', ['fs', 's3'], 'fs');
  const s3Bucket = nonEmpty(env, 'S3_BUCKET');
  if (mediaStore === 's3' && !s3Bucket) throw new ConfigError('MEDIA_STORE=s3 needs S3_BUCKET (and S3_REGION; S3_ENDPOINT for servers other than AWS)');
  // S3 settings with the filesystem store (MEDIA_STORE unset or misspelt) would keep every image on
  // this machine's disk: another instance never finds those bytes, and its sweeper deletes the rows.
  const s3Set = ['S3_BUCKET', 'S3_ENDPOINT', 'S3_PREFIX', 'S3_REGION', 'S3_FORCE_PATH_STYLE'].filter((name) => nonEmpty(env, name) !== undefined);
  if (mediaStore !== 's3' && s3Set.length > 0) {
    throw new ConfigError(`${s3Set.join(', ')} ${s3Set.length === 1 ? 'is' : 'are'} set but MEDIA_STORE is '${mediaStore}': set MEDIA_STORE=s3 to keep media in the bucket, or unset ${s3Set.length === 1 ? 'it' : 'them'} to keep it in MEDIA_DIR`);
  }
  const s3Endpoint = nonEmpty(env, 'S3_ENDPOINT');
  if (s3Endpoint !== undefined && !isHttpUrl(s3Endpoint)) throw new ConfigError(`S3_ENDPOINT must be an http:// or https:// URL (e.g. http://minio:9000), got '${s3Endpoint}'`);
  const mediaUrls = oneOf(env, 'MEDIA_URLS', ['presigned', 'gateway'], mediaStore === 's3' ? 'presigned' : 'gateway');
  if (mediaUrls === 'presigned' && mediaStore !== 's3') throw new ConfigError('MEDIA_URLS=presigned needs MEDIA_STORE=s3 (the filesystem store has nothing to presign)');
  const publicBaseUrl = nonEmpty(env, 'PUBLIC_BASE_URL')?.replace(/\/+$/, '');
  if (publicBaseUrl !== undefined) {
    // Signed file URLs (and the video_url of webhooks) are this plus a path and a signed query.
    if (!isHttpUrl(publicBaseUrl) || /[?#]/.test(publicBaseUrl)) {
      throw new ConfigError(`PUBLIC_BASE_URL must be an http:// or https:// URL without a query or fragment (e.g. https://media.example.com), got '${publicBaseUrl}'`);
    }
  }
  const host = nonEmpty(env, 'HOST') ?? '127.0.0.1';
  // A worker settles videos and signs the video_url of their webhooks, but serves no /v1/files (its
  // METRICS_PORT serves only /metrics, /healthz and /readyz): it has no address of its own to build
  // them on, and a guess (localhost) would reach no receiver.
  if (role === 'worker' && publicBaseUrl === undefined) {
    throw new ConfigError(
      '--role worker needs PUBLIC_BASE_URL: workers sign the video links their webhooks carry, and a worker serves no API to link to; set it to the URL clients reach the API instances at (e.g. https://media.example.com)',
    );
  }
  // Signed media URLs are built on PUBLIC_BASE_URL, else on the listen address: on an address other
  // machines reach, that would be 0.0.0.0 or an interface clients may not see.
  if (publicBaseUrl === undefined && !isLoopbackHost(host)) {
    throw new ConfigError(
      `HOST=${host} is reachable from other machines but PUBLIC_BASE_URL is not set, so signed media URLs would point at an address clients may not reach: set PUBLIC_BASE_URL to the URL clients use (e.g. https://media.example.com), or leave HOST unset to listen on 127.0.0.1 only`,
    );
  }
  // Both are first used after the embedded PostgreSQL started or migrations ran, where a mistake
  // ended in a stack trace: checked here, it is one line before anything starts.
  const databaseUrl = nonEmpty(env, 'DATABASE_URL');
  if (databaseUrl !== undefined && !(URL.canParse(databaseUrl) && /^postgres(ql)?:$/.test(new URL(databaseUrl).protocol))) {
    // Not echoed: the value may hold a password.
    throw new ConfigError('DATABASE_URL must be a postgres:// URL, e.g. postgres://user:password@db.example.com:5432/mediagate');
  }
  const secretKey = nonEmpty(env, 'MEDIAGATE_SECRET_KEY');
  if (secretKey === undefined && databaseUrl !== undefined) {
    throw new ConfigError('MEDIAGATE_SECRET_KEY is required with DATABASE_URL: 64 hex characters (`openssl rand -hex 32`), the same on every instance');
  }
  if (secretKey !== undefined) {
    try {
      parseSecretKey(secretKey);
    } catch (err) {
      throw new ConfigError((err as Error).message);
    }
  }
  const redisUrl = nonEmpty(env, 'REDIS_URL');
  // Not echoed, as DATABASE_URL is not: the value may hold a password. Its scheme says what is wrong.
  if (redisUrl !== undefined && !/^rediss?:\/\//.test(redisUrl)) {
    const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(redisUrl)?.[1];
    throw new ConfigError(`REDIS_URL must be a redis:// or rediss:// URL (${scheme ? `it starts with ${scheme}://` : 'it has no scheme://'}; the value is not echoed)`);
  }
  return {
    port,
    host,
    databaseUrl,
    dataDir: resolve(nonEmpty(env, 'MEDIAGATE_DATA_DIR') ?? '.mediagate'),
    embeddedPgRootDir: resolve(nonEmpty(env, 'MEDIAGATE_PG_ROOT_DIR') ?? DEFAULT_ROOT_DIR),
    secretKey,
    adminToken,
    logLevel: oneOf(env, 'LOG_LEVEL', ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'], 'info'),
    validateResponses: bool(env, 'VALIDATE_RESPONSES', false),
    publicBaseUrl,
    dbPoolMax: int(env, 'DB_POOL_MAX', 10, 1, 1000),
    dbBatchMax: int(env, 'DB_BATCH_MAX', 32, 1, 1000),
    dbBatchInFlight: int(env, 'DB_BATCH_IN_FLIGHT', 1, 1, 100),
    dbPreparedStatements: bool(env, 'DB_PREPARED_STATEMENTS', true),
    shutdownGraceMs: int(env, 'SHUTDOWN_GRACE_MS', 10_000, 0, 600_000),
    jsonBodyLimitBytes: int(env, 'JSON_BODY_LIMIT_BYTES', 1024 * 1024, 1024),
    keyCacheTtlMs: int(env, 'KEY_CACHE_TTL_MS', 5_000, 0, 5_000),
    modelCacheTtlMs: int(env, 'MODEL_CACHE_TTL_MS', 2_000, 0, 5_000),
    poolCacheTtlMs: int(env, 'POOL_CACHE_TTL_MS', 1_000, 0, 5_000),
    quoteTtlSeconds: int(env, 'QUOTE_TTL_SECONDS', 900, 1, 86_400),
    fileUrlTtlSeconds: int(env, 'FILE_URL_TTL_SECONDS', 3600, 1, 7 * 86_400),
    maxMediaInputCount: int(env, 'MAX_MEDIA_INPUT_COUNT', 256, 1),
    maxMediaInputBytes: int(env, 'MAX_MEDIA_INPUT_BYTES', 536_870_912, 1),
    maxVideoOutputBytes: int(env, 'MAX_VIDEO_OUTPUT_BYTES', 1024 * 1024 * 1024, 1024),
    imageSizeParam: oneOf(env, 'IMAGE_SIZE_PARAM', ['accept', 'reject'] as const, 'accept'),
    demoData: bool(env, 'DEMO_DATA', databaseUrl === undefined),
    allowPrivateTargets: bool(env, 'ALLOW_PRIVATE_TARGETS', false),
    metricsToken,
    metricsPort: nonEmpty(env, 'METRICS_PORT') === undefined ? undefined : int(env, 'METRICS_PORT', 0, 0, 65535),
    largeBodyBytes: int(env, 'LARGE_BODY_BYTES', 8 * 1024 * 1024, 1024),
    largeBodyBudgetBytes: int(env, 'LARGE_BODY_BUDGET_BYTES', 96 * 1024 * 1024, 1024),
    largeBodyWaitMs: int(env, 'LARGE_BODY_WAIT_MS', 15_000, 0, 600_000),
    role: role as Role,
    trustProxy: bool(env, 'TRUST_PROXY', false),
    mediaDir: resolve(nonEmpty(env, 'MEDIA_DIR') ?? resolve(nonEmpty(env, 'MEDIAGATE_DATA_DIR') ?? '.mediagate', 'media')),
    mediaStore,
    s3:
      mediaStore === 's3'
        ? {
            bucket: s3Bucket!,
            region: nonEmpty(env, 'S3_REGION') ?? nonEmpty(env, 'AWS_REGION') ?? 'us-east-1',
            endpoint: s3Endpoint,
            forcePathStyle: bool(env, 'S3_FORCE_PATH_STYLE', false),
            prefix: nonEmpty(env, 'S3_PREFIX') ?? '',
          }
        : undefined,
    mediaUrls,
    outputRetentionDays: int(env, 'OUTPUT_RETENTION_DAYS', 30, 1, 36_500),
    inputRetentionDays: int(env, 'INPUT_RETENTION_DAYS', 7, 1, 36_500),
    taskLeaseMs: int(env, 'TASK_LEASE_MS', 30_000, 500, 3_600_000),
    imageCapacityWaitMs: int(env, 'IMAGE_CAPACITY_WAIT_MS', 3000, 0, 60_000),
    taskPollMs: int(env, 'TASK_POLL_MS', 500, 10, 60_000),
    taskMaxLifetimeSeconds: int(env, 'TASK_MAX_LIFETIME_SECONDS', 3600, 1, 7 * 86_400),
    workerConcurrency: int(env, 'WORKER_CONCURRENCY', 2, 0, 256),
    upstreamConcurrency: int(env, 'UPSTREAM_CONCURRENCY', 256, 1, 4096),
    videoPollIntervalMs: nonEmpty(env, 'VIDEO_POLL_INTERVAL_MS') === undefined ? undefined : int(env, 'VIDEO_POLL_INTERVAL_MS', 10_000, 100, 600_000),
    videoDownloadRetries: int(env, 'VIDEO_DOWNLOAD_RETRIES', 10, 0, 100), // as DOWNLOAD_RETRY in video-runner.ts
    localRenderDelayMs: int(env, 'LOCAL_RENDER_DELAY_MS', 0, 0, 600_000),
    maxEditImages: 16,
    maxEditFileBytes: int(env, 'EDIT_MAX_FILE_BYTES', 50 * 1024 * 1024, 1024),
    maxEditBodyBytes: int(env, 'EDIT_MAX_BODY_BYTES', 200 * 1024 * 1024, 1024),
    webhookConcurrency: int(env, 'WEBHOOK_CONCURRENCY', 16, 1, 1024),
    webhookHostConcurrency: int(env, 'WEBHOOK_HOST_CONCURRENCY', 4, 1, 1024),
    webhookAccountConcurrency: int(env, 'WEBHOOK_ACCOUNT_CONCURRENCY', 8, 1, 1024),
    webhookTimeoutMs: int(env, 'WEBHOOK_TIMEOUT_MS', 10_000, 100, 120_000),
    webhookRetryScheduleMs: msList(env, 'WEBHOOK_RETRY_SCHEDULE_MS', DEFAULT_WEBHOOK_RETRY_SCHEDULE_MS),
    webhookSecretOverlapSeconds: int(env, 'WEBHOOK_SECRET_OVERLAP_SECONDS', 86_400, 0, 30 * 86_400),
    bodyIdleTimeoutMs: int(env, 'BODY_IDLE_TIMEOUT_MS', 30_000, 100, 600_000),
    bodyTimeoutMs: int(env, 'BODY_TIMEOUT_MS', 900_000, 1000, 3_600_000),
    streamWriteIdleMs: int(env, 'STREAM_WRITE_IDLE_MS', 60_000, 100, 600_000),
    streamKeepAliveMs: int(env, 'STREAM_KEEPALIVE_MS', 15_000, 100, 300_000),
    mediaUrlTimeoutMs: int(env, 'MEDIA_URL_TIMEOUT_MS', 30_000, 100, 600_000),
    uploadMaxBytes: int(env, 'UPLOAD_MAX_BYTES', 536_870_912, 1024),
    uploadDefaultExpirySeconds: 7 * 86_400,
    uploadMaxExpirySeconds: 30 * 86_400,
    defaultLimits: {
      key: { requestsPerMinute: limit(env, 'DEFAULT_KEY_RPM', MAX_REQUESTS_PER_MINUTE), maxInFlight: limit(env, 'DEFAULT_KEY_MAX_IN_FLIGHT', MAX_IN_FLIGHT) },
      account: { requestsPerMinute: limit(env, 'DEFAULT_ACCOUNT_RPM', MAX_REQUESTS_PER_MINUTE), maxInFlight: limit(env, 'DEFAULT_ACCOUNT_MAX_IN_FLIGHT', MAX_IN_FLIGHT) },
    },
    redisUrl,
    redisKeyPrefix: nonEmpty(env, 'REDIS_KEY_PREFIX') ?? 'mediagate:',
  };
}
