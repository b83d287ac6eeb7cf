-- read_for_model: READ_FOR_MODEL's step, shared with FINISH_TURN (which hands the history
-- over with the turn it closes). Under a current lease, in phase `model`, the messages
-- queued in the run's inbox are first moved to the history, in order, with their authors.
-- Returns {fence, lease_until, turn, phase, now (seconds, as a string)}. The history is not
-- in the reply: the caller reads it with an LRANGE sent in the same pipeline, right after
-- the script (scripts.py says why that is safe). Copied through Lua, 1,000 pairs took ~3 ms
-- of the server's time per read; a plain LRANGE of the same list ~0.1 ms.
--!include requesters.lua
local function read_for_model(run_key, history_key, authors_key, inbox_key, fence)
  local h = redis.call('HMGET', run_key, 'fence', 'lease_until', 'turn', 'phase', 'status')
  local t = redis.call('TIME')
  if h[1] == fence and tonumber(h[2] or '0') > 0 and h[4] == 'model'
    and h[5] == 'running' then
    local queued = redis.call('LRANGE', inbox_key, 0, -1)
    local by = nil
    local authors = {}
    for i = 1, #queued do queued[i] = cjson.decode(queued[i]) end  -- all read before a write
    for i = 1, #queued do
      local e = queued[i]
      local n = redis.call('RPUSH', history_key, e['message'])
      redis.call('HSET', authors_key, tostring(n - 1), e['by'])
      by = e['by']
      authors[#authors + 1] = by
    end
    if by then
      redis.call('HSET', run_key, 'last_by', by)
      add_requesters(run_key, authors_key, authors)
      redis.call('DEL', inbox_key)
    end
  end
  return {h[1] or '', h[2] or '0', h[3] or '', h[4] or '',
    t[1] .. '.' .. string.format('%06d', t[2])}
end
