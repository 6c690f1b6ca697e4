// `models list|get|definitions|create|update|set-price|set-reference-limit|enable|disable`: the model
// catalog and its prices. `create` and `update` build the body of POST/PATCH /admin/v1/models (from
// a shipped definition, a JSON file and flags) and send it through the contract's schema and the
// catalog service, exactly as the admin API does.
import { readFileSync } from 'node:fs';
import { findCatalogDefinition, loadCatalogDefinitions, type CatalogDefinition, type CatalogModelBody } from '../../server/catalog/catalog-definitions.ts';
import { ApiError } from '../../server/errors.ts';
import type { AdminServices } from '../../server/services/admin/index.ts';
import type { AdminPriceRow } from '../../server/services/admin/admin-mappers.ts';
import type { CatalogModelUpdateInput } from '../../server/services/admin/catalog-admin.service.ts';
import { bool, defined, int, nullable, num, oneOf, optInt, required, UsageError, type Flags } from './args.ts';
import type { Command, Commands } from './command.ts';
import { checkBody, type AdminBodySchema } from './contract.ts';
import { lines, table, type Output, type Row } from './output.ts';

const MODEL_COLUMNS = ['id', 'kind', 'enabled', 'display_name', 'prices'];
const DEFINITION_COLUMNS = ['id', 'kind', 'upstream_model', 'display_name', 'prices'];
const QUALITIES = ['low', 'medium', 'high'] as const;
const AGGREGATORS = ['fal', 'replicate'] as const;

type Model = Awaited<ReturnType<AdminServices['catalog']['get']>>;
type PriceRow = Pick<AdminPriceRow, 'resolution' | 'quality' | 'mode' | 'unit_price'>;

const slot = (p: Pick<PriceRow, 'resolution' | 'quality'>) => (p.quality ? `${p.resolution}/${p.quality}` : p.resolution);

/** `720p 0.1/s, 1080p 0.5/s` or `1K/low 0.016, …`: a model's prices on one line. */
function priceSummary(pricing: readonly PriceRow[]): string {
  return pricing.map((p) => `${slot(p)} ${p.unit_price}${p.mode === 'per_second' ? '/s' : ''}`).join(', ');
}

function modelText(model: Pick<Model, 'pricing' | 'image' | 'video'> & { upstream_mappings?: Model['upstream_mappings'] } & Row): string {
  const { pricing, image, video, upstream_mappings: mappings, ...rest } = model;
  const prices = table(pricing as unknown as Row[], ['resolution', 'quality', 'mode', 'unit_price']);
  const mapped = Object.entries(mappings ?? {}).map(([provider, m]) => `${provider}: ${m.endpoint}\n  input:  ${m.input.replace(/\s*\n\s*/g, ' ')}\n  output: ${m.output}${m.media ? `\n  media:  ${m.media}` : ''}${m.wait ? `\n  wait:   ${m.wait}s` : ''}`);
  return `${lines({ ...rest, capabilities: image ?? video })}\npricing:\n${prices}${mapped.length ? `\nupstream mappings:\n${mapped.join('\n')}` : ''}`;
}

const shown = (model: Model): Output => ({ json: model, text: modelText(model) });

/** `--price 720p=0.2`, `--price 1K/high=0.3`: one price row to change. */
function priceFlag(value: string): Pick<PriceRow, 'resolution' | 'quality' | 'unit_price'> {
  const m = /^([^=/\s]+)(?:\/([a-z]+))?=(.+)$/.exec(value.trim());
  if (!m) throw new UsageError(`--price must look like RESOLUTION=PRICE or RESOLUTION/QUALITY=PRICE (e.g. 720p=0.2, 1K/high=0.3), got '${value}'`);
  const quality = m[2] === undefined ? null : oneOf(m[2], 'price quality', QUALITIES)!;
  return { resolution: m[1]!, quality, unit_price: num(m[3]!, 'price') };
}

/**
 * The model's price rows with those named by `--price` changed (and their mode, with `--mode`).
 * Rows are only changed, never added: a row the model does not have is a usage error that lists
 * the rows it has (which rows a model must have is the service's rule).
 */
