-- REPAIR_RUN: repair a run that nothing will advance: no live lease, no recent progress,
-- and either no pending gate while it waits for approval, or no job while it is queued or
-- running. It recounts the pending gates and enqueues a resume job (an extra job is
-- harmless).
-- KEYS: run_key, jobs_key, run_gates_key, active_key, then every gate hash of the run (the
--   members of run_gates_key, in ARGV order)
-- ARGV: stuck_after (seconds without progress before a run counts as stuck), run_id, then
--   the gate ids
-- Returns: 'repaired' | 'waiting' (gates pending: their deadlines move it) | 'busy' |
--   'recent' | 'finished' | 'retry' | 'missing' as status replies.
local run_key, jobs_key, run_gates_key, active_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local stuck_after, run_id = ARGV[1], ARGV[2]
--!include clock.lua
--!include finished.lua
local st = redis.call('HGET', run_key, 'status')
if not st then
  redis.call('ZREM', active_key, run_id)
  return {ok = 'missing'}
end
if finished(st) then
  redis.call('ZREM', active_key, run_id)
  return {ok = 'finished'}
end
local n = now()
if tonumber(redis.call('HGET', run_key, 'lease_until') or '0') > n then return {ok = 'busy'} end
if tonumber(redis.call('HGET', run_key, 'updated_at') or '0') > n - tonumber(stuck_after) then
  return {ok = 'recent'}
end
if redis.call('SCARD', run_gates_key) ~= #KEYS - 4 then return {ok = 'retry'} end
local pending = 0
for i = 5, #KEYS do
  if redis.call('HGET', KEYS[i], 'status') == 'pending' then pending = pending + 1 end
end
local nowstr = string.format('%.6f', n)
if pending == 0 and st == 'awaiting_approval'
  and tonumber(redis.call('HGET', run_key, 'children_pending') or '0') > 0 then
  return {ok = 'waiting'}  -- its sub-agents' runs report to it when they finish
end
if pending > 0 then
  -- Its gates have deadlines: the sweeper (or a decision) moves it on.
  if st ~= 'awaiting_approval'
    or tonumber(redis.call('HGET', run_key, 'pending') or '0') ~= pending then
    redis.call('HSET', run_key, 'status', 'awaiting_approval', 'pending', pending)
  end
  return {ok = 'waiting'}
end
redis.call('HSET', run_key, 'pending', pending, 'updated_at', nowstr)
redis.call('HINCRBY', run_key, 'repairs', 1)
redis.call('XADD', jobs_key, '*', 'type', 'resume', 'run_id', run_id)
return {ok = 'repaired'}
