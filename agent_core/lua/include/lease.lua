-- The lease guard (fencing, invariant 8). A run's lease is kept in its hash as `fence` (a
-- counter bumped at every acquisition: the fencing token) and `lease_until` (Redis clock;
-- 0 once released). holds(run_key, fence): the run is still the caller's. A lease that ran
-- out but was not taken over is still its holder's (a worker cut off by a failover for
-- longer than its lease carries on).
local function holds(run_key, fence)
  local h = redis.call('HMGET', run_key, 'fence', 'lease_until')
  return h[1] == fence and tonumber(h[2] or '0') > 0
end
