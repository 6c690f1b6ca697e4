import { type Kysely, sql } from 'kysely';

// Frozen in time: never edit after release; add a new migration instead.
//
// Credits (design §5). Every change to the counters on accounts/api_keys writes a ledger entry in
// the same transaction; amounts are always positive and `kind` gives the direction:
//   grant    +balance, +total_earned                   (admin top-up)
//   debit    −balance, +total_spent                    (admin adjustment / direct charge)
//   hold     −balance, +credits_used of the key        (reservation when a task is accepted)
//   capture  +total_spent                              (the part of a hold actually charged;
//                                                       balance and credits_used already moved)
//   release  +balance, −credits_used of the key        (the unused part of a hold given back)
// so the counters can be recomputed from the ledger:
//   balance      = Σgrant − Σdebit − Σhold + Σrelease            (per account)
//   total_earned = Σgrant                                         (per account)
//   total_spent  = Σdebit + Σcapture                              (per account)
//   credits_used = Σhold − Σrelease over the key's entries        (per key)
// Consistency: balance = total_earned − total_spent − outstanding holds, where outstanding =
// Σhold − Σcapture − Σrelease (held amounts not yet settled). A settled hold has
// capture + release = amount (a partial capture writes one capture and one release entry).
const statements = [
  `create table credit_holds (
     id text primary key,
     account_id text not null,
     api_key_id text not null,
     task_id text not null,
     amount bigint not null,
     status text not null default 'held',
     captured bigint not null default 0,
     created_at timestamptz not null default now(),
     settled_at timestamptz,
     constraint credit_holds_id_format check (id ~ '^hold_[0-9A-Za-z]+$' and char_length(id) <= 128),
     constraint credit_holds_account_fk foreign key (account_id) references accounts (id),
     -- Composite: the key must exist and belong to the hold's account.
     constraint credit_holds_api_key_fk foreign key (api_key_id, account_id) references api_keys (id, account_id),
     constraint credit_holds_task_id_key unique (task_id),
     constraint credit_holds_amount_positive check (amount > 0),
     constraint credit_holds_status_check check (status in ('held', 'captured', 'released')),
     constraint credit_holds_captured_range check (captured >= 0 and captured <= amount),
     constraint credit_holds_settled_at_check check ((status = 'held') = (settled_at is null)),
     -- A held or released hold has captured nothing; a captured one captured something (a zero
     -- capture is a release).
     constraint credit_holds_captured_status check (case when status = 'captured' then captured > 0 else captured = 0 end),
     constraint credit_holds_id_account_key_key unique (id, account_id, api_key_id)
   )`,
  `create index credit_holds_account_id_idx on credit_holds (account_id)`,
  `create index credit_holds_api_key_id_idx on credit_holds (api_key_id)`,
  // Operators look for old unsettled holds (every task has a deadline that settles its hold).
  `create index credit_holds_held_created_at_idx on credit_holds (created_at) where status = 'held'`,

  // A hold is settled once: after that it is frozen, and its identity never changes.
  `create function credit_holds_guard() returns trigger language plpgsql as $$
   begin
     if old.status <> 'held' then
       raise exception 'credit hold % is already %', old.id, old.status using errcode = 'P0001';
     end if;
     if new.id <> old.id or new.account_id <> old.account_id or new.api_key_id <> old.api_key_id
        or new.task_id <> old.task_id or new.amount <> old.amount or new.created_at <> old.created_at then
       raise exception 'credit hold % may only change status, captured and settled_at', old.id;
     end if;
     return new;
   end $$`,
  `create trigger credit_holds_guard before update on credit_holds
     for each row execute function credit_holds_guard()`,

  `create table ledger_entries (
     id bigserial primary key,
     account_id text not null,
     api_key_id text,
     hold_id text,
     kind text not null,
     amount bigint not null,
     task_id text,
     reason text,
     created_at timestamptz not null default now(),
     constraint ledger_entries_account_fk foreign key (account_id) references accounts (id),
     -- Composite keys (MATCH SIMPLE: skipped when api_key_id/hold_id is null) prove that the key
     -- and the hold belong to the entry's account.
     constraint ledger_entries_api_key_fk foreign key (api_key_id, account_id) references api_keys (id, account_id),
     constraint ledger_entries_hold_fk foreign key (hold_id, account_id, api_key_id)
       references credit_holds (id, account_id, api_key_id),
     constraint ledger_entries_kind_check check (kind in ('grant', 'debit', 'hold', 'capture', 'release')),
     constraint ledger_entries_amount_positive check (amount > 0),
     constraint ledger_entries_hold_kind_check check ((kind in ('hold', 'capture', 'release')) = (hold_id is not null)),
     constraint ledger_entries_hold_key_check check (hold_id is null or api_key_id is not null)
   )`,
  // "Settled exactly once": at most one hold, one capture and one release entry per hold.
  `create unique index ledger_entries_hold_kind_key on ledger_entries (hold_id, kind) where hold_id is not null`,
  `create index ledger_entries_account_id_idx on ledger_entries (account_id, id)`,
  `create index ledger_entries_api_key_id_idx on ledger_entries (api_key_id, id) where api_key_id is not null`,

  // Append-only: history is corrected with new entries, never rewritten. (Test helpers that must
  // wipe it can use a fresh database, or `set session_replication_role = replica` as superuser.)
  `create function ledger_entries_append_only() returns trigger language plpgsql as $$
   begin
     raise exception 'ledger_entries is append-only: % is not allowed', tg_op;
   end $$`,
  `create trigger ledger_entries_no_update_delete before update or delete on ledger_entries
     for each row execute function ledger_entries_append_only()`,
  `create trigger ledger_entries_no_truncate before truncate on ledger_entries
     for each statement execute function ledger_entries_append_only()`,
];

export async function up(db: Kysely<any>): Promise<void> {
  for (const statement of statements) await sql.raw(statement).execute(db);
}
