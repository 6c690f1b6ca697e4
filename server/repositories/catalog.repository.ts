/** All Kysely code for catalog models and their price rows. Returns rows or undefined. */
import type { Kysely, Selectable } from 'kysely';
import type { CatalogModels, DB, ModelPrices } from '../../generated/db.d.ts';
import type { Executor } from '../db/database.ts';

export type CatalogModelRow = Omit<Selectable<CatalogModels>, 'createdAt' | 'updatedAt'>;
export type PriceRowRecord = Pick<Selectable<ModelPrices>, 'modelId' | 'resolution' | 'quality' | 'mode' | 'unitPrice'>;
export type CatalogModelWithPrices = CatalogModelRow & { prices: PriceRowRecord[] };

const MODEL_COLUMNS = ['id', 'kind', 'displayName', 'enabled', 'capabilities', 'upstreamMappings'] as const;
const PRICE_COLUMNS = ['modelId', 'resolution', 'quality', 'mode', 'unitPrice'] as const;

export interface PriceValues {
  resolution: string;
  /** '' when the price is not quality-specific. */
  quality: string;
  mode: string;
  unitPrice: number;
}

export class CatalogRepository {
  constructor(private readonly db: Kysely<DB>) {}

  /** Inserts a model; undefined when the id is taken. */
  insertModel(values: { id: string; kind: string; displayName: string; enabled: boolean; capabilities: unknown; upstreamMappings: unknown }, trx: Executor): Promise<CatalogModelRow | undefined> {
    return trx
      .insertInto('catalogModels')
      .values({ ...values, capabilities: JSON.stringify(values.capabilities), upstreamMappings: JSON.stringify(values.upstreamMappings) })
      .onConflict((oc) => oc.column('id').doNothing())
      .returning(MODEL_COLUMNS)
      .executeTakeFirst();
  }

  /** Replaces every price row of a model. */
  async replacePrices(modelId: string, prices: PriceValues[], trx: Executor): Promise<void> {
    await trx.deleteFrom('modelPrices').where('modelId', '=', modelId).execute();
    if (prices.length > 0) await trx.insertInto('modelPrices').values(prices.map((p) => ({ ...p, modelId }))).execute();
  }

  findModel(id: string): Promise<CatalogModelRow | undefined> {
    return this.db.selectFrom('catalogModels').select(MODEL_COLUMNS).where('id', '=', id).executeTakeFirst();
  }

  /** The model, locked until the end of the caller's transaction. */
  findModelForUpdate(id: string, trx: Executor): Promise<CatalogModelRow | undefined> {
    return trx.selectFrom('catalogModels').select(MODEL_COLUMNS).where('id', '=', id).forUpdate().executeTakeFirst();
  }

  async findModelWithPrices(id: string): Promise<CatalogModelWithPrices | undefined> {
    const model = await this.findModel(id);
    if (!model) return undefined;
    const prices = await this.db.selectFrom('modelPrices').select(PRICE_COLUMNS).where('modelId', '=', id).execute();
    return { ...model, prices };
  }

  /** Every model by id (two queries, not one per model). */
  async listModelsWithPrices(kind?: string): Promise<CatalogModelWithPrices[]> {
    let query = this.db.selectFrom('catalogModels').select(MODEL_COLUMNS).orderBy('id');
    if (kind !== undefined) query = query.where('kind', '=', kind);
    const models = await query.execute();
    if (models.length === 0) return [];
    const prices = await this.db
      .selectFrom('modelPrices')
      .select(PRICE_COLUMNS)
      .where(
        'modelId',
        'in',
        models.map((m) => m.id),
      )
      .execute();
    return models.map((m) => ({ ...m, prices: prices.filter((p) => p.modelId === m.id) }));
  }

  updateModel(id: string, patch: { displayName?: string; enabled?: boolean; capabilities?: unknown; upstreamMappings?: unknown }, trx: Executor): Promise<CatalogModelRow | undefined> {
    const { capabilities, upstreamMappings, ...rest } = patch;
    const values = Object.fromEntries(Object.entries(rest).filter(([, v]) => v !== undefined));
    if (capabilities !== undefined) values.capabilities = JSON.stringify(capabilities);
    if (upstreamMappings !== undefined) values.upstreamMappings = JSON.stringify(upstreamMappings);
    // Nothing to set (e.g. only the prices change): an empty SET is a syntax error.
    if (Object.keys(values).length === 0) return this.findModelForUpdate(id, trx);
    return trx
      .updateTable('catalogModels')
      .set(values)
      .where('id', '=', id)
      .returning(MODEL_COLUMNS)
      .executeTakeFirst();
  }

  /** The subset of `ids` that exist in the catalog. */
  /** The kind (image, video) of each of these catalog models that exists. */
  async modelKinds(ids: readonly string[]): Promise<Map<string, string>> {
    if (ids.length === 0) return new Map();
    const rows = await this.db.selectFrom('catalogModels').select(['id', 'kind']).where('id', 'in', ids).execute();
    return new Map(rows.map((r) => [r.id, r.kind]));
  }

  /** Forgets what members of these aggregator kinds recorded against a model (its mapping changed: the fault may be fixed). */
  async clearMappingFaults(model: string, providers: readonly string[], trx: Executor): Promise<void> {
    if (providers.length === 0) return;
    await trx
      .deleteFrom('memberModelFaults')
      .where('model', '=', model)
      .where('memberId', 'in', (eb) => eb.selectFrom('groupMembers').select('id').where('provider', 'in', [...providers] as never))
      .execute();
  }
}
