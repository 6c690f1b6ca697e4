/** Catalog reads for the public API: which models a key's group can reach. */
import { sql, type Kysely, type RawBuilder } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import type { BillingMode, ImageCapabilities, VideoCapabilities } from '../catalog/capabilities.ts';

export interface VisibleModelRow {
  id: string;
  kind: string;
  createdAt: Date;
}

export interface VideoCatalogRow {
  id: string;
  displayName: string;
  capabilities: VideoCapabilities;
  /** Some enabled member of the group can run it (configuration only). */
  reachable: boolean;
  /**
   * Provider kinds of the enabled members that can run it here, each with the distinct upstream
   * models those members send for it (a member's model map, else the catalog id: `upstreamModelOf`),
   * kinds and models in order.
   */
  providers: { kind: string; models: string[] }[];
  prices: { resolution: string; mode: BillingMode; unitPrice: number }[];
}

export interface ImageCatalogRow {
  id: string;
  capabilities: ImageCapabilities;
  reachable: boolean;
  /** The capability switch of the operation (image_generation or image_edit). */
  switchedOn: boolean;
  prices: { resolution: string; quality: string; unitPrice: number }[];
}

/** An image model of `GET /v1/images/capabilities`: both operations' switches, its display name. */
export interface ImageCatalogListRow extends Omit<ImageCatalogRow, 'switchedOn'> {
  displayName: string;
  generationOn: boolean;
  editOn: boolean;
}

/** Which provider kinds this build can run, per capability (from the provider registry). */
export interface ProviderSupport {
  image: readonly string[];
  video: readonly string[];
  /** Kinds that need no credentials. */
  credentialFree: readonly string[];
}

export class ModelRepository {
  constructor(
    private readonly db: Kysely<DB>,
    private readonly providers: ProviderSupport,
  ) {}

  /**
   * A member `g` that can run a model of kind `kind` here: its provider has an adapter for that
   * kind, and it has credentials unless its provider needs none.
   */
  private runnable(kind: RawBuilder<unknown>) {
    const image = [...this.providers.image];
    const video = [...this.providers.video];
    return sql`(g.provider = any(case when ${kind} = 'image' then ${image}::text[] else ${video}::text[] end)
      and (g.provider = any(${[...this.providers.credentialFree]}::text[]) or g.credentials_ciphertext is not null))`;
  }

  /**
   * Models visible to a group, in one query: enabled in the catalog, switched on for some operation
   * of their kind (an image model while `image_generation` or `image_edit` is on, since a key can use
   * it for either; a video model while `video_generation` is on), and listed by an enabled member of
   * the group that can run (a `local` member, or an upstream member with credentials). Configuration
   * only, not live capacity.
   */
  listVisible(groupId: string, kind?: 'image' | 'video'): Promise<VisibleModelRow[]> {
    let query = this.db
      .selectFrom('catalogModels as m')
      .select(['m.id', 'm.kind', 'm.createdAt'])
      .where('m.enabled', '=', true)
      .where(({ exists, selectFrom }) =>
        exists(
          selectFrom('capabilitySwitches as s')
            .select(sql`1`.as('one'))
            .where('s.enabled', '=', true)
            .where(sql<boolean>`((m.kind = 'image' and s.name in ('image_generation', 'image_edit')) or (m.kind = 'video' and s.name = 'video_generation'))`),
        ),
      )
      .where(({ exists, selectFrom }) =>
        exists(
          selectFrom('groupMembers as g')
            .select(sql`1`.as('one'))
            .where('g.groupId', '=', groupId)
            .where('g.enabled', '=', true)
            .where(sql<boolean>`m.id = any(g.models)`)
            .where(sql<boolean>`${this.runnable(sql`m.kind`)}`),
        ),
      );
    if (kind) query = query.where('m.kind', '=', kind);
    return query.orderBy('m.kind').orderBy('m.id').execute();
  }

  /**
   * Whether `modelId` is a model of the other kind than the one asked for, visible to the group (an
   * image model sent to the video endpoint, or the reverse): what a `model_not_found` then says.
   */
  async visibleAs(groupId: string, modelId: string, kind: 'image' | 'video'): Promise<boolean> {
    return (await this.listVisible(groupId, kind)).some((m) => m.id === modelId);
  }

  /**
   * Video models visible to a group (listed by an enabled member; product spec §4.7), with whether
   * such a member can also run them here (`reachable`: an adapter and credentials) and their price
   * rows; one query.
   */
  listVideoCatalog(groupId: string): Promise<VideoCatalogRow[]> {
    return this.videoCatalog(groupId, undefined);
  }

  /**
   * One video model as a group sees it: listed by any member of the group, enabled or not, so that
   * a model whose members are all disabled is found unreachable (`503 no_reachable_member`), as an
   * image model is, rather than unknown.
   */
  async findVideoModel(groupId: string, modelId: string): Promise<VideoCatalogRow | undefined> {
    return (await this.videoCatalog(groupId, modelId))[0];
  }

