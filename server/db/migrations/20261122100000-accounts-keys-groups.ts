import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead. Raw SQL keeps checks,
// constraint names and triggers exactly as written. Constraints are named so the error
// middleware can map violations (SQLSTATE + constraint) to API errors.
const statements = [
  // Keeps updated_at honest on every UPDATE unless the statement sets it explicitly.
  `create function set_updated_at() returns trigger language plpgsql as $$
   begin
     if new.updated_at is not distinct from old.updated_at then
       new.updated_at := now();
     end if;
     return new;
   end $$`,

  `create table accounts (
     id text primary key,
     name text not null,
     status text not null default 'active',
     balance bigint not null default 0,
     total_earned bigint not null default 0,
     total_spent bigint not null default 0,
     created_at timestamptz not null default now(),
     updated_at timestamptz not null default now(),
     constraint accounts_id_format check (id ~ '^acct_[0-9A-Za-z]+$' and char_length(id) <= 128),
     constraint accounts_name_key unique (name),
     constraint accounts_name_not_blank check (btrim(name) <> ''),
     constraint accounts_status_check check (status in ('active', 'suspended')),
     constraint accounts_balance_nonnegative check (balance >= 0),
     constraint accounts_total_earned_nonnegative check (total_earned >= 0),
     constraint accounts_total_spent_nonnegative check (total_spent >= 0)
   )`,
  `create trigger accounts_set_updated_at before update on accounts
     for each row execute function set_updated_at()`,

  `create table backend_groups (
     id text primary key,
     name text not null,
     description text,
     created_at timestamptz not null default now(),
     updated_at timestamptz not null default now(),
     constraint backend_groups_id_format check (id ~ '^grp_[0-9A-Za-z]+$' and char_length(id) <= 128),
     constraint backend_groups_name_key unique (name),
     constraint backend_groups_name_not_blank check (btrim(name) <> '')
   )`,
  `create trigger backend_groups_set_updated_at before update on backend_groups
     for each row execute function set_updated_at()`,

  // A member is one upstream provider account inside a group (design §8).
  `create table group_members (
     id text primary key,
     group_id text not null,
     name text not null,
     provider text not null,
     base_url text,
     credentials_ciphertext bytea,
     enabled boolean not null default true,
     models text[] not null default '{}',
     priority integer not null default 0,
     weight integer not null default 1,
     concurrency_limit integer,
     created_at timestamptz not null default now(),
     updated_at timestamptz not null default now(),
     constraint group_members_id_format check (id ~ '^mem_[0-9A-Za-z]+$' and char_length(id) <= 128),
     constraint group_members_group_fk foreign key (group_id) references backend_groups (id) on delete cascade,
     constraint group_members_group_name_key unique (group_id, name),
     constraint group_members_name_not_blank check (btrim(name) <> ''),
     constraint group_members_provider_check check (provider in ('local', 'openai', 'gemini', 'ark', 'kling')),
     constraint group_members_base_url_check check (base_url ~ '^https?://'),
     constraint group_members_models_no_nulls check (array_position(models, null) is null),
     constraint group_members_weight_positive check (weight > 0),
     constraint group_members_concurrency_limit_positive check (concurrency_limit > 0)
   )`,
  `create trigger group_members_set_updated_at before update on group_members
     for each row execute function set_updated_at()`,

  // credits_used <= credit_limit is deliberately NOT a check: an admin may lower a limit below
  // what a key already used. The hold's guarded update enforces it for new spending instead.
  `create table api_keys (
     id text primary key,
     account_id text not null,
     group_id text not null,
     name text not null,
     key_hash bytea not null,
     key_prefix text not null,
     last_four text not null,
     is_active boolean not null default true,
     credit_limit bigint,
     credits_used bigint not null default 0,
     last_used_at timestamptz,
     created_at timestamptz not null default now(),
     updated_at timestamptz not null default now(),
     constraint api_keys_id_format check (id ~ '^key_[0-9A-Za-z]+$' and char_length(id) <= 128),
     constraint api_keys_account_fk foreign key (account_id) references accounts (id),
     constraint api_keys_group_fk foreign key (group_id) references backend_groups (id),
     constraint api_keys_key_hash_key unique (key_hash),
     constraint api_keys_key_hash_length check (octet_length(key_hash) = 32),
     constraint api_keys_key_prefix_format check (key_prefix ~ '^mg_[0-9A-Za-z]{5}$'),
     constraint api_keys_last_four_length check (char_length(last_four) = 4),
     constraint api_keys_credit_limit_nonnegative check (credit_limit >= 0),
     constraint api_keys_credits_used_nonnegative check (credits_used >= 0),
     -- Target of composite foreign keys that prove a hold/ledger row's key belongs to its account.
     constraint api_keys_id_account_key unique (id, account_id)
   )`,
  `create index api_keys_account_id_idx on api_keys (account_id)`,
  `create index api_keys_group_id_idx on api_keys (group_id)`,
  `create trigger api_keys_set_updated_at before update on api_keys
     for each row execute function set_updated_at()`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
