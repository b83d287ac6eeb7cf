"""Lua scripts: every state transition that must be atomic.

Each script names its KEYS and ARGV in a header comment. Every key arrives in KEYS (built by
:mod:`agent_core.keys`); none is built inside Lua. Every script is safe to run twice (redis-py
retries a command after a connection error): the second run finds the state already moved and
changes nothing.
"""

from __future__ import annotations

# Move a gate out of `pending`, exactly once.
# KEYS[1] gate hash, KEYS[2] run hash, KEYS[3] deadlines zset, KEYS[4] jobs stream,
# KEYS[5] events stream
# ARGV[1] gate id, ARGV[2] approved|denied|expired, ARGV[3] decided by, ARGV[4] reason,
# ARGV[5] events MAXLEN, ARGV[6] run id (must match the gate's)
# Returns {outcome, gate hash as a flat list}; outcome is applied | decided (someone else
# was first) | missing | not_due (expiry asked too early); the last two carry no hash.
# A person's decision that arrives after the deadline becomes `expired`: the card said so.
DECIDE_GATE = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st or redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[6] then return {'missing'} end
if st ~= 'pending' then
  return {'decided', redis.call('HGETALL', KEYS[1])}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local status, by, reason = ARGV[2], ARGV[3], ARGV[4]
local deadline = tonumber(redis.call('HGET', KEYS[1], 'deadline'))
if status == 'expired' then
  if now < deadline then return {'not_due'} end
  by = ''
  reason = ''
elseif now >= deadline then
  status = 'expired'
  by = ''
  reason = ''
end
local nowstr = string.format('%.6f', now)
redis.call('HSET', KEYS[1], 'status', status, 'decided_by', by, 'reason', reason,
  'decided_at', nowstr)
redis.call('ZREM', KEYS[3], ARGV[1])
local g = redis.call('HMGET', KEYS[1], 'tool', 'turn', 'call_id')
local origin = redis.call('HGET', KEYS[2], 'origin') or '{}'
local data = '{"gate_id":' .. cjson.encode(ARGV[1]) .. ',"run_id":' .. cjson.encode(ARGV[6])
  .. ',"call_id":' .. cjson.encode(g[3]) .. ',"tool":' .. cjson.encode(g[1])
  .. ',"status":' .. cjson.encode(status) .. ',"by":' .. cjson.encode(by)
  .. ',"reason":' .. cjson.encode(reason) .. ',"decided_at":' .. nowstr
  .. ',"origin":' .. origin .. '}'
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[5], '*', 'type', 'gate.decided',
  'run_id', ARGV[6], 'data', data)
local pending = redis.call('HINCRBY', KEYS[2], 'pending', -1)
if pending <= 0 and redis.call('HGET', KEYS[2], 'status') == 'awaiting_approval' then
  redis.call('XADD', KEYS[4], '*', 'type', 'resume', 'run_id', ARGV[6], 'turn', g[2])
end
return {'applied', redis.call('HGETALL', KEYS[1])}
"""

# Persist a model turn: the assistant message and its tool calls, or the final answer.
# KEYS[1] run hash, KEYS[2] history list, KEYS[3] the new turn's hash, KEYS[4] events stream,
# KEYS[5] finished-runs zset
# ARGV[1] the run's current turn (guard), ARGV[2] assistant message JSON,
# ARGV[3] 'tools' (calls follow) or 'done' (final answer), ARGV[4] final text,
# ARGV[5] events MAXLEN, ARGV[6] run.completed event data JSON, ARGV[7] now,
# ARGV[8..] field, value pairs for the turn hash
# Returns the run hash (flat list), or 0 when the run is no longer running at that turn
# (cancelled, or a replay).
RECORD_TURN = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'turn') ~= ARGV[1]
  or redis.call('HGET', KEYS[1], 'phase') ~= 'model' then
  return 0
end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'turn', 1)
redis.call('HSET', KEYS[1], 'updated_at', ARGV[7])
if #ARGV > 7 then
  redis.call('HSET', KEYS[3], unpack(ARGV, 8))
end
if ARGV[3] == 'done' then
  redis.call('HSET', KEYS[1], 'status', 'completed', 'phase', 'done', 'final', ARGV[4])
  local run_id = redis.call('HGET', KEYS[1], 'run_id')
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'type', 'run.completed',
    'run_id', run_id, 'data', ARGV[6])
  redis.call('ZADD', KEYS[5], ARGV[7], run_id)
else
  redis.call('HSET', KEYS[1], 'phase', 'tools')
end
return redis.call('HGETALL', KEYS[1])
"""

