// `models list|get|set-price|set-reference-limit|enable|disable`: the model catalog and its prices.
import type { AdminServices } from '../../server/services/admin/index.ts';
import type { AdminPriceRow } from '../../server/services/admin/admin-mappers.ts';
import { int, num, oneOf, required, UsageError } from './args.ts';
import type { Command, Commands } from './command.ts';
import { lines, table, type Row } from './output.ts';

const MODEL_COLUMNS = ['id', 'kind', 'enabled', 'display_name'];

function modelText(model: Awaited<ReturnType<AdminServices['catalog']['get']>>): string {
  const { pricing, image, video, ...rest } = model;
  const caps = image ?? video;
  const prices = table(pricing as unknown as Row[], ['resolution', 'quality', 'mode', 'unit_price']);
  return `${lines({ ...rest, capabilities: caps })}\npricing:\n${prices}`;
}

const setEnabled: Command = async ({ admin, verb, target }) => {
  const model = await admin.catalog.update(target(), { enabled: verb === 'enable' });
  return { json: model, text: modelText(model) };
};

export const modelCommands: Commands = {
  list: async ({ admin, flags }) => {
    const models = await admin.catalog.list(oneOf(flags.kind, 'kind', ['image', 'video'] as const));
    return { json: models, text: table(models.data as unknown as Row[], MODEL_COLUMNS) };
  },

  get: async ({ admin, target }) => {
    const model = await admin.catalog.get(target());
    return { json: model, text: modelText(model) };
  },

  // Changes one existing price row (matched by resolution and quality); rows are never added here.
  'set-price': async ({ admin, flags, target }) => {
    const id = target();
    const resolution = required(flags.resolution, 'resolution');
    const quality = oneOf(flags.quality, 'quality', ['low', 'medium', 'high'] as const) ?? null;
    const price = num(required(flags.price, 'price'), 'price');
    const mode = oneOf(flags.mode, 'mode', ['per_second', 'per_item'] as const);
    const current = await admin.catalog.get(id);
    const row = current.pricing.find((p) => p.resolution === resolution && p.quality === quality);
    if (!row) {
      const slots = current.pricing.map((p) => (p.quality ? `${p.resolution}/${p.quality}` : p.resolution)).join(', ');
      throw new UsageError(`${id} has no price row for ${quality ? `${resolution}/${quality}` : resolution} (rows: ${slots})`);
    }
    const pricing: AdminPriceRow[] = current.pricing.map((p) => (p === row ? { ...p, unit_price: price, mode: mode ?? p.mode } : p));
    const model = await admin.catalog.update(id, { pricing });
    return { json: model, text: modelText(model) };
  },

  'set-reference-limit': async ({ admin, flags, target }) => {
    const model = await admin.catalog.update(target(), { reference_image_max_count: int(required(flags.count, 'count'), 'count') });
    return { json: model, text: modelText(model) };
  },

  enable: setEnabled,
  disable: setEnabled,
};