  private async videoCatalog(groupId: string, modelId: string | undefined): Promise<VideoCatalogRow[]> {
    const serving = sql`g.enabled and ${this.runnable(sql`'video'`)}`;
    // The (kind, upstream model) pairs of the serving members, then grouped by kind. The upstream
    // model is what `upstreamModelOf` (pool.ts) sends: the member's model map, else the catalog id.
    const pair = sql`jsonb_build_array(g.provider, coalesce(g.model_map->>m.id, m.id))`;
    const result = await sql<VideoCatalogRow>`
      select m.id, m.display_name as "displayName", m.capabilities,
             bool_or(${serving}) as reachable,
             coalesce((select json_agg(json_build_object('kind', k.kind, 'models', k.models) order by k.kind)
                       from (select e->>0 as kind, json_agg(e->>1 order by e->>1) as models
                             from jsonb_array_elements(jsonb_agg(distinct ${pair}) filter (where ${serving})) e
                             group by e->>0) k), '[]'::json) as providers,
             coalesce((select json_agg(json_build_object('resolution', p.resolution, 'mode', p.mode, 'unitPrice', p.unit_price) order by p.resolution)
                       from model_prices p where p.model_id = m.id and p.quality = ''), '[]'::json) as prices
      from catalog_models m
      join group_members g on g.group_id = ${groupId} and m.id = any(g.models)
      where m.kind = 'video' and m.enabled
        and exists (select 1 from capability_switches s where s.name = 'video_generation' and s.enabled)
        ${modelId === undefined ? sql`` : sql`and m.id = ${modelId}`}
      group by m.id
      ${modelId === undefined ? sql`having bool_or(g.enabled)` : sql``}
      order by m.id`.execute(this.db);
    return result.rows;
  }

  /**
   * The video model ids a group's members list, enabled in the catalog (to recognise composite
   * ids): never the ids only other groups are sold, or that the operator disabled, whose existence a
   * key must not learn from the error it gets.
   */
  async videoModelIds(groupId: string): Promise<string[]> {
    const { rows } = await sql<{ id: string }>`
      select m.id from catalog_models m
      where m.kind = 'video' and m.enabled and exists (select 1 from group_members g where g.group_id = ${groupId} and m.id = any(g.models))`.execute(this.db);
    return rows.map((r) => r.id);
  }

  async isSwitchedOn(name: 'image_generation' | 'image_edit' | 'video_generation'): Promise<boolean> {
    const row = await this.db.selectFrom('capabilitySwitches').select('enabled').where('name', '=', name).executeTakeFirst();
    return row?.enabled ?? false;
  }

  /**
   * Image models visible to a group (listed by an enabled member, while image generation or editing
   * is switched on), with whether such a member can run them here, their prices and the two
   * switches; one query.
   */
  listImageCatalog(groupId: string): Promise<ImageCatalogListRow[]> {
    return this.imageCatalog(groupId, undefined);
  }

  /**
   * One image model as a group sees it, with its prices and the operation's switch; one query.
   * Listed by any member of the group, enabled or not: a model whose members are all disabled is
   * found unreachable (`503 no_reachable_member`), not unknown.
   */
  async findImageModel(groupId: string, modelId: string, switchName: 'image_generation' | 'image_edit'): Promise<ImageCatalogRow | undefined> {
    const row = (await this.imageCatalog(groupId, modelId))[0];
    if (!row) return undefined;
    const { generationOn, editOn, displayName: _name, ...model } = row;
    return { ...model, switchedOn: switchName === 'image_generation' ? generationOn : editOn };
  }

  private async imageCatalog(groupId: string, modelId: string | undefined): Promise<ImageCatalogListRow[]> {
    const switchedOn = (name: string) => sql`coalesce((select s.enabled from capability_switches s where s.name = ${name}), false)`;
    const result = await sql<ImageCatalogListRow>`
      select m.id, m.display_name as "displayName", m.capabilities,
             bool_or(g.enabled and ${this.runnable(sql`'image'`)}) as reachable,
             ${switchedOn('image_generation')} as "generationOn", ${switchedOn('image_edit')} as "editOn",
             coalesce((select json_agg(json_build_object('resolution', p.resolution, 'quality', p.quality, 'unitPrice', p.unit_price))
                       from model_prices p where p.model_id = m.id), '[]'::json) as prices
      from catalog_models m
      join group_members g on g.group_id = ${groupId} and m.id = any(g.models)
      where m.kind = 'image' and m.enabled
        ${modelId === undefined ? sql`and exists (select 1 from capability_switches s where s.name in ('image_generation', 'image_edit') and s.enabled)` : sql`and m.id = ${modelId}`}
      group by m.id
      ${modelId === undefined ? sql`having bool_or(g.enabled)` : sql``}
      order by m.id`.execute(this.db);
    return result.rows;
  }
}