# Claim a tool call for execution (at most once unless the tool is idempotent).
# KEYS[1] turn hash
# ARGV[1] call id, ARGV[2] '1' when a `claimed` call may be claimed again (idempotent tool)
# Returns {'ok'|'no', previous state}.
CLAIM_CALL = """
local field = 'state:' .. ARGV[1]
local s = redis.call('HGET', KEYS[1], field)
if s == 'ready' or s == 'gated' or (s == 'claimed' and ARGV[2] == '1') then
  redis.call('HSET', KEYS[1], field, 'claimed')
  return {'ok', s}
end
return {'no', s or ''}
"""

# Open the gates of a turn and pause the run. Deadlines are taken on the Redis clock, the
# same clock DECIDE_GATE compares them with.
# KEYS[1] run hash, KEYS[2] turn hash, KEYS[3] deadlines zset, KEYS[4] events stream,
# KEYS[5] run gates set, KEYS[6..] one gate hash per gate, in ARGV order
# ARGV[1] turn (guard), ARGV[2] events MAXLEN,
# then per gate 4 values: gate id, timeout in seconds, gate fields (flat JSON object of
# strings), gate.opened event data JSON without its closing brace (created_at and deadline
# are appended here)
# Returns 1, or 0 when the run is not running at that turn (cancelled, or a replay).
OPEN_GATES = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'turn') ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local nowstr = string.format('%.6f', now)
local run_id = redis.call('HGET', KEYS[1], 'run_id')
local n = (#ARGV - 2) / 4
for i = 1, n do
  local base = 2 + (i - 1) * 4
  local gid = ARGV[base + 1]
  local deadline = string.format('%.6f', now + tonumber(ARGV[base + 2]))
  local fields = cjson.decode(ARGV[base + 3])
  local flat = {'created_at', nowstr, 'deadline', deadline}
  for k, v in pairs(fields) do
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
  redis.call('HSET', KEYS[5 + i], unpack(flat))
  redis.call('ZADD', KEYS[3], deadline, gid)
  redis.call('SADD', KEYS[5], gid)
  redis.call('HSET', KEYS[2], 'state:' .. fields['call_id'], 'gated', 'gate:' .. fields['call_id'], gid)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*', 'type', 'gate.opened',
    'run_id', run_id, 'data',
    ARGV[base + 4] .. ',"created_at":' .. nowstr .. ',"deadline":' .. deadline .. '}')
end
redis.call('HSET', KEYS[1], 'status', 'awaiting_approval', 'pending', n, 'updated_at', nowstr)
return 1
"""

# Close a turn: append the tool messages in call order and hand back to the model.
# KEYS[1] run hash, KEYS[2] history list
# ARGV[1] turn (guard), ARGV[2] now, ARGV[3..] tool messages JSON
# Returns the run hash (flat list), or 0 when the run is not running at that turn in
# phase `tools`.
FINISH_TURN = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'turn') ~= ARGV[1]
  or redis.call('HGET', KEYS[1], 'phase') ~= 'tools' then
  return 0
end
if #ARGV > 2 then
  redis.call('RPUSH', KEYS[2], unpack(ARGV, 3))
end
redis.call('HSET', KEYS[1], 'phase', 'model', 'updated_at', ARGV[2])
return redis.call('HGETALL', KEYS[1])
"""

# Take a run to `running` when a job for it starts.
# KEYS[1] run hash, KEYS[2] events stream
# ARGV[1] events MAXLEN, ARGV[2] agent name, ARGV[3] now
# Returns {status after the call, run hash as a flat list}: running, awaiting_approval
# (gates still pending) or the finished status; {''} when the run does not exist.
BEGIN_RUN = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {''} end
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'updated_at', ARGV[3])
  local r = redis.call('HMGET', KEYS[1], 'run_id', 'task', 'requested_by', 'origin')
  local data = '{"run_id":' .. cjson.encode(r[1]) .. ',"agent":' .. cjson.encode(ARGV[2])
    .. ',"task":' .. cjson.encode(r[2]) .. ',"requested_by":' .. cjson.encode(r[3])
    .. ',"origin":' .. (r[4] or '{}') .. '}'
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'type', 'run.started',
    'run_id', r[1], 'data', data)
  st = 'running'
