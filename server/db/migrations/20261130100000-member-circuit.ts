import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// The circuit of a member (issue 26, item 7), shared by every instance:
// 1. failure_counted_at: when the last failure counted in consecutive_failures was recorded
//    (database clock). A failure counts only when its call started after that moment, so the calls
//    already in flight when an outage began count once together, not once each.
// 2. probe_until: once an open circuit's cooldown is over, one call (the probe) is let through,
//    claimed here by whichever instance gets there first; the others leave the member alone until
//    it ends or its lease runs out. It means something only while cooldown_reason is circuit_open.
// 3. A probe that begins or ends changes what the candidate caches hold: the update trigger of
//    config-notify also fires on probe_until.
const statements = [
  `alter table member_health add column failure_counted_at timestamptz, add column probe_until timestamptz`,
  `drop trigger member_health_config_notify_update on member_health`,
  `create trigger member_health_config_notify_update after update on member_health
     for each row when (old.cooldown_until is distinct from new.cooldown_until
       or old.credentials_rejected_at is distinct from new.credentials_rejected_at
       or old.probe_until is distinct from new.probe_until)
     execute function mediagate_notify_config()`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
