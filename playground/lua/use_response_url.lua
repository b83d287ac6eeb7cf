-- USE_RESPONSE_URL: count one use of a response URL, atomically (two concurrent posts must
-- not both get the fifth).
-- KEYS: context_key (the URL's context: JSON with the uses "left")
-- ARGV: none
-- Returns: the context as it was before this use, or false when it is unknown or used up.
local context_key = KEYS[1]
local raw = redis.call('GET', context_key)
if not raw then return false end
local data = cjson.decode(raw)
if data['left'] <= 0 then return false end
data['left'] = data['left'] - 1
redis.call('SET', context_key, cjson.encode(data), 'KEEPTTL')
return raw
