-- LOCK_AND_READ: take a lock and read hashes in the same round trip (their keys in the
-- lock's shard), having first written fields into the first of them when asked (written
-- whether or not the lock is free: what is written is the caller's record, not the lock's).
-- A retry after the lock was taken with this token (the first reply lost) finds it its own.
-- KEYS: lock_key, then the hashes to read
-- ARGV: token, ttl_ms (the lock's TTL), write_ttl (seconds the written hash then lives; ''
--   when nothing is written), then the field/value pairs written into KEYS[2]
-- Returns: 0 when another holder has the lock, else {1, each hash as a flat list}.
local lock_key = KEYS[1]
local token, ttl_ms, write_ttl = ARGV[1], ARGV[2], ARGV[3]
if write_ttl ~= '' and #ARGV > 3 then
  redis.call('HSET', KEYS[2], unpack(ARGV, 4))
  redis.call('EXPIRE', KEYS[2], write_ttl)
end
if redis.call('GET', lock_key) == token then
  redis.call('PEXPIRE', lock_key, ttl_ms)
elseif not redis.call('SET', lock_key, token, 'NX', 'PX', ttl_ms) then
  return 0
end
local out = {1}
for i = 2, #KEYS do out[i] = redis.call('HGETALL', KEYS[i]) end
return out
