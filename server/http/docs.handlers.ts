/**
 * GET / (an index of what is where), GET /docs (the rendered API reference) and GET /openapi.json (the bundled contract it renders, the
 * very file the validator reads, its `servers` naming PUBLIC_BASE_URL when that is set). Both are
 * built on their first request and kept: start-up does not pay for them, and they change only with
 * a deployment. `no-cache` with an ETag: a browser revalidates and gets `304` instead of the 2.5 MB
 * page again, and never shows a stale reference.
 */
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import type { Response } from 'express';
import { openApiPath } from '../openapi.ts';
import { renderDocsPage } from './docs-page.ts';
import { sendJson, type HandlerMap } from './types.ts';

interface Served {
  body: Buffer;
  contentType: string;
  etag: string;
}

function served(body: Buffer, contentType: string): Served {
  return { body, contentType, etag: `"${createHash('sha256').update(body).digest('base64url')}"` };
}

/** Loads once; a failed load is tried again on the next request. */
function once<T>(load: () => Promise<T>): () => Promise<T> {
  let loading: Promise<T> | undefined;
  return () =>
    (loading ??= load().catch((err: unknown) => {
      loading = undefined;
      throw err;
    }));
}

function send(res: Response, doc: Served): void {
  res.setHeader('Content-Type', doc.contentType);
  res.setHeader('Cache-Control', 'no-cache');
  res.setHeader('ETag', doc.etag);
  // Express answers 304 without the body when the request's If-None-Match holds this ETag.
  res.status(200).send(doc.body);
}

/**
 * `publicBaseUrl` (PUBLIC_BASE_URL): the contract served names it as its one server, so that a client
 * generated from a deployed gateway's /openapi.json (and the reference's examples) reach that
 * gateway; unset, both serve the file as it is (its server: `npm start`'s http://localhost:8080).
 */
export function docsHandlers(publicBaseUrl: string | undefined, consoleOn: boolean): Pick<HandlerMap, 'getServiceIndex' | 'getApiReference' | 'getOpenApiDocument'> {
  const specFile = once(async () => {
    const file = await readFile(openApiPath());
    if (publicBaseUrl === undefined) return file;
    const spec = JSON.parse(file.toString('utf8')) as { servers?: unknown };
    spec.servers = [{ url: publicBaseUrl, description: 'This gateway (PUBLIC_BASE_URL).' }];
    return Buffer.from(JSON.stringify(spec, null, 2) + '\n');
  });
  const spec = once(async () => served(await specFile(), 'application/json; charset=utf-8'));
  const page = once(async () => served(Buffer.from(await renderDocsPage((await specFile()).toString('utf8'))), 'text/html; charset=utf-8'));
  // Relative links: right at the base URL behind any path prefix.
  const index = { service: 'mediagate', api: 'v1', docs: 'docs', openapi: 'openapi.json', health: 'healthz', readiness: 'readyz', console: consoleOn ? 'console/' : null } as const;
  return {
    getServiceIndex(_req, res) {
      sendJson(res, 'getServiceIndex', 200, index);
    },
    async getApiReference(_req, res) {
      send(res, await page());
    },
    async getOpenApiDocument(_req, res) {
      send(res, await spec());
    },
  };
}
