-- MARK_STALE: a card whose update Slack refused because the app is out of its channel
-- (not_in_channel, channel_not_found, is_archived) is remembered with that channel, to be
-- shown again once the app is back (bot/rejoin.py). The newest marks are kept, at most `max`.
-- KEYS: stale_key (the channel's sorted set: member "<ns>:<ident>", score when marked)
-- ARGV: member, at (unix time), max (marks kept), ttl (seconds, the card records' own)
-- Returns: the number of stale cards the channel now has.
local stale_key = KEYS[1]
local member, at, max, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
redis.call('ZADD', stale_key, at, member)
local count = redis.call('ZCARD', stale_key)
if count > max then
  redis.call('ZREMRANGEBYRANK', stale_key, 0, count - max - 1)
  count = max
end
redis.call('EXPIRE', stale_key, ttl)
return count
