-- SPAWN_CHILD: start a child run (a sub-agent) for a parent's call, once: the call moves to
-- `child` and the child run, its first message and its start job are written together.
-- Running it again finds the call in `child` and writes nothing.
-- KEYS: parent_key, parent_turn_key, child_key, child_history_key, child_authors_key,
--   active_key, jobs_key, children_key (the parent's children set)
-- ARGV: fence (the parent's), turn (guard), call_id, child_id, first message JSON, now,
--   then the child run hash's field/value pairs
-- Returns: 'spawned' | 'lost' | 'stopped' (the parent is not running at that turn) |
--   'stale' (the call is neither ready nor approved) as status replies.
local parent_key, parent_turn_key, child_key, child_history_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local child_authors_key, active_key, jobs_key, children_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local fence, turn, call_id, child_id, first, nowstr =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
--!include lease.lua
if (#ARGV - 6) % 2 ~= 0 then return redis.error_reply('SPAWN_CHILD: bad arguments') end
if not holds(parent_key, fence) then return {ok = 'lost'} end
if redis.call('HGET', parent_key, 'status') ~= 'running'
  or redis.call('HGET', parent_key, 'turn') ~= turn then
  return {ok = 'stopped'}
end
local field = 'state:' .. call_id
local s = redis.call('HGET', parent_turn_key, field)
if s == 'child' then return {ok = 'spawned'} end
if s ~= 'ready' and s ~= 'gated' then return {ok = 'stale'} end
redis.call('HSET', parent_turn_key, field, 'child', 'child:' .. call_id, child_id)
local i = 7
while i <= #ARGV do
  redis.call('HSET', child_key, ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('RPUSH', child_history_key, first)
redis.call('HSET', child_authors_key, '0', redis.call('HGET', child_key, 'requested_by') or '')
redis.call('ZADD', active_key, nowstr, child_id)
redis.call('SADD', children_key, child_id)
redis.call('HINCRBY', parent_key, 'children_pending', 1)
redis.call('XADD', jobs_key, '*', 'type', 'start', 'run_id', child_id)
return {ok = 'spawned'}
