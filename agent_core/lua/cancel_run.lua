-- CANCEL_RUN: cancel a run and every pending gate it has. Afterwards no call of the run
-- starts (claims check the status); calls of the current turn are sorted into never-ran and
-- running. A re-run of the same attempt (its first reply lost) answers 'cancelled' again
-- (invariant 11).
-- KEYS: run_key, deadlines_key, events_key, run_gates_key, finished_key, active_key,
--   turn_key (the current turn's hash), parent_key, parent_turn_key, jobs_key (as in
--   FAIL_RUN), audit_key, audit_head_key (the shard's audit trail), nudges_key (the
--   shard's), then every gate hash of the run (the members of run_gates_key, in ARGV
--   order), then parent_gate_key (as in FAIL_RUN)
-- ARGV: by, reason, run_id, turn (the current turn: guard), told (what the parent's model
--   is told; '' for a run without parent), attempt (recorded as `cancel_attempt`), then
--   the gate ids
-- Returns: {'cancelled'} (also to a re-run of the same attempt: its first reply was lost) |
--   {'finished', status} | {'missing'} | {'retry'} (a gate was opened or a turn recorded
--   since the caller looked: look again).
local run_key, deadlines_key, events_key, run_gates_key, finished_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local active_key, turn_key, parent_key, parent_turn_key, jobs_key =
  KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local audit_key, audit_head_key, nudges_key = KEYS[11], KEYS[12], KEYS[13]
local parent_gate_key = KEYS[#KEYS]
local by, reason, run_id, turn, told, attempt = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
--!include finished.lua
--!include nudges.lua
--!include close_gate.lua
--!include audit.lua
--!include report_child.lua
--!include json_list.lua
local st = redis.call('HGET', run_key, 'status')
if not st then return {'missing'} end
if finished(st) then
  if st == 'cancelled' and attempt ~= ''
    and redis.call('HGET', run_key, 'cancel_attempt') == attempt then
    return {'cancelled'}
  end
  return {'finished', st}
end
if redis.call('SCARD', run_gates_key) ~= #KEYS - 14
  or (redis.call('HGET', run_key, 'turn') or '0') ~= turn then
  return {'retry'}
end
local t = redis.call('TIME')
local nowstr = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
local origin = redis.call('HGET', run_key, 'origin') or '{}'
local never, running = {}, {}
for i = 14, #KEYS - 1 do
  local gid = ARGV[i - 7]
  local gs = redis.call('HGET', KEYS[i], 'status')
  if gs == 'pending' then
    close_gate(KEYS[i], gid, deadlines_key, nudges_key, events_key, run_id, by, reason, nowstr,
      origin, '', {})
    audit(audit_key, audit_head_key, 'closed', KEYS[i], {by = by, reason = reason, at = nowstr})
  elseif gs == 'approved' then
    local g = redis.call('HMGET', KEYS[i], 'turn', 'call_id')
    if g[1] == turn then
      local cs = redis.call('HGET', turn_key, 'state:' .. g[2])
      if cs == 'claimed' or cs == 'child' then  -- running, or its sub-agent's run is
        running[#running + 1] = gid
      elseif cs ~= 'done' then
        never[#never + 1] = gid
        audit(audit_key, audit_head_key, 'not_run', KEYS[i], {by = by, at = nowstr})
      end
    end
  end
end
redis.call('HSET', run_key, 'status', 'cancelled', 'cancelled_by', by, 'pending', 0,
  'children_pending', 0, 'phase', 'done', 'cancel_attempt', attempt, 'updated_at', nowstr)
local data = '{"run_id":' .. cjson.encode(run_id) .. ',"by":' .. cjson.encode(by)
  .. ',"reason":' .. cjson.encode(reason) .. ',"never_ran":' .. json_list(never)
  .. ',"running":' .. json_list(running) .. ',"origin":' .. origin .. '}'
redis.call('XADD', events_key, '*', 'type', 'run.cancelled', 'run_id', run_id, 'data', data)
redis.call('ZADD', finished_key, nowstr, run_id)
redis.call('ZREM', active_key, run_id)
if told ~= '' then
  report_child(run_key, parent_key, parent_turn_key, jobs_key, events_key, told, false,
    audit_key, audit_head_key, parent_gate_key)
end
return {'cancelled'}