elseif st == 'awaiting_approval' then
  if tonumber(redis.call('HGET', KEYS[1], 'pending') or '0') > 0 then
    return {st}
  end
  redis.call('HSET', KEYS[1], 'status', 'running', 'updated_at', ARGV[3])
  st = 'running'
end
return {st, redis.call('HGETALL', KEYS[1])}
"""

# Fail a run that is not finished yet.
# KEYS[1] run hash, KEYS[2] events stream, KEYS[3] finished-runs zset
# ARGV[1] error text, ARGV[2] events MAXLEN, ARGV[3] run.failed event data JSON, ARGV[4] now
# Returns 1 when the run moved to `failed`, 0 otherwise.
FAIL_RUN = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st or st == 'completed' or st == 'failed' or st == 'cancelled' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'failed', 'error', ARGV[1], 'phase', 'done',
  'updated_at', ARGV[4])
local run_id = redis.call('HGET', KEYS[1], 'run_id')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'type', 'run.failed',
  'run_id', run_id, 'data', ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[4], run_id)
return 1
"""

# Cancel a run and every pending gate it has.
# KEYS[1] run hash, KEYS[2] deadlines zset, KEYS[3] events stream, KEYS[4] run gates set,
# KEYS[5] finished-runs zset,
# KEYS[6..] every gate hash of the run (the members of KEYS[4], in ARGV order)
# ARGV[1] by, ARGV[2] reason, ARGV[3] events MAXLEN, ARGV[4] run id, ARGV[5] unused,
# ARGV[6..] gate ids
# Returns {'cancelled'} | {'finished', status} | {'missing'} | {'retry'} (a gate was
# opened since the caller listed them: list again).
CANCEL_RUN = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing'} end
if st == 'completed' or st == 'failed' or st == 'cancelled' then return {'finished', st} end
if redis.call('SCARD', KEYS[4]) ~= #KEYS - 5 then return {'retry'} end
local t = redis.call('TIME')
local nowstr = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
local origin = redis.call('HGET', KEYS[1], 'origin') or '{}'
for i = 6, #KEYS do
  local gid = ARGV[i]
  if redis.call('HGET', KEYS[i], 'status') == 'pending' then
    redis.call('HSET', KEYS[i], 'status', 'cancelled', 'decided_by', ARGV[1],
      'reason', ARGV[2], 'decided_at', nowstr)
    redis.call('ZREM', KEYS[2], gid)
    local g = redis.call('HMGET', KEYS[i], 'tool', 'call_id')
    local data = '{"gate_id":' .. cjson.encode(gid) .. ',"run_id":' .. cjson.encode(ARGV[4])
      .. ',"call_id":' .. cjson.encode(g[2]) .. ',"tool":' .. cjson.encode(g[1])
      .. ',"status":"cancelled","by":' .. cjson.encode(ARGV[1])
      .. ',"reason":' .. cjson.encode(ARGV[2]) .. ',"decided_at":' .. nowstr
      .. ',"origin":' .. origin .. '}'
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'type', 'gate.decided',
      'run_id', ARGV[4], 'data', data)
  end
end
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'cancelled_by', ARGV[1], 'pending', 0,
  'phase', 'done', 'updated_at', nowstr)
local data = '{"run_id":' .. cjson.encode(ARGV[4]) .. ',"by":' .. cjson.encode(ARGV[1])
  .. ',"reason":' .. cjson.encode(ARGV[2]) .. ',"origin":' .. origin .. '}'
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'type', 'run.cancelled',
  'run_id', ARGV[4], 'data', data)
redis.call('ZADD', KEYS[5], nowstr, ARGV[4])
return {'cancelled'}
"""

# Renew the run lease only if this worker still holds it.
# KEYS[1] lock key; ARGV[1] token, ARGV[2] lease in ms. Returns 1 if renewed.
RENEW_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Release the run lease only if this worker still holds it.
# KEYS[1] lock key; ARGV[1] token. Returns 1 if released.
RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# Finish a job: acknowledge it, delete it from the stream (one group reads jobs, so an
# acknowledged job is never needed again) and release the run's lease if still ours.
# KEYS[1] jobs stream, KEYS[2] lock key
# ARGV[1] group, ARGV[2] message id, ARGV[3] lock token
# Returns 1 if the lease was released.
FINISH_JOB = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[3] then
  return redis.call('DEL', KEYS[2])
end
return 0
"""
