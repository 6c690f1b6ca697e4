/** Loads the bundled contract, the one artifact the validator, Prism and codegen read. */
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export interface OpenApiDocument {
  paths: Record<string, Partial<Record<'get' | 'head' | 'post' | 'put' | 'patch' | 'delete', { operationId?: string; security?: unknown[] }>>>;
  [key: string]: unknown;
}

export function openApiPath(): string {
  // From server/ in development and from dist/server/ after `npm run build`.
  for (const rel of ['../generated/openapi.json', '../../generated/openapi.json']) {
    const path = fileURLToPath(new URL(rel, import.meta.url));
    if (existsSync(path)) return path;
  }
  throw new Error('generated/openapi.json not found; run `npm run generate`');
}

export function loadOpenApiDocument(): OpenApiDocument {
  return JSON.parse(readFileSync(openApiPath(), 'utf8')) as OpenApiDocument;
}
