import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
const statements = [
  // capabilities is kind-specific JSON:
  //   image: { resolutions: string[], aspectRatios: string[], outputFormats: string[],
  //            supportsQuality: boolean, supportsTransparentBackground: boolean, maxN: number }
  //   video: { durations: number[], aspectRatios: string[], resolutions: string[], frames: number[],
  //            referenceImages: { maxCount: number, configurable: boolean },
  //            audio: { supported: boolean, defaultEnabled: boolean } }
  // The shape is validated by the catalog service; the database only insists on an object.
  `create table catalog_models (
     id text primary key,
     kind text not null,
     display_name text not null,
     enabled boolean not null default true,
     capabilities jsonb not null,
     created_at timestamptz not null default now(),
     updated_at timestamptz not null default now(),
     constraint catalog_models_id_format check (char_length(id) between 1 and 128 and id !~ '\\s'),
     constraint catalog_models_kind_check check (kind in ('image', 'video')),
     constraint catalog_models_display_name_not_blank check (btrim(display_name) <> ''),
     constraint catalog_models_capabilities_object check (jsonb_typeof(capabilities) = 'object')
   )`,
  `create trigger catalog_models_set_updated_at before update on catalog_models
     for each row execute function set_updated_at()`,

  // unit_price is micro-credits per second of video (per_second) or per output item (per_item).
  // quality '' means the price applies to every quality of that resolution.
  `create table model_prices (
     model_id text not null,
     resolution text not null,
     quality text not null default '',
     mode text not null,
     unit_price bigint not null,
     updated_at timestamptz not null default now(),
     constraint model_prices_pkey primary key (model_id, resolution, quality),
     constraint model_prices_model_fk foreign key (model_id) references catalog_models (id) on delete cascade,
     constraint model_prices_resolution_not_blank check (btrim(resolution) <> ''),
     constraint model_prices_mode_check check (mode in ('per_second', 'per_item')),
     constraint model_prices_unit_price_nonnegative check (unit_price >= 0)
   )`,
  `create trigger model_prices_set_updated_at before update on model_prices
     for each row execute function set_updated_at()`,

  // Operator kill switches per capability; the rows always exist, so handlers just read them.
  `create table capability_switches (
     name text primary key,
     enabled boolean not null default true,
     updated_at timestamptz not null default now(),
     constraint capability_switches_name_check
       check (name in ('image_generation', 'image_edit', 'video_generation'))
   )`,
  `create trigger capability_switches_set_updated_at before update on capability_switches
     for each row execute function set_updated_at()`,
  `insert into capability_switches (name, enabled)
     values ('image_generation', true), ('image_edit', true), ('video_generation', true)`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
