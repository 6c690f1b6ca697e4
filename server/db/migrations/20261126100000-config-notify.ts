import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Every instance caches configuration read on the hot path (API keys, image models, pool
// candidates with their members' health) for a few seconds. A change to what those caches hold
// sends NOTIFY mediagate_config at commit, whoever makes it (the admin API of any instance, the
// admin CLI, an operator's own SQL, another instance recording a member's cooldown), and every
// instance drops its caches when it hears it (db/cluster-listener.ts). Notifications are
// deduplicated per transaction. Writes of the hot path (balances, quotas used, last_used_at,
// success counts) send nothing: only the columns the caches read do.
const statements = [
  `create function mediagate_notify_config() returns trigger language plpgsql as $$
   begin
     perform pg_notify('mediagate_config', '');
     return null;
   end $$`,
  // Configuration tables: any change.
  ...['group_members', 'catalog_models', 'model_prices', 'capability_switches'].map(
    (table) => `create trigger ${table}_config_notify after insert or update or delete or truncate on ${table}
       for each statement execute function mediagate_notify_config()`,
  ),
  // Keys: a new key (a lookup may have cached it as unknown), a deleted one, or what auth reads.
  `create trigger api_keys_config_notify_insert_delete after insert or delete on api_keys
     for each statement execute function mediagate_notify_config()`,
  `create trigger api_keys_config_notify_update after update on api_keys
     for each row when (old.is_active is distinct from new.is_active or old.group_id is distinct from new.group_id
       or old.account_id is distinct from new.account_id or old.key_hash is distinct from new.key_hash)
     execute function mediagate_notify_config()`,
  // Accounts: suspension (auth reads the status), not balances.
  `create trigger accounts_config_notify after update on accounts
     for each row when (old.status is distinct from new.status) execute function mediagate_notify_config()`,
  // Member health: a cooldown or an open circuit begins or ends, credentials rejected or cleared.
  `create trigger member_health_config_notify_insert after insert on member_health
     for each row when (new.cooldown_until is not null or new.credentials_rejected_at is not null)
     execute function mediagate_notify_config()`,
  `create trigger member_health_config_notify_update after update on member_health
     for each row when (old.cooldown_until is distinct from new.cooldown_until
       or old.credentials_rejected_at is distinct from new.credentials_rejected_at)
     execute function mediagate_notify_config()`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
