/**
 * createApp(ctx): the Express app built from the bundled contract. Order of the pipeline:
 * request id -> access log + metrics (on finish) -> admin/metrics gates -> credentials (before any
 * body is read) -> requests per minute of generations, uploads and webhook tests (http/request-rate.ts,
 * before any body too)
 * -> streamed media bodies and uploads -> multipart edits (under a large-body byte
 * budget) -> JSON parser -> NUL guard -> valid JSON image generations to their handler
 * (http/generation-fast-path.ts) -> openapi validator (route match, HEAD as GET where the contract
 * has no HEAD, security, request validation, response validation) -> handlers mounted from the spec -> one
 * error middleware for everything.
 */
import { timingSafeEqual, createHash } from 'node:crypto';
import type { ServerOptions } from 'node:http';
import type { Config } from './config.ts';
import { randomHex } from './lib/ids.ts';
import express, { type NextFunction, type Request, type Response } from 'express';
import { useContractValidator } from './http/contract-validator.ts';
import type { AppContext } from './context.ts';
import { ApiError } from './errors.ts';
import { accessLog, operationMatcher } from './http/access-log.ts';
import { taskPollFastPath } from './http/task-poll.ts';
import { IMAGE_GENERATION_PATH, imageGenerationFastPath } from './http/generation-fast-path.ts';
import { consoleRouter } from './http/console.ts';
import { errorMiddleware, rememberAuthError } from './http/error-middleware.ts';
import type { HandlerMap } from './http/types.ts';
import { hasAuth, setAuth } from './http/auth.ts';
import { RATED_PATHS, requestRateGate } from './http/request-rate.ts';
import { imageEditMultipart } from './http/multipart.ts';
import { MAX_REFERENCE_CHARS, VIDEO_MEDIA_FIELDS, editMediaFields, mediaJsonBody } from './http/media-body.ts';
import type { MediaJsonFields } from './lib/media-json-scanner.ts';
import { fileUploadMultipart } from './http/file-upload.ts';
import { largeBodySlots, rejectBracketedQuery, rejectEncodedMultipart, rejectJsonCharset, rejectNulCharacters } from './http/request-guards.ts';
import { loadOpenApiDocument, type OpenApiDocument } from './openapi.ts';

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;
// `head` before `get`: Express answers a HEAD with a path's GET route when that route comes first,
// and a contract's HEAD operation has its own handler.
const METHODS = ['head', 'get', 'post', 'put', 'patch', 'delete'] as const;

/** `/v1/videos/{id}` -> `/v1/videos/:id` */
export function toExpressPath(path: string): string {
  return path.replace(/\{([^}]+)\}/g, ':$1');
}

function requestIdMiddleware(req: Request, res: Response, next: NextFunction): void {
  const given = req.headers['x-request-id'];
  const id = typeof given === 'string' && REQUEST_ID.test(given) ? given : `req_${randomHex(12)}`;
  (req as Request & { id: string }).id = id;
  res.setHeader('X-Request-Id', id);
  next();
}

/** The operationId the validator matched, if any. */
function operationIdOf(req: Request): string | undefined {
  return (req as Request & { openapi?: { schema?: { operationId?: string } } }).openapi?.schema?.operationId;
}

function sha256(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}

export interface CreateAppOptions {
  /** Validate every response against the contract (tests, VALIDATE_RESPONSES=1). */
  validateResponses?: boolean;
  spec?: OpenApiDocument;
  /** false: image generations meet the validator too (the fast path's differential test). */
  generationFastPath?: boolean;
}

/**
 * Options of the HTTP server the app runs in. Node ends a request whose whole body has not arrived
 * within `requestTimeout` (default 300 s) with a bare 408 and no body, before the app's own
 * `BODY_TIMEOUT_MS` (default 15 min) can answer the contract's `408 body_timeout`: a 512 MiB upload
 * on a steady but slow link was cut at 5 minutes. The app's timers come first; Node's stays as the
 * backstop for bodies the app does not time (JSON bodies), a minute later.
 */
export function httpServerOptions(config: Pick<Config, 'bodyTimeoutMs'>): ServerOptions {
  return { requestTimeout: config.bodyTimeoutMs + 60_000 };
}

