/**
 * The contract's validator (express-openapi-validator): route match, HEAD as GET where the contract
 * has no HEAD, security, request validation, and response validation when asked.
 *
 * It prepares the contract as it is built (parsed, bundled, preprocessed: a few tenths of a second
 * of CPU) and compiles each operation's schemas on that operation's first request (~0.05 s each),
 * so one built per app paid that again in every app of a process: the test harness starts ~150
 * apps in a handful of processes.
 * Apps of one process built from the same contract with the same options share one validator here.
 * What differs between apps is read from the app that handles the request: its security checks
 * (`app.locals`, set by `useContractValidator`) and the path parameters the validator installs on
 * the first app it meets, which every app gets here instead.
 *
 * The validator is given a copy of the contract (it rewrites what it is given), so the caller's
 * document stays as written.
 */
import { createHash } from 'node:crypto';
import type express from 'express';
import type { Request, RequestHandler } from 'express';
import * as OpenApiValidator from 'express-openapi-validator';
import { STRICT_FORMATS } from '../contract-schemas.ts';
import type { OpenApiDocument } from '../openapi.ts';
import { trimValidatorStartup } from './validator-startup.ts';
import { cacheValidatorRouteMatchers } from './validator-route-cache.ts';

/** The app's answers to the contract's security schemes: true, or a thrown error. */
export interface ContractSecurity {
  apiKey(req: Request): Promise<boolean>;
  adminToken(req: Request): boolean;
  metricsToken(req: Request): boolean;
}

const SECURITY = 'mediagateContractSecurity';
/** Distinct contracts (or options) a process builds validators for: one in production, a few in tests. */
const MAX_VALIDATORS = 8;
const validators = new Map<string, RequestHandler[]>();

function securityOf(req: Request): ContractSecurity {
  return req.app.locals[SECURITY] as ContractSecurity;
}

/** Mounts the validator on `app`, with `security` as the app's checks. */
export function useContractValidator(app: express.Express, spec: OpenApiDocument, options: { validateResponses: boolean }, security: ContractSecurity): void {
  app.locals[SECURITY] = security;
  installPathParams(app, spec);
  app.use(contractValidator(spec, options.validateResponses));
}

/** How many validators this process has built (for tests: apps of one contract share one). */
export function builtValidators(): number {
  return validators.size;
}

function contractValidator(spec: OpenApiDocument, validateResponses: boolean): RequestHandler[] {
  const key = `${validateResponses ? 'r' : '-'}${createHash('sha256').update(JSON.stringify(spec)).digest('base64')}`;
  let middleware = validators.get(key);
  if (middleware) return middleware;
  cacheValidatorRouteMatchers();
  trimValidatorStartup();
  middleware = OpenApiValidator.middleware({
    apiSpec: withHeadAsGet(structuredClone(spec)) as never,
    validateApiSpec: false,
    validateRequests: { allowUnknownQueryParameters: false, removeAdditional: false },
    validateResponses,
    validateFormats: true,
    // ajv-formats' fast mode, except a date-time must exist (contract-schemas.ts, which agrees).
    formats: { ...STRICT_FORMATS },
    fileUploader: false,
    validateSecurity: {
      handlers: {
        apiKey: (req) => securityOf(req).apiKey(req),
        adminToken: (req) => securityOf(req).adminToken(req),
        metricsToken: (req) => securityOf(req).metricsToken(req),
      },
    },
  }) as RequestHandler[];
  if (validators.size >= MAX_VALIDATORS) validators.delete(validators.keys().next().value!);
  validators.set(key, middleware);
  return middleware;
}

/**
 * What the validator does to the first app it meets (`installPathParams`): each path parameter of
 * the contract is taken from the validator's own match of the path. Done here for every app.
 */
function installPathParams(app: express.Express, spec: OpenApiDocument): void {
  const names = new Set<string>();
  for (const path of Object.keys(spec.paths)) for (const [, name] of path.matchAll(/\{([^}]+)\}/g)) names.add(name!);
  for (const name of names) {
    app.param(name, (req, _res, next) => {
      const pathParams = (req as Request & { openapi?: { pathParams?: Record<string, string> } }).openapi?.pathParams;
      if (pathParams) req.params[name] = pathParams[name] || req.params[name]!;
      next();
    });
  }
}

/**
 * The contract as the validator reads it: HEAD is GET without a body wherever the contract declares
 * no HEAD of its own (RFC 9110 §9.3.2; monitors and `curl -I` send it), so it meets GET's security
 * and parameters instead of the validator's 405, and Express then runs GET's handler (its default
 * for HEAD), which Node answers without the body. A copy per method: the validator rewrites the
 * operations it is given. The contract itself (docs, /openapi.json, Prism) is left as written.
 */
function withHeadAsGet(spec: OpenApiDocument): OpenApiDocument {
  const paths: OpenApiDocument['paths'] = {};
  for (const [path, item] of Object.entries(spec.paths)) {
    paths[path] = item.get && !item.head ? { ...item, head: structuredClone(item.get) } : item;
  }
  return { ...spec, paths };
}
