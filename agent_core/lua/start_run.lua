-- START_RUN: start a run (its hash, first message, indexes and start job), at most once per
-- idempotency key (a Slack trigger id), so a client retry after a lost reply starts nothing
-- twice.
-- KEYS: idempotency_key (the run hash again when there is none), run_key, history_key,
--   user_runs_key (the starter's runs zset), active_key (active-runs zset), jobs_key,
--   authors_key (who said each user message)
-- ARGV: has_idempotency ('1' when KEYS[1] is a real idempotency key), run_id, first message
--   JSON, now (score), idempotency TTL in seconds, then the run hash's field/value pairs
-- Returns: the run id: the new one, or the one the key already started.
local idem_key, run_key, history_key = KEYS[1], KEYS[2], KEYS[3]
local user_runs_key, active_key, jobs_key, authors_key = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local has_idem, run_id, first, now, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
--!include slices.lua
if (#ARGV - 5) % 2 ~= 0 or #ARGV < 7 then return redis.error_reply('START_RUN: bad arguments') end
if has_idem == '1' then
  local existing = redis.call('GET', idem_key)
  if existing then return existing end
end
if redis.call('EXISTS', run_key) == 1 then return run_id end
hset_from(run_key, ARGV, 6)
redis.call('RPUSH', history_key, first)
redis.call('HSET', authors_key, '0', redis.call('HGET', run_key, 'requested_by') or '')
redis.call('ZADD', user_runs_key, now, run_id)
redis.call('ZADD', active_key, now, run_id)
redis.call('XADD', jobs_key, '*', 'type', 'start', 'run_id', run_id)
if has_idem == '1' then
  redis.call('SET', idem_key, run_id, 'EX', tonumber(ttl))
end
return run_id
