/**
 * Ready-made catalog models for the upstream models the adapters serve, shipped as data: one JSON
 * file per model, `definitions/<provider>/<name>.json`, holding the body of `POST /admin/v1/models`
 * (`model`, prices in credits for the operator to edit), the upstream's own model id and a note on
 * the model's constraints and where its prices come from. `npm run admin -- models create --from
 * <provider>/<name>` loads one. Nothing lists the files: adding a model is adding a file (the
 * definitions test checks every file against the contract and creates it through the admin service).
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { components } from '../../generated/api.d.ts';
import { isProviderKind, type ProviderKind } from '../providers/registry.ts';

export type CatalogModelBody = components['schemas']['AdminCatalogModelCreate'];

export interface CatalogDefinition {
  /** `<provider>/<file name>`, e.g. `openai/sora-2`. */
  id: string;
  /** The provider kind whose members serve it: the folder's name. */
  provider: ProviderKind;
  /** What the upstream calls the model; a member needs a model map when the catalog id differs. */
  upstreamModel: string;
  notes: string;
  /** The admin API's create body, as shipped. */
  model: CatalogModelBody;
}

const ENVELOPE_KEYS = ['upstream_model', 'notes', 'model'];

/** A definition file that cannot be used (the operator sees which file and why). */
export class CatalogDefinitionError extends Error {}

/** The shipped folder: beside this module in the sources, and still the sources' from dist/server/catalog/. */
export function catalogDefinitionsDir(): string {
  for (const rel of ['./definitions', '../../../server/catalog/definitions']) {
    const dir = fileURLToPath(new URL(rel, import.meta.url));
    if (existsSync(dir)) return dir;
  }
  throw new CatalogDefinitionError('server/catalog/definitions not found');
}

/** Every definition, ordered by id. */
export function loadCatalogDefinitions(dir = catalogDefinitionsDir()): CatalogDefinition[] {
  const out: CatalogDefinition[] = [];
  for (const provider of readdirSync(dir, { withFileTypes: true })) {
    if (!provider.isDirectory()) continue;
    for (const file of readdirSync(join(dir, provider.name))) {
      if (file.endsWith('.json')) out.push(readDefinition(dir, provider.name, file));
    }
  }
  return out.sort((a, b) => a.id.localeCompare(b.id));
}

/** One definition by id (`openai/sora-2`), or undefined. */
export function findCatalogDefinition(id: string, dir = catalogDefinitionsDir()): CatalogDefinition | undefined {
  return loadCatalogDefinitions(dir).find((d) => d.id === id);
}

/**
 * Checks the envelope only; the model body is checked where every body is, against the contract
 * and by the catalog service, when it is created.
 */
function readDefinition(dir: string, provider: string, file: string): CatalogDefinition {
  const id = `${provider}/${file.slice(0, -'.json'.length)}`;
  const fail = (why: string) => new CatalogDefinitionError(`catalog definition '${id}' (${join(dir, provider, file)}): ${why}`);
  if (!isProviderKind(provider)) throw fail(`'${provider}' is not a provider kind`);
  let data: unknown;
  try {
    data = JSON.parse(readFileSync(join(dir, provider, file), 'utf8'));
  } catch (err) {
    throw fail(`not valid JSON (${(err as Error).message})`);
  }
  if (typeof data !== 'object' || data === null || Array.isArray(data)) throw fail('not a JSON object');
  const d = data as { upstream_model?: unknown; notes?: unknown; model?: unknown };
  const stray = Object.keys(d).filter((key) => !ENVELOPE_KEYS.includes(key));
  if (stray.length > 0) throw fail(`unknown key${stray.length > 1 ? 's' : ''} ${stray.join(', ')} (a definition has ${ENVELOPE_KEYS.join(', ')})`);
  if (typeof d.upstream_model !== 'string' || d.upstream_model === '') throw fail("'upstream_model' must be a non-empty string");
  if (typeof d.notes !== 'string') throw fail("'notes' must be a string");
  if (typeof d.model !== 'object' || d.model === null || Array.isArray(d.model)) throw fail("'model' must be the body of POST /admin/v1/models");
  return { id, provider, upstreamModel: d.upstream_model, notes: d.notes, model: d.model as CatalogModelBody };
}
