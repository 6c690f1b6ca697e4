-- A synchronous image's two statements as the server sends them today (LedgerRepository.holdOne,
-- unflushed; ImageTaskRepository.completeWhole with LedgerRepository.settlement, flushed), one
-- 1024x1024 image on a key without caps. Rows: the hold writes the key, the account, a
-- credit_holds row, its ledger entry and the task; the settlement the task, the hold, a spend
-- shard, the capture's ledger entry, the file and the attempt.
--   pgbench -n -M prepared -c 1 -T 10 -r -f scripts/bench/sql/hold-settle-now.sql DB
\set n random(1, 2000000000)
with k as (
  update api_keys set credits_used = credits_used + 1000
  where id = 'key_pgbench' and (credit_limit is null or credits_used + 1000 <= credit_limit)
  returning id
), a as (
  update accounts set balance = balance - 1000
  where id = 'acct_pgbench' and balance >= 1000 and exists (select 1 from k)
  returning id
), h as (
  insert into credit_holds (id, account_id, api_key_id, task_id, amount)
  select 'hold_' || :n || 'c' || :client_id, 'acct_pgbench', 'key_pgbench', 'img_' || :n || 'c' || :client_id, 1000
  where exists (select 1 from a)
  returning id
), l as (
  insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id)
  select 'acct_pgbench', 'key_pgbench', h.id, 'hold', 1000, 'img_' || :n || 'c' || :client_id from h
  returning id
), t as (
  insert into image_tasks (id, account_id, api_key_id, group_id, operation, model, prompt, params, input_file_ids, mask_file_id, n, unit_price, quoted_credits, run_async, attempt, lease_owner, lease_expires_at, member_id, member_slots)
  select 'img_' || :n || 'c' || :client_id, 'acct_pgbench', 'key_pgbench', 'grp_pgbench', 'generation', 'bench-image', 'a lighthouse on a cliff at dusk',
    jsonb_build_object('size', '1024x1024', 'quality', 'auto', 'background', 'auto', 'moderation', 'auto', 'outputFormat', 'png',
      'responseFormat', 'b64_json', 'stream', false, 'partialImages', 0, 'resize', 'exact'),
    '{}', null, 1, 1000, 1000, false, 1, 'pgbench', now() + interval '1 minute', null, 1
  where exists (select 1 from h)
  returning *
)
select o.outcome, t.* from (
  select case
    when not exists (select 1 from k) then 'key_quota_exceeded'
    when not exists (select 1 from a) then mg_abort('insufficient_balance')
    when not exists (select 1 from t) then mg_abort('task_not_inserted')
    else 'ok'
  end as outcome
) o left join t on true cross join (select set_config('synchronous_commit', 'off', true)) c;
with t as (
  update image_tasks set status = 'completed', result_file_ids = array['file_' || :n || 'c' || :client_id], delivered = 1, actual_credits = 1000,
         revised_prompt = null, completed_at = now(), lease_owner = null, lease_expires_at = null
  where id = 'img_' || :n || 'c' || :client_id and attempt = 1 and status in ('processing')
  returning *
), h as (
  update credit_holds set status = 'captured', captured = 1000, settled_at = now()
  where task_id = (select id from t) and status = 'held' and 1000 between 0 and amount
  returning id, account_id, api_key_id, task_id, amount, captured
), k as (
  update api_keys set credits_used = credits_used - (h.amount - h.captured)
  from h where api_keys.id = h.api_key_id and h.amount > h.captured
  returning api_keys.id
), a as (
  update accounts set balance = balance + (h.amount - h.captured)
  from h where accounts.id = h.account_id and h.amount > h.captured
  returning accounts.id
), s as (
  insert into account_spend (account_id, shard, spent)
  select h.account_id, floor(random() * 16)::smallint, h.captured from h
  where h.captured > 0 and (h.amount = h.captured or exists (select 1 from a))
  on conflict (account_id, shard) do update set spent = account_spend.spent + excluded.spent
  returning account_id
), lc as (
  insert into ledger_entries (account_id, api_key_id, hold_id, kind, amount, task_id)
  select account_id, api_key_id, id, 'capture', captured, task_id from h where captured > 0
  returning id
), f as (
  insert into files (id, account_id, purpose, content_type, bytes, storage_key, width, height, task_id, expires_at, filename)
  select 'file_' || :n || 'c' || :client_id, 'acct_pgbench', 'image_output', 'image/png', 34000, 'image_output/file_' || :n || 'c' || :client_id, 1024, 1024, t.id,
    now() + coalesce((select a.output_retention_days from accounts a where a.id = 'acct_pgbench'), 30) * interval '1 day', null
  from t
), ta as (
  insert into task_attempts (task_id, step, member_id, provider, upstream_job_id, outcome, error, started_at, duration_ms)
  select t.id, 'generate', null, 'openai', null, 'ok', null, now(), 5 from t
)
select t.id, case when not (exists (select 1 from h) and exists (select 1 from s)) then mg_abort('the hold is missing') end as hold_guard from t;
