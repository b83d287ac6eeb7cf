-- RENEW_LEASE: extend the lease while the run is still the caller's (even one that ran out,
-- if no other worker took the run over: its holder was cut off from Redis, by a failover,
-- for longer).
-- KEYS: run_key
-- ARGV: fence, lease_ms
-- Returns: 1 if renewed, 0 if lost.
local run_key = KEYS[1]
local fence, lease_ms = ARGV[1], ARGV[2]
--!include clock.lua
--!include lease.lua
if not holds(run_key, fence) then return 0 end
redis.call('HSET', run_key, 'lease_until', string.format('%.6f', now() + tonumber(lease_ms) / 1000))
return 1
