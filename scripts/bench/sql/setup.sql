-- Rows for the pgbench scripts of this folder (see docs/BENCHMARKS.md, "Tenth look"), in a
-- database migrated with `npm run migrate`. Safe to run again.
insert into backend_groups (id, name) values ('grp_pgbench', 'pgbench') on conflict do nothing;
insert into accounts (id, name, balance) values ('acct_pgbench', 'pgbench', 1000000000000000) on conflict do nothing;
insert into api_keys (id, account_id, group_id, name, key_hash, key_prefix, last_four)
  values ('key_pgbench', 'acct_pgbench', 'grp_pgbench', 'pgbench', decode(repeat('00', 32), 'hex'), 'mg_pgbnc', 'none') on conflict do nothing;
-- The durable reference relay's table (scripts/bench/relay-server.ts keeps its own in its database).
create table if not exists pgbench_relay_tasks (id text primary key, account_id text not null, amount bigint not null, status text not null, file text);
