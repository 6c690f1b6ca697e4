import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// A member whose upstream account cannot take work until its owner acts on it (issue 28: Kling's
// arrears and exhausted resource packs, Ark's overdue accounts): account_disabled_at and the
// upstream's reason. Like rejected credentials, the pool leaves the member out until an admin
// changes it; a change of it notifies the other instances' caches.
const statements: string[] = [
  `alter table member_health add column account_disabled_at timestamptz, add column account_disabled_reason text`,
  `drop trigger member_health_config_notify_update on member_health`,
  `create trigger member_health_config_notify_update after update on member_health
     for each row when (old.cooldown_until is distinct from new.cooldown_until
       or old.credentials_rejected_at is distinct from new.credentials_rejected_at
       or old.probe_until is distinct from new.probe_until
       or old.account_disabled_at is distinct from new.account_disabled_at)
     execute function mediagate_notify_config()`,
  `drop trigger member_health_config_notify_insert on member_health`,
  `create trigger member_health_config_notify_insert after insert on member_health
     for each row when (new.cooldown_until is not null or new.credentials_rejected_at is not null or new.account_disabled_at is not null)
     execute function mediagate_notify_config()`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
