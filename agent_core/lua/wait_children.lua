-- WAIT_CHILDREN: pause a parent whose turn waits for child runs; or tell it to go on when
-- they all reported meanwhile (each report settled its call in the turn hash). The turn's
-- calls still in `child` are what it waits for: with none, it goes on (and a stale count is
-- reset); with some but none counted pending, they are orphans of a failure whose cancel
-- cascade a crash cut short before the run was continued (FAIL_RUN counts none pending):
-- the caller cancels their child runs (Stopper.cancel_orphans), which settles the calls.
-- KEYS: run_key (the parent's), turn_key
-- ARGV: fence, turn (guard), now
-- Returns: 'waiting' | 'go' | 'orphaned' | 'lost' | 'stopped' as status replies.
local run_key, turn_key = KEYS[1], KEYS[2]
local fence, turn, nowstr = ARGV[1], ARGV[2], ARGV[3]
--!include lease.lua
if not holds(run_key, fence) then return {ok = 'lost'} end
if redis.call('HGET', run_key, 'status') ~= 'running'
  or redis.call('HGET', run_key, 'turn') ~= turn then
  return {ok = 'stopped'}
end
local open = 0
for _, cid in ipairs(cjson.decode(redis.call('HGET', turn_key, 'order') or '[]')) do
  if redis.call('HGET', turn_key, 'state:' .. cid) == 'child' then open = open + 1 end
end
local counted = tonumber(redis.call('HGET', run_key, 'children_pending') or '0')
if open == 0 then
  if counted ~= 0 then redis.call('HSET', run_key, 'children_pending', 0) end
  return {ok = 'go'}
end
if counted <= 0 then return {ok = 'orphaned'} end
redis.call('HSET', run_key, 'status', 'awaiting_approval', 'updated_at', nowstr)
return {ok = 'waiting'}
