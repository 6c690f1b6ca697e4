/**
 * `POST /v1/images/generations`, the request the gateway exists for, handed to its handler without
 * the contract validator's per-request machinery (a scan of every route of the contract, a
 * parameter mutator built per request, the headers validated with coercion, the router's remaining
 * layers): 0.1–0.2 ms of the main thread per request on the bench machine (docs/BENCHMARKS.md,
 * fifth look).
 *
 * Only a request the validator would pass unchanged takes this path, decided by the operation's own
 * schema from the same bundled contract:
 * - the path exactly, without a query string (the validator rejects unknown query parameters, and
 *   this operation has none);
 * - a JSON body (`application/json`, optionally `; charset=utf-8`; express.json has parsed it and
 *   the NUL guard has passed it) that the request body's schema accepts, compiled as the validator
 *   compiles it (contract-schemas.ts: defaults filled in, no coercion), so the handler sees the
 *   same body;
 * - the operation's one header parameter (`Prefer`) absent or within its 256 characters;
 * - the caller authenticated already (the credentials middleware, before any body is read).
 *
 * Anything else goes on to the validator, which answers it exactly as before: a body this schema
 * refuses is refused there, with the contract's error. `req.openapi` carries the operation id, as
 * the validator leaves it, for the access log and the error middleware.
 * test/http/generation-fast-path.test.ts checks the two against each other, body by body.
 */
import type { NextFunction, Request, Response } from 'express';
import type { ValidateFunction } from 'ajv/dist/2020.js';
import { contractSchema } from '../contract-schemas.ts';
import type { OpenApiDocument } from '../openapi.ts';
import { hasAuth } from './auth.ts';
import type { HandlerMap } from './types.ts';

export const IMAGE_GENERATION_PATH = '/v1/images/generations';
const JSON_TYPE = /^application\/json\s*(?:;\s*charset\s*=\s*"?utf-8"?\s*)?$/i;

type Parameter = { $ref?: string; in?: string; name?: string; schema?: { type?: string; maxLength?: number } };
type Operation = { parameters?: Parameter[]; requestBody?: { content?: Record<string, { schema?: unknown }> } };

/** The JSON body schema of `method path`, compiled as the validator compiles it (contract-schemas.ts). */
export function compileRequestBody(spec: OpenApiDocument, path: string, method: 'post'): ValidateFunction {
  const operation = spec.paths[path]?.[method] as Operation | undefined;
  const ref = (operation?.requestBody?.content?.['application/json']?.schema as { $ref?: string } | undefined)?.$ref;
  const name = ref?.startsWith('#/components/schemas/') ? ref.slice('#/components/schemas/'.length) : undefined;
  if (!name) throw new Error(`the contract has no JSON body schema in components for ${method.toUpperCase()} ${path}`);
  return contractSchema(name, spec);
}

/** The operation's header parameters, resolved; the fast path knows how to check a bounded string. */
function headerLimits(spec: OpenApiDocument, path: string): Map<string, number> {
  const operation = spec.paths[path]?.post as Operation | undefined;
  const limits = new Map<string, number>();
  for (const p of operation?.parameters ?? []) {
    const param = p.$ref ? (spec.components as { parameters?: Record<string, Parameter> }).parameters?.[p.$ref.split('/').pop()!] : p;
    if (param?.in !== 'header' || param.schema?.type !== 'string' || param.schema.maxLength === undefined) {
      throw new Error(`${path}: a parameter the generation fast path cannot check (${JSON.stringify(param)})`);
    }
    limits.set(param.name!.toLowerCase(), param.schema.maxLength);
  }
  return limits;
}

export function imageGenerationFastPath(spec: OpenApiDocument, handler: HandlerMap['createImage']) {
  const validBody = compileRequestBody(spec, IMAGE_GENERATION_PATH, 'post');
  const headers = [...headerLimits(spec, IMAGE_GENERATION_PATH)];
  const openapi = { schema: { operationId: 'createImage' } };
  return (req: Request, res: Response, next: NextFunction): void => {
    if (req.url !== IMAGE_GENERATION_PATH || !hasAuth(req) || !JSON_TYPE.test(req.headers['content-type'] ?? '')) return next();
    for (const [name, max] of headers) {
      const value = req.headers[name];
      if (value !== undefined && (typeof value !== 'string' || value.length > max)) return next();
    }
    if (typeof req.body !== 'object' || req.body === null || Array.isArray(req.body) || !validBody(req.body)) return next();
    (req as Request & { openapi?: unknown }).openapi = openapi;
    (handler as (req: Request, res: Response, next: NextFunction) => Promise<void>)(req, res, next).catch(next);
  };
}
