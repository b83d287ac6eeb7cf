-- RECORD_TURN: persist a model turn: the assistant message and its tool calls, or the final
-- answer; and in the same step, what follows when nothing runs in between: the turn's gates
-- opened (OPEN_GATES's step, include/open_gates.lua) when every call of the turn waits for
-- a gate (or is settled already), and the job finished (FINISH_JOB's step: acked, deleted,
-- the lease released) when the run then pauses or finishes.
-- KEYS: run_key, history_key, turn_key (the new turn's hash), events_key, finished_key,
--   active_key, inbox_key (a final answer with messages queued in it does not finish the
--   run, whose next model turn takes them), parent_key, parent_turn_key, parent_jobs_key,
--   parent_gate_key (the gate of the parent's call, or any other key when it had none: a
--   child run's final answer becomes the parent call's result and its audit entry, see
--   report_child; any keys of the shard for a run without parent), audit_key,
--   audit_head_key (the shard's audit trail), jobs_key (the stream of the job to finish),
--   deadlines_key, run_gates_key, grants_key (the thread's), nudges_key, then one gate hash
--   per gate to open, in ARGV order
-- ARGV: fence, turn (the run's current turn: guard), assistant message JSON, kind ('tools':
--   calls follow, or 'done': final answer), final text, run.completed event data JSON,
--   now, parent ('1' when the run has a parent), the job's group, the job's id ('': none
--   to finish), the number of gates to open (0: none), then per gate OPEN_GATES's 5 values,
--   then the turn hash's field/value pairs
-- Returns: {'recorded', the gates' outcome (OPEN_GATES's reply, '' when none were given),
--   '1' when the job was finished else '0', the run hash (flat list), and when the gates'
--   outcome is 'decided' (rules or grants decided every gate: the calls run next) the turn's
--   hash and its gates' hashes (flat lists)}; 0 when the run is no
--   longer running at that turn (cancelled, or a replay); 'lost' (a status reply) when the
--   lease is not the caller's. A retry after this fence recorded that turn (the first reply
--   lost, the lease perhaps released with the job) gets the same kind of reply again.
local run_key, history_key, turn_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local finished_key, active_key, inbox_key = KEYS[5], KEYS[6], KEYS[7]
local parent_key, parent_turn_key, parent_jobs_key = KEYS[8], KEYS[9], KEYS[10]
local parent_gate_key, audit_key, audit_head_key = KEYS[11], KEYS[12], KEYS[13]
local jobs_key, deadlines_key, run_gates_key, grants_key, nudges_key =
  KEYS[14], KEYS[15], KEYS[16], KEYS[17], KEYS[18]
local fence, turn, assistant, kind, final, completed, nowstr =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local has_parent, group, job_id, gates = ARGV[8], ARGV[9], ARGV[10], tonumber(ARGV[11])
--!include lease.lua
--!include steps.lua
--!include slices.lua
--!include audit.lua
--!include report_child.lua
--!include open_gates.lua
local first = 12 + (gates or 0) * 5
if not gates or #KEYS ~= 18 + gates or (#ARGV - first + 1) % 2 ~= 0
  or (kind ~= 'tools' and kind ~= 'done') or (gates > 0 and kind ~= 'tools') then
  return redis.error_reply('RECORD_TURN: bad arguments')
end
local next_turn = tostring(tonumber(turn) + 1)
local function reply(opened)
  local released = tonumber(redis.call('HGET', run_key, 'lease_until') or '0') <= 0
  local out = {'recorded', opened, (job_id ~= '' and released) and '1' or '0',
    redis.call('HGETALL', run_key)}
  if opened == 'decided' then  -- what the calls need next: not read in a step of its own
    out[5] = redis.call('HGETALL', turn_key)
    local hashes = {}
    for i = 19, #KEYS do hashes[#hashes + 1] = redis.call('HGETALL', KEYS[i]) end
    out[6] = hashes
  end
  return out
end
local current = redis.call('HGET', run_key, 'fence') == fence
if current and (step_done(run_key, fence, 'record:' .. turn)
  or (gates > 0 and step_done(run_key, fence, 'open:' .. next_turn))) then
  local opened = ''
  if gates > 0 then
    opened = (redis.call('HGET', run_key, 'status') == 'awaiting_approval') and 'ok' or 'decided'
  end
  return reply(opened)  -- a retry: this fence recorded the turn
end
if not holds(run_key, fence) then return {ok = 'lost'} end
if redis.call('HGET', run_key, 'status') ~= 'running'
  or redis.call('HGET', run_key, 'turn') ~= turn
  or redis.call('HGET', run_key, 'phase') ~= 'model' then
  return 0
end
done_step(run_key, fence, 'record:' .. turn)
redis.call('RPUSH', history_key, assistant)
redis.call('HINCRBY', run_key, 'turn', 1)
redis.call('HSET', run_key, 'updated_at', nowstr)
hset_from(turn_key, ARGV, first)
if kind == 'done' and redis.call('LLEN', inbox_key) > 0 then
  redis.call('HSET', run_key, 'phase', 'model')
elseif kind == 'done' then
  redis.call('HSET', run_key, 'status', 'completed', 'phase', 'done', 'final', final)
  local run_id = redis.call('HGET', run_key, 'run_id')
  redis.call('XADD', events_key, '*', 'type', 'run.completed', 'run_id', run_id, 'data', completed)
  redis.call('ZADD', finished_key, nowstr, run_id)
  redis.call('ZREM', active_key, run_id)
  if has_parent == '1' then
    -- parent_note: what the parent's model reads after the answer (an edited task's note)
    report_child(run_key, parent_key, parent_turn_key, parent_jobs_key, events_key,
      final .. (redis.call('HGET', run_key, 'parent_note') or ''), true, audit_key,
      audit_head_key, parent_gate_key)
  end
else
  redis.call('HSET', run_key, 'phase', 'tools')
end
local opened = ''
if gates > 0 then
  opened = open_gates(run_key, turn_key, deadlines_key, events_key, run_gates_key, grants_key,
    audit_key, audit_head_key, nudges_key, fence, next_turn, gates, 18, 11)
end
if job_id ~= '' and redis.call('HGET', run_key, 'status') ~= 'running' then
  redis.call('XACK', jobs_key, group, job_id)
  redis.call('XDEL', jobs_key, job_id)
  redis.call('HSET', run_key, 'lease_until', '0')
end
return reply(opened)
