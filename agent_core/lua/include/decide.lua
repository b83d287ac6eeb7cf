-- decide(): the body of DECIDE_GATE, shared with GRANT_GATE (which decides the gate the
-- same way, then records a grant). It reads the including script's locals: gate_key, run_key,
-- deadlines_key, jobs_key, events_key, nudges_key, audit_key, audit_head_key, gate_id, wanted,
-- decider, why, attempt, run_id, seen_hash, mine, self_ok, and include/edits.lua's
-- edited_json and edited_hash; its reply is DECIDE_GATE's (see decide_gate.lua).
--!include nudges.lua
--!include audit.lua
--!include quorum.lua
--!include edits.lua
local function decide()
  local st = redis.call('HGET', gate_key, 'status')
  if not st or redis.call('HGET', gate_key, 'run_id') ~= run_id then return {'missing'} end
  if st ~= 'pending' then
    if attempt ~= '' and redis.call('HGET', gate_key, 'decided_attempt') == attempt then
      redis.call('HSET', gate_key, 'decided_attempt', attempt)
      return {'applied', redis.call('HGETALL', gate_key)}
    end
    return {'decided', redis.call('HGETALL', gate_key)}
  end
  local ahash = redis.call('HGET', gate_key, 'args_hash')
  if seen_hash ~= '' and seen_hash ~= ahash then return {'mismatch'} end
  local no_edit = edit_refused(gate_key, wanted)
  if no_edit then return {'refused', redis.call('HGETALL', gate_key), no_edit} end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local status, by, reason = wanted, decider, why
  local deadline = tonumber(redis.call('HGET', gate_key, 'deadline'))
  if status == 'expired' then
    if now < deadline then return {'not_due'} end
    by = ''
    reason = ''
  elseif now >= deadline then
    status = 'expired'
    by = ''
    reason = ''
  end
  local nowstr = string.format('%.6f', now)
  -- Requesters and quorums (include/quorum.lua): an approval may be refused, or only counted.
  if status == 'approved' then
    if by_requester(gate_key, decider, self_ok) then
      return {'refused', redis.call('HGETALL', gate_key), 'requester'}
    end
    local q = count_approval(gate_key, run_key, events_key, gate_id, run_id, decider, attempt,
      seen_hash ~= '' and seen_hash or ahash, mine, reason, nowstr)
    if q and q[3] then audit(audit_key, audit_head_key, 'counted', gate_key,
      {by = decider, reason = reason, at = nowstr, group = q[3]}) end
    if q then return {q[1], redis.call('HGETALL', gate_key), q[2]} end
  end
  local seen = ''
  if status == 'approved' or status == 'denied' then
    seen = seen_hash ~= '' and seen_hash or ahash
  end
  local edit_data
  seen, edit_data = record_edit(gate_key, status, by, seen)
  redis.call('HSET', gate_key, 'status', status, 'decided_by', by, 'reason', reason,
    'decided_at', nowstr, 'decided_hash', seen, 'decided_attempt', attempt)
  redis.call('ZREM', deadlines_key, gate_id)
  drop_nudges(nudges_key, gate_id)
  local g = redis.call('HMGET', gate_key, 'tool', 'turn', 'call_id', 'turn_gates')
  local origin = redis.call('HGET', run_key, 'origin') or '{}'
  -- turn and turn_gates: whether the turn has a message of its own to update (Approve all)
  local data = '{"gate_id":' .. cjson.encode(gate_id) .. ',"run_id":' .. cjson.encode(run_id)
    .. ',"call_id":' .. cjson.encode(g[3]) .. ',"tool":' .. cjson.encode(g[1])
    .. ',"turn":' .. (tonumber(g[2]) or 'null') .. ',"turn_gates":' .. (tonumber(g[4]) or 'null')
    .. ',"status":' .. cjson.encode(status) .. ',"by":' .. cjson.encode(by)
    .. ',"reason":' .. cjson.encode(reason) .. ',"decided_at":' .. nowstr .. edit_data
    .. ',"origin":' .. origin .. '}'
  redis.call('XADD', events_key, '*', 'type', 'gate.decided', 'run_id', run_id, 'data', data)
  local entry = {by = by, reason = reason, at = nowstr}
  if edit_data ~= '' then entry['edited_hash'] = edited_hash end  -- args_hash: the original
  audit(audit_key, audit_head_key, status, gate_key, entry)
  local pending = redis.call('HINCRBY', run_key, 'pending', -1)
  local rs = redis.call('HGET', run_key, 'status')
  -- An extra resume job is harmless (it finds nothing to do); a missing one hangs the run.
  if pending <= 0 and (rs == 'awaiting_approval' or rs == 'running')
    and tonumber(redis.call('HGET', run_key, 'children_pending') or '0') <= 0 then
    -- The turn's gates ride along: the worker reads them with its lease (ACQUIRE_LEASE).
    redis.call('XADD', jobs_key, '*', 'type', 'resume', 'run_id', run_id, 'turn', g[2],
      'gates', redis.call('HGET', run_key, 'open_gates') or '')
  end
  return {'applied', redis.call('HGETALL', gate_key)}
end
