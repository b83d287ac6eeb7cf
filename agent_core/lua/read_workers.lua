-- READ_WORKERS: the live workers' records and the clock they are compared with, read
-- together.
-- KEYS: presence_key (the deployment's presence hash)
-- ARGV: none
-- Returns: {now, field, value, field, value, …}.
local presence_key = KEYS[1]
local t = redis.call('TIME')
local out = {tostring(tonumber(t[1]) + tonumber(t[2]) / 1000000)}
local all = redis.call('HGETALL', presence_key)
for i = 1, #all do out[#out + 1] = all[i] end
return out
