-- SET_RESULT_IF_NONE: a call's outcome, unless the card already has one (a cancel's "never
-- ran" must not replace the outcome the call's own tool.executed stored).
-- KEYS: card_key (the card record)
-- ARGV: ttl (seconds), then the outcome's field/value pairs
-- Returns: 1 if stored, else 0.
local card_key = KEYS[1]
local ttl = ARGV[1]
if redis.call('HEXISTS', card_key, 'result_ok') == 1 then return 0 end
redis.call('HSET', card_key, unpack(ARGV, 2))
redis.call('EXPIRE', card_key, ttl)
return 1