export function createApp(ctx: AppContext, handlers: HandlerMap, options: CreateAppOptions = {}): express.Express {
  const spec = options.spec ?? loadOpenApiDocument();
  const app = express();
  app.disable('x-powered-by');
  app.set('etag', false);
  app.set('trust proxy', ctx.config.trustProxy);

  app.use(requestIdMiddleware);
  // A request refused before the validator (credentials, rate, body limits) is counted under its
  // operation too: the contract's, by method and path.
  const operationAt = operationMatcher(spec);
  app.use(accessLog(ctx.log, ctx.metrics, (req) => operationIdOf(req) ?? operationAt(req.method, req.originalUrl.split('?', 1)[0]!)));
  // Task polls skip the body parsers and the validator (only requests it would pass unchanged).
  app.use(taskPollFastPath(ctx, handlers));

  // Without ADMIN_TOKEN the admin API does not exist; without METRICS_TOKEN neither does /metrics.
  app.use('/admin', (_req, _res, next) => {
    if (ctx.config.adminToken === undefined) next(new ApiError(404, 'not_found', 'Not found.'));
    else next();
  });
  app.use('/metrics', (_req, _res, next) => {
    if (ctx.config.metricsToken === undefined) next(new ApiError(404, 'not_found', 'Not found.'));
    else next();
  });
  // The operator console (static SPA over the admin API), only with ADMIN_TOKEN: server/http/console.ts.
  app.use('/console', consoleRouter(ctx.config.adminToken !== undefined));

  // Credentials are checked before a body is read, so an anonymous client cannot make the server
  // buffer megabytes of JSON or uploads only to be told 401.
  const bearerCheck = (secret: string | undefined, error: () => ApiError) => {
    const hash = secret === undefined ? undefined : sha256(secret);
    return (req: Request) => {
      // The scheme in any case (RFC 7235), as API keys are read (services/auth.service.ts); the
      // token is the rest, trimmed, as written (a configured token may hold spaces).
      const token = /^Bearer\s+(.+)$/i.exec(req.headers.authorization ?? '')?.[1]?.trim() ?? '';
      if (hash && token && timingSafeEqual(sha256(token), hash)) return true;
      throw error();
    };
  };
  const checkAdminToken = bearerCheck(ctx.config.adminToken, () => new ApiError(401, 'invalid_admin_token', 'Missing or invalid admin token.'));
  const checkMetricsToken = bearerCheck(ctx.config.metricsToken, () => new ApiError(401, 'invalid_metrics_token', 'Missing or invalid metrics token.'));
  const BODY_METHODS = new Set(['POST', 'PUT', 'PATCH']);
  app.use(['/v1', '/api/v1'], (req, _res, next) => {
    if (!BODY_METHODS.has(req.method)) return next();
    ctx.services.auth.authenticate(req.headers.authorization).then(
      (auth) => {
        setAuth(req, auth);
        next();
      },
      (err: unknown) => {
        rememberAuthError(req, err);
        next(err);
      },
    );
  });
  // Requests per minute of the key and its account (generations, uploads and webhook tests): refused before the body is read.
  app.post(RATED_PATHS, requestRateGate(ctx.services.requestRates));
  app.use('/admin', (req, res, next) => {
    if (!BODY_METHODS.has(req.method) && req.method !== 'DELETE') return next();
    try {
      checkAdminToken(req);
      // An admin change reaches this instance's caches of keys, models and pool candidates before
      // its next request; the others' when the database's notification arrives (db/cluster-listener.ts).
      res.once('finish', () => {
        if (res.statusCode < 400) ctx.services.invalidateCaches();
      });
      next();
    } catch (err) {
      next(err);
    }
  });

  // Bodies with media inputs are streamed: data URLs go to the media store while they arrive.
  const { config } = ctx;
  const mediaBody = (fields: MediaJsonFields, limits: { maxMediaBytes: number; maxItemBytes: number; maxMediaCount: number }) =>
    mediaJsonBody(ctx.services.files, ctx.log, {
      fields,
      limits: { ...limits, maxOtherBytes: config.jsonBodyLimitBytes, maxReferenceChars: MAX_REFERENCE_CHARS },
      idleTimeoutMs: config.bodyIdleTimeoutMs,
      timeoutMs: config.bodyTimeoutMs,
    });
  // Before any JSON reader: a body in another charset is 415 on every route alike.
  app.use(['/v1', '/api/v1', '/admin'], (req, res, next) => (BODY_METHODS.has(req.method) ? rejectJsonCharset(req, res, next) : next()));
  app.post(
    ['/v1/videos/generations', '/api/v1/videos/generations'],
    mediaBody(VIDEO_MEDIA_FIELDS, { maxMediaBytes: config.maxMediaInputBytes, maxItemBytes: config.maxMediaInputBytes, maxMediaCount: config.maxMediaInputCount }),
  );
  app.post('/v1/images/edits', mediaBody(editMediaFields(config.maxEditImages), { maxMediaBytes: config.maxEditBodyBytes, maxItemBytes: config.maxEditFileBytes, maxMediaCount: config.maxEditImages + 1 }));
  // Before any multipart parser: a compressed multipart body is 415, not a parse error (or a stored upload).
  app.use(rejectEncodedMultipart);
  app.post('/v1/files', fileUploadMultipart(ctx.services.files, { maxFileBytes: config.uploadMaxBytes, idleTimeoutMs: config.bodyIdleTimeoutMs, timeoutMs: config.bodyTimeoutMs }));
  // Multipart edits are parsed here, with limits, instead of by the validator's unbounded multer;
  // they are held in memory, so a byte budget bounds how many are read at once.
  app.post(
    '/v1/images/edits',
    largeBodySlots(ctx.services.largeBodies, config.maxEditBodyBytes),
    imageEditMultipart({ maxFiles: config.maxEditImages, maxFileBytes: config.maxEditFileBytes, maxTotalBytes: config.maxEditBodyBytes, idleTimeoutMs: config.bodyIdleTimeoutMs, timeoutMs: config.bodyTimeoutMs }),
  );
  // JSON is read only where the credentials were checked before the body (the body methods under
  // the API and admin prefixes: every operation with a request body): elsewhere (a GET or DELETE,
  // /healthz, an unknown path) an anonymous body is never read into memory or parsed, and the
  // handler answers without it.
  const json = express.json({ limit: config.jsonBodyLimitBytes, type: ['application/json', 'application/*+json'] });
  app.use(['/v1', '/api/v1', '/admin'], (req, res, next) => (BODY_METHODS.has(req.method) ? json(req, res, next) : next()));
  app.use(rejectNulCharacters);
  app.use(rejectBracketedQuery);
  // A valid JSON image generation goes to its handler from here (http/generation-fast-path.ts);
  // every other request, and any generation the operation's schema refuses, meets the validator.
  if (options.generationFastPath !== false) app.post(IMAGE_GENERATION_PATH, imageGenerationFastPath(spec, handlers.createImage));

  useContractValidator(app, spec, { validateResponses: options.validateResponses ?? ctx.config.validateResponses }, {
    apiKey: async (req) => {
      if (hasAuth(req)) return true;
      try {
        setAuth(req, await ctx.services.auth.authenticate(req.headers.authorization));
        return true;
      } catch (err) {
        rememberAuthError(req, err);
        throw err;
      }
    },
    adminToken: (req) => checkAdminToken(req),
    metricsToken: (req) => {
      try {
        return checkMetricsToken(req);
      } catch (err) {
        rememberAuthError(req, err);
        throw err;
      }
    },
  });

  mountHandlers(app, spec, handlers);
  app.use((_req, _res, next) => next(new ApiError(404, 'not_found', 'Not found.')));
  app.use(errorMiddleware(ctx.log));
  return app;
}

/** Mounts each operation's handler at its path from the spec; static segments before parameters. */
function mountHandlers(app: express.Express, spec: OpenApiDocument, handlers: HandlerMap): void {
  const paths = Object.keys(spec.paths).sort((a, b) => (a.includes('{') ? 1 : 0) - (b.includes('{') ? 1 : 0));
  for (const path of paths) {
    // OpenApiDocument's path items name no `head`; the bundled contract's do.
    const item: Partial<Record<(typeof METHODS)[number], { operationId?: string }>> = spec.paths[path] ?? {};
    for (const method of METHODS) {
      const operationId = item[method]?.operationId as keyof HandlerMap | undefined;
      if (!operationId) continue;
      const handler = handlers[operationId];
      if (!handler) throw new Error(`no handler for operation ${operationId}`);
      app[method](toExpressPath(path), async (req, res, next) => {
        try {
          await (handler as (req: Request, res: Response, next: NextFunction) => unknown)(req, res, next);
        } catch (err) {
          next(err);
        }
      });
    }
  }
}
