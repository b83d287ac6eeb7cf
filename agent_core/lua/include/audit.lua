-- The audit trail (agent_core.audit). audit() appends one entry to a shard's audit stream:
-- kind, then gate_id, run_id, call_id, tool, args_hash (read from the gate hash when
-- gate_key is given, unless `fields` has them), by, at (the Redis clock unless given),
-- reason, more (the other `fields` as a JSON object, '' for none: every entry has the same
-- field names, which a stream stores once per node), then prev: the SHA-1 (hex) of the
-- previous entry's canonical encoding ('' before the first). An entry's encoding is its
-- id, then each field name and value in order, each written <length in bytes>:<bytes>, (a
-- netstring). The head hash keeps the last entry's `id` and `hash`: a removed, altered or
-- inserted entry breaks the chain (agent-audit verify).
local function audit(stream_key, head_key, kind, gate_key, fields)
  local f = {}
  for k, v in pairs(fields or {}) do f[k] = tostring(v) end
  local fixed = {'gate_id', 'run_id', 'call_id', 'tool', 'args_hash', 'by', 'at', 'reason'}
  if gate_key then
    local g = redis.call('HMGET', gate_key, unpack(fixed, 1, 5))
    for i = 1, 5 do
      if f[fixed[i]] == nil then f[fixed[i]] = g[i] or '' end
    end
  end
  if f['at'] == nil then
    local t = redis.call('TIME')
    f['at'] = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
  end
  local flat, known, more = {'kind', kind}, {}, {}
  for _, name in ipairs(fixed) do
    flat[#flat + 1] = name
    flat[#flat + 1] = f[name] or ''
    known[name] = true
  end
  for k in pairs(f) do
    if not known[k] then more[#more + 1] = k end
  end
  table.sort(more)
  for i, k in ipairs(more) do more[i] = cjson.encode(k) .. ':' .. cjson.encode(f[k]) end
  flat[#flat + 1] = 'more'
  flat[#flat + 1] = #more > 0 and ('{' .. table.concat(more, ',') .. '}') or ''
  flat[#flat + 1] = 'prev'
  flat[#flat + 1] = redis.call('HGET', head_key, 'hash') or ''
  local id = redis.call('XADD', stream_key, '*', unpack(flat))
  local parts = {#id .. ':' .. id .. ','}
  for _, s in ipairs(flat) do parts[#parts + 1] = #s .. ':' .. s .. ',' end
  redis.call('HSET', head_key, 'id', id, 'hash', redis.sha1hex(table.concat(parts)))
end
-- audit_opened: a gate's `opened` entry, then the approval an approver rule counted towards
-- its quorum, or the rule's decision, if any.
local function audit_opened(stream_key, head_key, gate_key, fields, decided, nowstr)
  audit(stream_key, head_key, 'opened', gate_key, {by = fields['requested_by'], at = nowstr})
  for _, a in ipairs(cjson.decode(fields['approvals'] or '[]')) do
    audit(stream_key, head_key, 'counted', gate_key, {by = a['by'], at = nowstr,
      reason = a['reason'] or ''})
  end
  if decided then
    audit(stream_key, head_key, fields['status'], gate_key, {by = fields['decided_by'],
      reason = fields['reason'] or '', at = nowstr})
  end
end