function withPrices(id: string, pricing: readonly PriceRow[], flags: Flags): PriceRow[] {
  const changes = (flags.price ?? []).map(priceFlag);
  const mode = oneOf(flags.mode, 'mode', ['per_second', 'per_item'] as const);
  const out = pricing.map((p) => ({ ...p }));
  for (const change of changes) {
    const row = out.find((p) => p.resolution === change.resolution && p.quality === change.quality);
    if (!row) throw new UsageError(`${id} has no price row for ${slot(change)} (rows: ${pricing.map(slot).join(', ')})`);
    row.unit_price = change.unit_price;
    if (mode) row.mode = mode;
  }
  return out;
}

/** The JSON body in `--file` (`-` reads standard input), as the API would receive it. */
function bodyFromFile(path: string): unknown {
  const text = readFileSync(path === '-' ? 0 : path, 'utf8');
  try {
    return JSON.parse(text);
  } catch (err) {
    // One line, as every CLI error: JSON.parse quotes the text around the mistake, newlines included.
    throw new ApiError(400, 'invalid_json', `The file '${path}' is not valid JSON: ${(err as Error).message.replace(/\s+/g, ' ')}.`);
  }
}

/** A file whose JSON is not an object: the schema check names the problem, as the API would (every body schema is an object). */
function objectBody(schema: AdminBodySchema, value: unknown): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) checkBody(schema, value);
  return value as Record<string, unknown>;
}

function definition(id: string): CatalogDefinition {
  const found = findCatalogDefinition(id);
  if (!found) throw new UsageError(`no catalog definition '${id}' (run 'npm run admin -- models definitions' for the list)`);
  return found;
}

/** What a member needs to serve a model created from a definition (text output only). */
function memberHint(def: CatalogDefinition, model: Model): string {
  // An aggregator's model runs through its mapping (upstream_model is the mapping's endpoint): no model map.
  const map = model.id === def.upstreamModel || def.model.upstream_mappings?.[def.provider as 'fal' | 'replicate'] ? '' : ` --model-map ${model.id}=${def.upstreamModel}`;
  return `\n\nserve it from a member of provider '${def.provider}': members add|update … --models ${model.id}${map}`;
}

/** Every change of a model goes through the contract's schema and then the service, as a PATCH does. */
async function save(admin: AdminServices, id: string, body: CatalogModelUpdateInput): Promise<Output> {
  checkBody('AdminCatalogModelUpdate', body);
  return shown(await admin.catalog.update(id, body));
}

const setEnabled: Command = async ({ admin, verb, target }) => save(admin, target(), { enabled: verb === 'enable' });

