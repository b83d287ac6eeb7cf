-- RECORD_TURN: persist a model turn: the assistant message and its tool calls, or the final
-- answer.
-- KEYS: run_key, history_key, turn_key (the new turn's hash), events_key, finished_key,
--   active_key, inbox_key (optional: a final answer with messages queued in it does not
--   finish the run, whose next model turn takes them), parent_key, parent_turn_key,
--   parent_jobs_key, parent_gate_key (the gate of the parent's call, or any other key when
--   it had none), audit_key, audit_head_key (the shard's audit trail) (optional: a child
--   run's final answer becomes the parent call's result and its audit entry, see
--   report_child)
-- ARGV: fence, turn (the run's current turn: guard), assistant message JSON, kind ('tools':
--   calls follow, or 'done': final answer), final text, run.completed event data JSON,
--   now, then the turn hash's field/value pairs
-- Returns: the run hash (flat list); 0 when the run is no longer running at that turn
--   (cancelled, or a replay); 'lost' (a status reply) when the lease is not the caller's.
--   A retry after this fence recorded that turn (the first reply lost) gets the run hash
--   again.
local run_key, history_key, turn_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local finished_key, active_key, inbox_key = KEYS[5], KEYS[6], KEYS[7]
local parent_key, parent_turn_key, parent_jobs_key = KEYS[8], KEYS[9], KEYS[10]
local parent_gate_key, audit_key, audit_head_key = KEYS[11], KEYS[12], KEYS[13]
local fence, turn, assistant, kind, final, completed, nowstr =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
--!include lease.lua
--!include steps.lua
--!include slices.lua
--!include audit.lua
--!include report_child.lua
if (#ARGV - 7) % 2 ~= 0 or (kind ~= 'tools' and kind ~= 'done') then
  return redis.error_reply('RECORD_TURN: bad arguments')
end
if not holds(run_key, fence) then return {ok = 'lost'} end
if redis.call('HGET', run_key, 'status') ~= 'running'
  or redis.call('HGET', run_key, 'turn') ~= turn
  or redis.call('HGET', run_key, 'phase') ~= 'model' then
  if step_done(run_key, fence, 'record:' .. turn) then return redis.call('HGETALL', run_key) end
  return 0
end
done_step(run_key, fence, 'record:' .. turn)
redis.call('RPUSH', history_key, assistant)
redis.call('HINCRBY', run_key, 'turn', 1)
redis.call('HSET', run_key, 'updated_at', nowstr)
hset_from(turn_key, ARGV, 8)
if kind == 'done' and inbox_key and redis.call('LLEN', inbox_key) > 0 then
  redis.call('HSET', run_key, 'phase', 'model')
elseif kind == 'done' then
  redis.call('HSET', run_key, 'status', 'completed', 'phase', 'done', 'final', final)
  local run_id = redis.call('HGET', run_key, 'run_id')
  redis.call('XADD', events_key, '*', 'type', 'run.completed', 'run_id', run_id, 'data', completed)
  redis.call('ZADD', finished_key, nowstr, run_id)
  redis.call('ZREM', active_key, run_id)
  if parent_jobs_key then
    -- parent_note: what the parent's model reads after the answer (an edited task's note)
    report_child(run_key, parent_key, parent_turn_key, parent_jobs_key, events_key,
      final .. (redis.call('HGET', run_key, 'parent_note') or ''), true, audit_key,
      audit_head_key, parent_gate_key)
  end
else
  redis.call('HSET', run_key, 'phase', 'tools')
end
return redis.call('HGETALL', run_key)
