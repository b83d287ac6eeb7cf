-- NEXT_TS: a message ts from Redis' clock, in Slack's format ("1764600000.000100"), strictly
-- increasing even when two arrive in the same microsecond.
-- KEYS: last_ts_key (the last ts handed out, in microseconds)
-- ARGV: none
-- Returns: the ts.
local last_ts_key = KEYS[1]
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', last_ts_key) or '0')
if us <= last then us = last + 1 end
redis.call('SET', last_ts_key, string.format('%d', us))
return string.format('%d.%06d', math.floor(us / 1000000), us % 1000000)
