-- Whoever spoke to the agent is a requester (invariant 10): the run's `requesters` field is
-- a JSON list, the run's starter first, then each author in the order they first wrote,
-- grown in the same step that moves their message into the history the model reads. A run
-- stored before the field existed gets it from its starter and its history's authors.
local function add_requesters(run_key, authors_key, authors)
  local raw = redis.call('HGET', run_key, 'requesters')
  local list, seen = {}, {}
  local function add(who)
    if who and who ~= '' and not seen[who] then
      seen[who] = true
      list[#list + 1] = who
    end
  end
  if raw then
    for _, who in ipairs(cjson.decode(raw)) do add(who) end
  else
    add(redis.call('HGET', run_key, 'requested_by'))
    local old = redis.call('HVALS', authors_key)
    table.sort(old)
    for _, who in ipairs(old) do add(who) end
  end
  for _, who in ipairs(authors) do add(who) end
  if #list > 0 then redis.call('HSET', run_key, 'requesters', cjson.encode(list)) end
end
