-- open_gates: OPEN_GATES's step (see open_gates.lua), shared with RECORD_TURN, which opens
-- a turn's gates in the step that records the turn. The caller checked the lease. The n
-- gates' hashes are KEYS[kfirst + 1 .. kfirst + n]; their 5 values each (gate id, timeout,
-- fields JSON, gate.opened data, gate.decided data or '') are ARGV[afirst + 1 ..]. Records
-- the run's `open_gates` (the gate ids, space-separated: DECIDE_GATE puts them in the
-- resume job, whose worker reads them with the lease). Returns 'ok' (paused) | 'decided'
-- (no gate left to a person) | 'stopped' | 'stale'.
--!include clock.lua
--!include steps.lua
--!include nudges.lua
--!include audit.lua
--!include grants.lua
local function open_gates(run_key, turn_key, deadlines_key, events_key, run_gates_key,
    grants_key, audit_key, audit_head_key, nudges_key, fence, turn, n, kfirst, afirst)
  if step_done(run_key, fence, 'open:' .. turn) then
    -- Paused (awaiting approval) unless every gate was decided by a rule.
    local st = redis.call('HGET', run_key, 'status')
    return (st == 'awaiting_approval') and 'ok' or 'decided'
  end
  if redis.call('HGET', run_key, 'status') ~= 'running'
    or redis.call('HGET', run_key, 'turn') ~= turn then
    return 'stopped'
  end
  local all = {}
  for i = 1, n do
    local base = afirst + (i - 1) * 5
    local fields = cjson.decode(ARGV[base + 3])
    if redis.call('EXISTS', KEYS[kfirst + i]) == 1
      or redis.call('HGET', turn_key, 'state:' .. fields['call_id']) ~= 'needs_gate' then
      return 'stale'
    end
    all[i] = fields
  end
  local tnow = now()
  local nowstr = string.format('%.6f', tnow)
  local run_id = redis.call('HGET', run_key, 'run_id')
  local pending = 0
  local ids = {}
  done_step(run_key, fence, 'open:' .. turn)
  for i = 1, n do
    local base = afirst + (i - 1) * 5
    local gate_key = KEYS[kfirst + i]
    local gid = ARGV[base + 1]
    local fields = all[i]
    local decided_data = ARGV[base + 5]
    if decided_data == '' then decided_data = grant_decides(grants_key, fields, tnow) or '' end
    local decided = decided_data ~= ''
    local deadline = string.format('%.6f', tnow + tonumber(ARGV[base + 2]))
    local flat = {'created_at', nowstr, 'deadline', deadline}
    if decided then
      flat[#flat + 1] = 'decided_at'
      flat[#flat + 1] = nowstr
    end
    for k, v in pairs(fields) do
      flat[#flat + 1] = k
      flat[#flat + 1] = v
    end
    redis.call('HSET', gate_key, unpack(flat))
    if not decided then
      redis.call('ZADD', deadlines_key, deadline, gid)
      schedule_nudges(gate_key, nudges_key, gid, tnow, fields, tonumber(ARGV[base + 2]))
      pending = pending + 1
    end
    ids[#ids + 1] = gid
    audit_opened(audit_key, audit_head_key, gate_key, fields, decided, nowstr)
    redis.call('SADD', run_gates_key, gid)
    redis.call('HSET', turn_key, 'state:' .. fields['call_id'], 'gated',
      'gate:' .. fields['call_id'], gid)
    redis.call('XADD', events_key, '*', 'type', 'gate.opened', 'run_id', run_id, 'data',
      ARGV[base + 4] .. ',"created_at":' .. nowstr .. ',"deadline":' .. deadline .. '}')
    if decided then
      redis.call('XADD', events_key, '*', 'type', 'gate.decided', 'run_id', run_id, 'data',
        decided_data .. ',"decided_at":' .. nowstr .. '}')
    end
  end
  redis.call('HSET', run_key, 'open_gates', table.concat(ids, ' '))
  if pending == 0 then
    redis.call('HSET', run_key, 'updated_at', nowstr)
    return 'decided'
  end
  redis.call('HSET', run_key, 'status', 'awaiting_approval', 'pending', pending,
    'updated_at', nowstr)
  return 'ok'
end
