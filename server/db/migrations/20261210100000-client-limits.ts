import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// A client's own limits (issue 32, item 1): requests per minute and generations in flight, per API
// key and per account.
// 1. api_keys and accounts get requests_per_minute and max_in_flight: NULL follows the operator's
//    default (DEFAULT_KEY_RPM, DEFAULT_ACCOUNT_MAX_IN_FLIGHT, …), 0 is no limit at all (the admin
//    API's `null`), N is the limit.
// 2. The config-notify triggers of both tables also fire when a limit changes: the auth cache of
//    every instance holds them (the old triggers are replaced, not edited).
// 3. Generations in flight are counted from the task rows themselves, as a member's slots are
//    (routing.repository.ts): queued and in_progress video tasks, processing image tasks
//    (synchronous or in the background). Nothing to keep in step, nothing a crash can leak. The
//    in_flight indexes hold only those rows, by account and key.
// 4. mg_in_flight_gate() is called by the credit hold statement (LedgerRepository.holdAndInsertTask)
//    when a cap applies: it serializes the creators of one key (then of one account) with a
//    transaction advisory lock, held until that statement commits its task, and counts what is in
//    flight. Being VOLATILE, each of its queries takes a fresh snapshot after the lock was granted,
//    so it sees the task the previous holder of the lock committed: no race lets N+1 in. Lock
//    order: the key's, then the account's, before the hold statement's row locks.
const statements: string[] = [
  `alter table api_keys
     add column requests_per_minute integer constraint api_keys_requests_per_minute_check check (requests_per_minute between 0 and 1000000),
     add column max_in_flight integer constraint api_keys_max_in_flight_check check (max_in_flight between 0 and 100000)`,
  `alter table accounts
     add column requests_per_minute integer constraint accounts_requests_per_minute_check check (requests_per_minute between 0 and 1000000),
     add column max_in_flight integer constraint accounts_max_in_flight_check check (max_in_flight between 0 and 100000)`,

  `drop trigger api_keys_config_notify_update on api_keys`,
  `create trigger api_keys_config_notify_update after update on api_keys
     for each row when (old.is_active is distinct from new.is_active or old.group_id is distinct from new.group_id
       or old.account_id is distinct from new.account_id or old.key_hash is distinct from new.key_hash
       or old.requests_per_minute is distinct from new.requests_per_minute or old.max_in_flight is distinct from new.max_in_flight)
     execute function mediagate_notify_config()`,
  `drop trigger accounts_config_notify on accounts`,
  `create trigger accounts_config_notify after update on accounts
     for each row when (old.status is distinct from new.status
       or old.requests_per_minute is distinct from new.requests_per_minute or old.max_in_flight is distinct from new.max_in_flight)
     execute function mediagate_notify_config()`,

  `create index video_tasks_in_flight_idx on video_tasks (account_id, api_key_id) where status in ('queued', 'in_progress')`,
  `create index image_tasks_in_flight_idx on image_tasks (account_id, api_key_id) where status = 'processing'`,

  // Returns 'ok', 'key_too_many_in_flight' or 'account_too_many_in_flight'. A NULL cap is not
  // checked (and its lock not taken). Counting stops at the cap: the cost is bounded by it.
  `create function mg_in_flight_gate(p_account_id text, p_api_key_id text, p_key_max integer, p_account_max integer)
   returns text language plpgsql volatile as $$
   declare
     n bigint;
   begin
     if p_key_max is not null then
       perform pg_advisory_xact_lock(hashtextextended('mediagate-in-flight:' || p_api_key_id, 0));
       select (select count(*) from (select 1 from video_tasks
                 where account_id = p_account_id and api_key_id = p_api_key_id and status in ('queued', 'in_progress') limit p_key_max) v)
            + (select count(*) from (select 1 from image_tasks
                 where account_id = p_account_id and api_key_id = p_api_key_id and status = 'processing' limit p_key_max) i)
         into n;
       if n >= p_key_max then
         return 'key_too_many_in_flight';
       end if;
     end if;
     if p_account_max is not null then
       perform pg_advisory_xact_lock(hashtextextended('mediagate-in-flight:' || p_account_id, 0));
       select (select count(*) from (select 1 from video_tasks
                 where account_id = p_account_id and status in ('queued', 'in_progress') limit p_account_max) v)
            + (select count(*) from (select 1 from image_tasks
                 where account_id = p_account_id and status = 'processing' limit p_account_max) i)
         into n;
       if n >= p_account_max then
         return 'account_too_many_in_flight';
       end if;
     end if;
     return 'ok';
   end $$`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