export const modelCommands: Commands = {
  list: async ({ admin, flags }) => {
    const models = await admin.catalog.list(oneOf(flags.kind, 'kind', ['image', 'video'] as const));
    const rows = models.data.map((m) => ({ ...m, prices: priceSummary(m.pricing) }) as unknown as Row);
    return { json: models, text: table(rows, MODEL_COLUMNS) };
  },

  get: async ({ admin, target }) => shown(await admin.catalog.get(target())),

  // Without an id: the shipped definitions; with one: its body (--json prints exactly what
  // `models create --file` and POST /admin/v1/models take, for a variant of your own).
  definitions: async ({ args, flags }) => {
    if (args[0] !== undefined) {
      const def = definition(args[0]);
      const { model } = def;
      const text = `${def.notes}\n\n${modelText({ provider: def.provider, upstream_model: def.upstreamModel, ...model, pricing: model.pricing, image: model.image ?? null, video: model.video ?? null })}`;
      return { json: model, text };
    }
    const kind = oneOf(flags.kind, 'kind', ['image', 'video'] as const);
    const found = loadCatalogDefinitions().filter((d) => (flags.provider === undefined || d.provider === flags.provider) && (kind === undefined || d.model.kind === kind));
    const rows = found.map((d) => ({ id: d.id, kind: d.model.kind, upstream_model: d.upstreamModel, display_name: d.model.display_name, prices: priceSummary(d.model.pricing) }));
    const json = { data: found.map((d) => ({ id: d.id, provider: d.provider, upstream_model: d.upstreamModel, notes: d.notes, model: d.model })) };
    return { json, text: table(rows, DEFINITION_COLUMNS) };
  },

  // A shipped definition (--from) or a body of your own (--file), then --id, --display-name,
  // --enabled and --price on top.
  create: async ({ admin, flags }) => {
    if ((flags.from === undefined) === (flags.file === undefined)) throw new UsageError('models create needs exactly one of --from <definition> and --file <body.json>');
    const def = flags.from === undefined ? undefined : definition(flags.from);
    const base = def ? structuredClone(def.model) : objectBody('AdminCatalogModelCreate', bodyFromFile(flags.file!));
    const body = { ...base, ...defined({ id: flags.id, display_name: flags['display-name'], enabled: bool(flags.enabled, 'enabled') }) } as CatalogModelBody;
    if (flags.price === undefined) {
      if (flags.mode !== undefined) throw new UsageError('--mode changes the rows named by --price; name them');
    } else if (Array.isArray(body.pricing)) body.pricing = withPrices(body.id ?? 'the model', body.pricing, flags); // else the schema check names the problem
    checkBody('AdminCatalogModelCreate', body);
    const model = await admin.catalog.create(body);
    return { json: model, text: modelText(model) + (def ? memberHint(def, model) : '') };
  },

  // Changes what the API's PATCH changes: display name, enabled, prices (the rows named by
  // --price; the others stay), the reference-image limit, an image model's resize setting
  // (--resize exact|native), whether it edits (--edits), the ratios a custom size may have
  // (--custom-size-ratios any|offered) and its upstream's edges (--min-edge/--max-edge N|none);
  // or a PATCH body of your own (--file).
  update: async ({ admin, flags, target }) => {
    const id = target();
    const fromFlags = defined({
      display_name: flags['display-name'],
      enabled: bool(flags.enabled, 'enabled'),
      reference_image_max_count: optInt(flags['reference-limit'], 'reference-limit'),
      resize: oneOf(flags.resize, 'resize', ['exact', 'native'] as const),
      edits: bool(flags.edits, 'edits'),
      custom_size_ratios: oneOf(flags['custom-size-ratios'], 'custom-size-ratios', ['any', 'offered'] as const),
      min_edge: nullable(flags['min-edge'], (v) => int(v, 'min-edge')),
      max_edge: nullable(flags['max-edge'], (v) => int(v, 'max-edge')),
    });
    if (flags.file === undefined && Object.keys(fromFlags).length === 0 && flags.price === undefined) {
      throw new UsageError('models update needs --display-name, --enabled, --price, --reference-limit, --resize, --edits, --custom-size-ratios, --min-edge, --max-edge or --file');
    }
    const base = flags.file === undefined ? {} : objectBody('AdminCatalogModelUpdate', bodyFromFile(flags.file));
    const body = { ...base, ...fromFlags } as CatalogModelUpdateInput;
    if (flags.price !== undefined) {
      const pricing = body.pricing ?? (await admin.catalog.get(id)).pricing;
      if (Array.isArray(pricing)) body.pricing = withPrices(id, pricing, flags);
    } else if (flags.mode !== undefined) throw new UsageError('--mode changes the rows named by --price; name them');
    return save(admin, id, body);
  },

  // Changes one existing price row (matched by resolution and quality); rows are never added here.
  'set-price': async ({ admin, flags, target }) => {
    const id = target();
    const resolution = required(flags.resolution, 'resolution');
    const quality = oneOf(flags.quality, 'quality', QUALITIES) ?? null;
    if ((flags.price ?? []).length > 1) throw new UsageError('set-price takes one --price; models update takes several');
    const price = required(flags.price?.[0], 'price');
    const current = await admin.catalog.get(id);
    const pricing = withPrices(id, current.pricing, { ...flags, price: [`${quality ? `${resolution}/${quality}` : resolution}=${price}`] });
    return save(admin, id, { pricing });
  },

  'set-reference-limit': async ({ admin, flags, target }) => save(admin, target(), { reference_image_max_count: int(required(flags.count, 'count'), 'count') }),

  // An aggregator's mapping (fal, Replicate): the JSON of an AdminUpstreamMapping, checked when saved.
  'set-mapping': async ({ admin, flags, target }) => {
    const provider = oneOf(required(flags.provider, 'provider'), 'provider', AGGREGATORS)!;
    return save(admin, target(), { upstream_mappings: { [provider]: bodyFromFile(required(flags.file, 'file')) } } as CatalogModelUpdateInput);
  },
  'remove-mapping': async ({ admin, flags, target }) => {
    const provider = oneOf(required(flags.provider, 'provider'), 'provider', AGGREGATORS)!;
    return save(admin, target(), { upstream_mappings: { [provider]: null } });
  },

  enable: setEnabled,
  disable: setEnabled,
};
