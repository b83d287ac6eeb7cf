-- COMPLETE_CALL: record the result of a claimed call and announce it. Allowed after a
-- cancel (the call was already running: its card says it finished after the cancel), never
-- without the lease.
-- KEYS: run_key, turn_key, events_key, audit_key, audit_head_key (the shard's audit
--   trail), gate_key (a gated call's gate; absent for a call without gate)
-- ARGV: fence, call_id, result text, tool.executed event data JSON without its closing
--   brace (after_cancel is appended), outcome (a gated call's audit entry: executed |
--   failed | in_doubt; recorded once, with the result)
-- Returns: 'ok' | 'lost' | 'stale' (the call is not `claimed`: nothing written) as status
--   replies.
local run_key, turn_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local audit_key, audit_head_key, gate_key = KEYS[4], KEYS[5], KEYS[6]
local fence, call_id, result, event, outcome = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
--!include lease.lua
--!include audit.lua
if not holds(run_key, fence) then return {ok = 'lost'} end
if redis.call('HGET', turn_key, 'state:' .. call_id) ~= 'claimed' then return {ok = 'stale'} end
local rs = redis.call('HGET', run_key, 'status')
redis.call('HSET', turn_key, 'state:' .. call_id, 'done', 'result:' .. call_id, result)
local after = (rs == 'cancelled') and 'true' or 'false'
redis.call('XADD', events_key, '*', 'type', 'tool.executed',
  'run_id', redis.call('HGET', run_key, 'run_id'),
  'data', event .. ',"after_cancel":' .. after .. '}')
if gate_key then audit(audit_key, audit_head_key, outcome, gate_key, {after_cancel = after}) end
return {ok = 'ok'}
