-- SETTLE_CALL: record the result of a call that will not run (declined, expired, invalid,
-- unknown tool).
-- KEYS: run_key, turn_key, then for an approved call that will not run (its arguments
--   changed) audit_key, audit_head_key (the shard's audit trail) and its gate_key: its
--   `not_run` audit entry
-- ARGV: fence, turn (guard), call_id, result text
-- Returns: 'ok' | 'lost' | 'stopped' as status replies.
local run_key, turn_key = KEYS[1], KEYS[2]
local audit_key, audit_head_key, gate_key = KEYS[3], KEYS[4], KEYS[5]
local fence, turn, call_id, result = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
--!include lease.lua
--!include audit.lua
if not holds(run_key, fence) then return {ok = 'lost'} end
if redis.call('HGET', run_key, 'status') ~= 'running'
  or redis.call('HGET', run_key, 'turn') ~= turn then
  return {ok = 'stopped'}
end
if redis.call('HGET', turn_key, 'state:' .. call_id) ~= 'done' then
  redis.call('HSET', turn_key, 'state:' .. call_id, 'done', 'result:' .. call_id, result)
  if gate_key then audit(audit_key, audit_head_key, 'not_run', gate_key, {}) end
end
return {ok = 'ok'}
