-- Hand a finished child run's outcome (a sub-agent's answer or failure) to the parent's
-- call, announce it, and wake the parent once nothing else of its turn is pending. A no-op
-- unless that call still waits for this child, so a second report changes nothing. A
-- gated call (pgate_key: its gate hash, passed by the caller; any other key when the call
-- had no gate) gets its audit entry here, once: `executed` when the child answered,
-- `failed` when it failed or was cancelled.
-- cut(s, n): at most n bytes of s, never inside a UTF-8 character.
local function cut(s, n)
  if #s <= n then return s end
  local i = n
  while i > 0 do
    local b = string.byte(s, i + 1)
    if b < 128 or b >= 192 then break end
    i = i - 1
  end
  return string.sub(s, 1, i)
end
local function report_child(child_key, parent_key, pturn_key, pjobs, pevents, text, ok,
    audit_key, audit_head_key, pgate_key)
  local c = redis.call('HMGET', child_key, 'parent', 'parent_call', 'run_id')
  local pid, cid = c[1], c[2]
  if not pid or not cid or redis.call('HGET', pturn_key, 'state:' .. cid) ~= 'child' then
    return
  end
  redis.call('HSET', pturn_key, 'state:' .. cid, 'done', 'result:' .. cid, text)
  local call = cjson.decode(redis.call('HGET', pturn_key, 'call:' .. cid))
  local gid = redis.call('HGET', pturn_key, 'gate:' .. cid)
  local pstatus = redis.call('HGET', parent_key, 'status')
  local data = cjson.encode({run_id = pid, call_id = cid, tool = call['name'], ok = ok,
    in_doubt = false, after_cancel = pstatus == 'cancelled', output = cut(text, 3000),
    child_run = c[3]})
  data = string.sub(data, 1, -2) .. ',"gate_id":' .. (gid and cjson.encode(gid) or 'null')
    .. ',"origin":' .. (redis.call('HGET', parent_key, 'origin') or '{}') .. '}'
  redis.call('XADD', pevents, '*', 'type', 'tool.executed', 'run_id', pid, 'data', data)
  if gid and redis.call('HGET', pgate_key, 'gate_id') == gid then
    audit(audit_key, audit_head_key, ok and 'executed' or 'failed', pgate_key,
      {after_cancel = tostring(pstatus == 'cancelled'), child_run = c[3]})
  end
  -- A finished parent has no children pending (its cancel or failure set 0): never below.
  local left = tonumber(redis.call('HGET', parent_key, 'children_pending') or '0')
  if left > 0 then left = redis.call('HINCRBY', parent_key, 'children_pending', -1) end
  if left <= 0 and pstatus == 'awaiting_approval'
    and tonumber(redis.call('HGET', parent_key, 'pending') or '0') <= 0 then
    redis.call('XADD', pjobs, '*', 'type', 'resume', 'run_id', pid)
  end
end
