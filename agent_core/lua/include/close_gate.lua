-- Close a pending gate as `cancelled` (its run was cancelled or failed) and announce it;
-- its reminders and escalation are dropped (include nudges.lua before this file).
-- `extra` is more JSON for the event (',"run_failed":true') and `more` more gate fields.
local function close_gate(gate_key, gid, deadlines, nudges, events, run_id, by, reason,
    nowstr, origin, extra, more)
  redis.call('HSET', gate_key, 'status', 'cancelled', 'decided_by', by, 'reason', reason,
    'decided_at', nowstr, unpack(more))
  redis.call('ZREM', deadlines, gid)
  drop_nudges(nudges, gid)
  local g = redis.call('HMGET', gate_key, 'tool', 'call_id')
  local data = '{"gate_id":' .. cjson.encode(gid) .. ',"run_id":' .. cjson.encode(run_id)
    .. ',"call_id":' .. cjson.encode(g[2]) .. ',"tool":' .. cjson.encode(g[1])
    .. ',"status":"cancelled","by":' .. cjson.encode(by) .. ',"reason":' .. cjson.encode(reason)
    .. extra .. ',"decided_at":' .. nowstr .. ',"origin":' .. origin .. '}'
  redis.call('XADD', events, '*', 'type', 'gate.decided', 'run_id', run_id, 'data', data)
end
