-- SETTLE_CALL: record the result of a call that will not run (declined, expired, invalid,
-- unknown tool).
-- KEYS: run_key, turn_key
-- ARGV: fence, turn (guard), call_id, result text
-- Returns: 'ok' | 'lost' | 'stopped' as status replies.
local run_key, turn_key = KEYS[1], KEYS[2]
local fence, turn, call_id, result = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
--!include lease.lua
if not holds(run_key, fence) then return {ok = 'lost'} end
if redis.call('HGET', run_key, 'status') ~= 'running'
  or redis.call('HGET', run_key, 'turn') ~= turn then
  return {ok = 'stopped'}
end
if redis.call('HGET', turn_key, 'state:' .. call_id) ~= 'done' then
  redis.call('HSET', turn_key, 'state:' .. call_id, 'done', 'result:' .. call_id, result)
end
return {ok = 'ok'}
