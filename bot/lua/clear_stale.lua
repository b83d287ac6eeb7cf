-- CLEAR_STALE: forget the stale marks of cards shown again, each only if it was not marked
-- again meanwhile (its score is still the one read before showing it).
-- KEYS: stale_key (the channel's sorted set of stale cards)
-- ARGV: member, score pairs (as read with ZRANGE WITHSCORES)
-- Returns: the number of marks removed.
local stale_key = KEYS[1]
local removed = 0
for i = 1, #ARGV - 1, 2 do
  local member, score = ARGV[i], ARGV[i + 1]
  local now = redis.call('ZSCORE', stale_key, member)
  if now and tonumber(now) == tonumber(score) then
    removed = removed + redis.call('ZREM', stale_key, member)
  end
end
return removed
