-- hold-settle-lean.sql (the hold on the task row) for a batch of requests, shaped as
-- batch-now.sql: `:batch` requests of one key per transaction.
--   pgbench -n -M prepared -c 1 -T 5 -r -D batch=8 -f scripts/bench/sql/batch-lean.sql DB
\set n random(1, 2000000000)
with r as (
  select 'acct_pgbench' as account_id, 'key_pgbench' as api_key_id, 'img_' || :n || 'c' || :client_id || 'b' || i as task_id, 1000::bigint as amount
  from generate_series(1, :batch) i
), k as (
  update api_keys set credits_used = credits_used + (select sum(amount) from r)
  where id = 'key_pgbench' and (credit_limit is null or credits_used + (select sum(amount) from r) <= credit_limit)
  returning id
), a as (
  update accounts set balance = balance - (select sum(amount) from r)
  where id = 'acct_pgbench' and balance >= (select sum(amount) from r) and exists (select 1 from k)
  returning id
), t as (
  insert into image_tasks (id, account_id, api_key_id, group_id, operation, model, prompt, params, input_file_ids, mask_file_id, n, unit_price, quoted_credits, run_async, attempt, lease_owner, lease_expires_at, member_id, member_slots)
  select r.task_id, r.account_id, r.api_key_id, 'grp_pgbench', 'generation', 'bench-image', 'a lighthouse on a cliff at dusk',
    jsonb_build_object('size', '1024x1024', 'quality', 'auto', 'background', 'auto', 'moderation', 'auto', 'outputFormat', 'png',
      'responseFormat', 'b64_json', 'stream', false, 'partialImages', 0, 'resize', 'exact'),
    '{}', null, 1, 1000, 1000, false, 1, 'pgbench', now() + interval '1 minute', null, 1
  from r where exists (select 1 from a)
  returning *
)
select count(*) from t cross join (select set_config('synchronous_commit', 'off', true)) c;
with r as (
  select 'img_' || :n || 'c' || :client_id || 'b' || i as id, 1 as attempt, array['file_' || :n || 'c' || :client_id || 'b' || i] as file_ids,
    1000::bigint as actual_credits, null::text as revised_prompt
  from generate_series(1, :batch) i
), t as (
  update image_tasks set status = 'completed', result_file_ids = r.file_ids, delivered = cardinality(r.file_ids),
    actual_credits = r.actual_credits, revised_prompt = r.revised_prompt, completed_at = now(), lease_owner = null, lease_expires_at = null
  from r where image_tasks.id = r.id and image_tasks.attempt = r.attempt and image_tasks.status = 'processing'
  returning image_tasks.id, image_tasks.account_id, image_tasks.api_key_id, r.actual_credits, r.file_ids
), s as (
  insert into account_spend (account_id, shard, spent)
  select account_id, floor(random() * 16)::smallint, sum(actual_credits) from t group by account_id order by account_id
  on conflict (account_id, shard) do update set spent = account_spend.spent + excluded.spent
  returning account_id
), lc as (
  insert into ledger_entries (account_id, api_key_id, kind, amount, task_id)
  select account_id, api_key_id, 'debit', actual_credits, id from t
  returning id
), f as (
  insert into files (id, account_id, purpose, content_type, bytes, storage_key, width, height, task_id, expires_at, filename)
  select t.file_ids[1], t.account_id, 'image_output', 'image/png', 34000, 'image_output/' || t.file_ids[1], 1024, 1024, t.id,
    now() + coalesce((select a.output_retention_days from accounts a where a.id = t.account_id), 30) * interval '1 day', null
  from t
), ta as (
  insert into task_attempts (task_id, step, member_id, provider, upstream_job_id, outcome, error, started_at, duration_ms)
  select t.id, 'generate', null, 'openai', null, 'ok', null, now(), 5 from t
)
select count(*) from t;
