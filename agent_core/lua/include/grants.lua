-- Grants: "allow for this thread" (agent_core.grants). A thread's grants are one hash (its
-- top run's `grants` key): grant id -> a JSON record {id, scope, agent, tool, approvers,
-- field, value (a JSON scalar, when field is set), expires_at, granted_by, self_ok, note,
-- gate_id, created_at, revoked_at, revoked_by}. grant_decides(grants_key, fields, tnow)
-- answers the gate.decided event data (without its closing brace) of a gate being opened
-- that a live grant decides, having written the decision into `fields`; nil otherwise. A
-- grant decides a call only when its granter could have approved it: the same agent, tool
-- and approver list, and the granter is none of the call's requesters (unless the grant
-- was made with self-approval allowed). It never decides a quorum's gate.
local function grant_fits(g, fields, tnow, args)
  if g['revoked_at'] or tonumber(g['expires_at']) <= tnow then return false end
  if g['agent'] ~= fields['agent'] or g['tool'] ~= fields['tool']
    or g['approvers'] ~= fields['approvers'] then
    return false
  end
  if g['self_ok'] ~= '1' then
    if g['granted_by'] == fields['requested_by'] then return false end
    for _, who in ipairs(cjson.decode(fields['requesters'] or '[]')) do
      if who == g['granted_by'] then return false end
    end
  end
  if (g['field'] or '') ~= '' then
    if args[1] == nil then
      local ok, decoded = pcall(cjson.decode, fields['args'])  -- once, and only when needed
      args[1] = ok and type(decoded) == 'table' and decoded or {}
    end
    local v = args[1][g['field']]
    if type(v) ~= 'string' and type(v) ~= 'number' and type(v) ~= 'boolean' then return false end
    return v == cjson.decode(g['value'])
  end
  return true
end

local function grant_decides(grants_key, fields, tnow)
  if fields['status'] ~= 'pending' or (fields['quorum'] or '') ~= '' then return nil end
  local best
  local args = {}  -- args[1]: the call's arguments, decoded by grant_fits when a grant needs them
  for _, raw in ipairs(redis.call('HVALS', grants_key)) do
    local g = cjson.decode(raw)
    if grant_fits(g, fields, tnow, args)
      and (not best or tonumber(g['expires_at']) > tonumber(best['expires_at'])) then
      best = g
    end
  end
  if not best then return nil end
  local by = 'grant:' .. best['id']
  local untilstr = string.format('%.6f', tonumber(best['expires_at']))
  fields['status'] = 'approved'
  fields['decided_by'] = by
  fields['reason'] = best['note']
  fields['decided_hash'] = fields['args_hash']
  fields['grant_id'] = best['id']
  fields['granted_by'] = best['granted_by']
  fields['grant_until'] = untilstr
  return '{"gate_id":' .. cjson.encode(fields['gate_id']) .. ',"run_id":'
    .. cjson.encode(fields['run_id']) .. ',"call_id":' .. cjson.encode(fields['call_id'])
    .. ',"tool":' .. cjson.encode(fields['tool']) .. ',"status":"approved","by":'
    .. cjson.encode(by) .. ',"reason":' .. cjson.encode(best['note']) .. ',"grant_id":'
    .. cjson.encode(best['id']) .. ',"granted_by":' .. cjson.encode(best['granted_by'])
    .. ',"grant_until":' .. untilstr .. ',"origin":' .. (fields['origin'] or '{}')
end
