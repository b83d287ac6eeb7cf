-- RETRY_RUN: continue a run that failed retryably (its model call kept failing) from the
-- step it failed in: nothing that ran runs again, since every earlier step is recorded.
-- A sub-agent's run is retried only while its parent still waits for it: the parent's call
-- is still `child` in its turn, for this very run, and the parent has not finished. Once
-- the parent took the failure as the call's result (that happens with the failure itself)
-- the child's answer would reach nobody: the caller is told to retry the top run instead.
-- KEYS: run_key, finished_key, active_key, jobs_key, events_key, parent_key,
--   parent_turn_key (for a run without parent: run_key twice, never read)
-- ARGV: run_id, by, now, parent (the parent run id, '' for none) and parent_turn, as the
--   caller read them (a mismatch means the parent keys are not the parent's: nothing is
--   written), attempt (this call's attempt id, recorded as `retry_attempt`: a re-run of
--   the same attempt, its first reply lost, answers 'queued' again and writes nothing,
--   whatever the run did since)
-- Returns: 'queued' | 'missing' | 'not_failed' | 'not_retryable' | 'parent_moved_on' (a
--   sub-agent's run its parent no longer waits for) | 'retry' (read the parent again) as
--   status replies.
local run_key, finished_key, active_key, jobs_key, events_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local parent_key, parent_turn_key = KEYS[6], KEYS[7]
local run_id, by, nowstr, parent, parent_turn, attempt =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local r = redis.call('HMGET', run_key, 'status', 'parent', 'parent_turn', 'parent_call',
  'retry_attempt')
local st = r[1]
if not st then return {ok = 'missing'} end
if attempt ~= '' and r[5] == attempt then return {ok = 'queued'} end
if st ~= 'failed' then return {ok = 'not_failed'} end
if (r[2] or '') ~= parent or (r[2] and (r[3] or '0') ~= parent_turn) then
  return {ok = 'retry'}
end
if r[2] then
  local pst = redis.call('HGET', parent_key, 'status')
  if not r[4] or not pst or pst == 'completed' or pst == 'failed' or pst == 'cancelled'
    or redis.call('HGET', parent_turn_key, 'state:' .. r[4]) ~= 'child'
    or redis.call('HGET', parent_turn_key, 'child:' .. r[4]) ~= run_id then
    return {ok = 'parent_moved_on'}
  end
end
if redis.call('HGET', run_key, 'retryable') ~= '1' then return {ok = 'not_retryable'} end
local phase = redis.call('HGET', run_key, 'failed_phase') or 'model'
redis.call('HSET', run_key, 'status', 'queued', 'phase', phase, 'error', '',
  'retryable', '0', 'retried_by', by, 'retry_attempt', attempt, 'updated_at', nowstr)
redis.call('HINCRBY', run_key, 'retries', 1)
redis.call('ZREM', finished_key, run_id)
redis.call('ZADD', active_key, nowstr, run_id)
redis.call('XADD', jobs_key, '*', 'type', 'start', 'run_id', run_id)
local origin = redis.call('HGET', run_key, 'origin') or '{}'
redis.call('XADD', events_key, '*', 'type', 'run.retried', 'run_id', run_id, 'data',
  '{"run_id":' .. cjson.encode(run_id) .. ',"by":' .. cjson.encode(by)
  .. ',"origin":' .. origin .. '}')
return {ok = 'queued'}
