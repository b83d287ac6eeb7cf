-- RELEASE_AFTER_WRITES: write the fields a lock's holder left for its release, then release
-- the lock if it is still the holder's. The writes happen either way: they record what the
-- holder did.
-- KEYS: lock_key, then the hashes written
-- ARGV: token, ttl (seconds, of the hashes written), then per hash: its number of fields
--   n, then n field/value pairs
-- Returns: 1 if released, else 0.
--!include lock_guard.lua
local lock_key = KEYS[1]
local token, ttl = ARGV[1], ARGV[2]
local a = 3
for i = 2, #KEYS do
  local n = tonumber(ARGV[a])
  if n > 0 then
    redis.call('HSET', KEYS[i], unpack(ARGV, a + 1, a + 2 * n))
    redis.call('EXPIRE', KEYS[i], ttl)
  end
  a = a + 1 + 2 * n
end
return release_if_held(lock_key, token)
