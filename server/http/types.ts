/**
 * Handler types derived from the generated contract: the handler map is keyed by operationId, so a
 * missing or extra handler is a compile error, and each handler sees its own typed params/body.
 */
import type { NextFunction, Request, Response } from 'express';
import type { components, operations } from '../../generated/api.d.ts';
import { jsonParts, jsonPartsLength, writeJsonParts, type WithBase64, type WriteLimits } from '../lib/base64-json.ts';

export type OperationId = keyof operations;
export type Schemas = components['schemas'];

type Parameters<K extends OperationId> = operations[K] extends { parameters: infer P } ? P : never;
type PathOf<K extends OperationId> = Parameters<K> extends { path: infer P } ? (P extends Record<string, unknown> ? P : Record<string, never>) : Record<string, never>;
type QueryOf<K extends OperationId> = Parameters<K> extends { query?: infer Q } ? (Q extends Record<string, unknown> ? Q : Record<string, never>) : Record<string, never>;
type BodyOf<K extends OperationId> = operations[K] extends { requestBody: { content: infer C } }
  ? C extends { 'application/json': infer B }
    ? B
    : C[keyof C]
  : operations[K] extends { requestBody?: { content: infer C } }
    ? C extends { 'application/json': infer B }
      ? B | undefined
      : C[keyof C] | undefined
    : undefined;

export type OperationRequest<K extends OperationId> = Request<PathOf<K>, unknown, BodyOf<K>, QueryOf<K>>;
export type OperationHandler<K extends OperationId> = (req: OperationRequest<K>, res: Response, next: NextFunction) => Promise<void> | void;
/** Operations of the `webhooks:` section: requests this service sends, not routes it serves. */
export type WebhookOperationId = 'videoTaskFinished';
export type HandlerMap = { [K in Exclude<OperationId, WebhookOperationId>]: OperationHandler<K> };

type ResponsesOf<K extends OperationId> = operations[K]['responses'];
/** The JSON body of response `S` of operation `K`. */
export type ResponseBody<K extends OperationId, S extends keyof ResponsesOf<K>> = ResponsesOf<K>[S] extends {
  content: { 'application/json': infer B };
}
  ? B
  : never;

/** Sends a JSON response whose body type is checked against the contract for this status. */
export function sendJson<K extends OperationId, S extends keyof ResponsesOf<K> & number>(
  res: Response,
  _operation: K,
  status: S,
  body: ResponseBody<K, S>,
  headers: Record<string, string> = {},
): void {
  for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
  res.status(status).json(body);
}

/**
 * sendJson for a body that carries images (`b64_json` as Base64Bytes): the JSON is written with
 * each image's base64 produced slice by slice (lib/base64-json.ts), never as one string. Resolves
 * once the body is written, or when the client went away meanwhile — or stalled past `limits` and
 * was cut off (a body of images held for a client that reads none of it).
 */
export async function sendJsonWithImages<K extends OperationId, S extends keyof ResponsesOf<K> & number>(
  res: Response,
  _operation: K,
  status: S,
  body: WithBase64<ResponseBody<K, S>>,
  limits: WriteLimits,
): Promise<void> {
  const parts = jsonParts(body);
  res.status(status);
  res.setHeader('Content-Type', 'application/json; charset=utf-8');
  res.setHeader('Content-Length', String(jsonPartsLength(parts)));
  try {
    await writeJsonParts(res, parts, '', '', limits);
  } catch (err) {
    if (res.destroyed) return;
    throw err;
  }
  res.end();
}
