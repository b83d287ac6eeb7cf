-- RELEASE_LEASE: give the lease back (only its holder can).
-- KEYS: run_key
-- ARGV: fence
-- Returns: 1 if released, else 0.
local run_key = KEYS[1]
local fence = ARGV[1]
if redis.call('HGET', run_key, 'fence') ~= fence then return 0 end
redis.call('HSET', run_key, 'lease_until', '0')
return 1
