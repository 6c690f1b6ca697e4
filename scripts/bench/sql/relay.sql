-- The durable reference relay's two statements (scripts/bench/relay-server.ts, mode `durable`):
-- one row inserted, unflushed, before the upstream call; the same row updated, flushed, after it.
--   pgbench -n -M prepared -c 1 -T 10 -r -f scripts/bench/sql/relay.sql DB
\set n random(1, 2000000000)
with t as (
  insert into pgbench_relay_tasks (id, account_id, amount, status) values ('img_' || :n || 'c' || :client_id, 'acct', 1000, 'processing') returning id
) select t.id from t cross join (select set_config('synchronous_commit', 'off', true)) c;
update pgbench_relay_tasks set status = 'completed', file = 'file_' || :n || 'c' || :client_id where id = 'img_' || :n || 'c' || :client_id;
