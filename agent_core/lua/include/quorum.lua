-- More than one approver (agent_core.quorum). A gate whose `quorum` field is set
-- ({"count": n, "groups": [...]}) keeps its approvals in `approvals` (a JSON list of
-- {by, at, hash, group, reason, attempt}). count_approval records one approval and answers
-- nil when it completes the quorum (the caller then decides the gate approved), else
-- {outcome, code}: {'counted', ''} (recorded, the gate stays pending; gate.approval is
-- announced; a third value, the approval's group, says it was recorded now) or
-- {'refused', why} with why = again (this person approved already) | group
-- (the decider's groups have all approved already) | not_member (in none of its groups).
-- A retry of an attempt already counted is answered {'counted', ''} again, and writes nothing.
-- `mine` is a JSON list of the quorum's groups the decider belongs to ('' for none).
local function count_approval(gate_key, run_key, events_key, gate_id, run_id, decider, attempt,
    seen, mine, reason, nowstr)
  local raw = redis.call('HGET', gate_key, 'quorum')
  if not raw or raw == '' then return nil end
  local q = cjson.decode(raw)
  local stored = cjson.decode(redis.call('HGET', gate_key, 'approvals') or '[]')
  local list = {}
  for _, a in ipairs(stored) do list[#list + 1] = a end
  local filled = {}
  for _, a in ipairs(list) do
    if a['by'] == decider then
      if attempt ~= '' and a['attempt'] == attempt then return {'counted', ''} end
      return {'refused', 'again'}
    end
    if a['group'] and a['group'] ~= '' then filled[a['group']] = true end
  end
  local groups = q['groups'] or {}
  local group = ''
  if #groups > 0 then
    local member, of = false, {}
    if mine ~= '' then
      for _, g in ipairs(cjson.decode(mine)) do of[g] = true end
    end
    for _, g in ipairs(groups) do
      if of[g] then
        member = true
        if not filled[g] then
          group = g
          break
        end
      end
    end
    if group == '' then return {'refused', member and 'group' or 'not_member'} end
    filled[group] = true
  end
  list[#list + 1] = {by = decider, at = nowstr, hash = seen, group = group, reason = reason,
    attempt = attempt}
  redis.call('HSET', gate_key, 'approvals', cjson.encode(list))
  local have, need = #list, tonumber(q['count'])
  if #groups > 0 then
    have = 0
    for _, g in ipairs(groups) do
      if filled[g] then have = have + 1 end
    end
  end
  if have >= need then return nil end
  local g = redis.call('HMGET', gate_key, 'tool', 'call_id')
  local origin = redis.call('HGET', run_key, 'origin') or '{}'
  local data = '{"gate_id":' .. cjson.encode(gate_id) .. ',"run_id":' .. cjson.encode(run_id)
    .. ',"call_id":' .. cjson.encode(g[2]) .. ',"tool":' .. cjson.encode(g[1])
    .. ',"by":' .. cjson.encode(decider) .. ',"group":' .. cjson.encode(group)
    .. ',"count":' .. have .. ',"needed":' .. need .. ',"at":' .. nowstr
    .. ',"origin":' .. origin .. '}'
  redis.call('XADD', events_key, '*', 'type', 'gate.approval', 'run_id', run_id, 'data', data)
  return {'counted', '', group}
end

-- A requester approving a call (refused unless self-approval is allowed: self_ok '1').
local function by_requester(gate_key, decider, self_ok)
  if self_ok == '1' then return false end
  if redis.call('HGET', gate_key, 'requested_by') == decider then return true end
  local raw = redis.call('HGET', gate_key, 'requesters')
  if raw and raw ~= '' then
    for _, who in ipairs(cjson.decode(raw)) do
      if who == decider then return true end
    end
  end
  return false
end
