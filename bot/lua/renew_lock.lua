-- RENEW_LOCK: renew a lock only if this process still holds it.
-- KEYS: lock_key
-- ARGV: token, ttl_ms
-- Returns: 1 if renewed, else 0.
local lock_key = KEYS[1]
local token, ttl_ms = ARGV[1], ARGV[2]
if redis.call('GET', lock_key) == token then
  return redis.call('PEXPIRE', lock_key, ttl_ms)
end
return 0
