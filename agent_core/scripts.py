"""Lua scripts: every state transition that must be atomic.

Each script names its KEYS and ARGV in a header comment. Every key arrives in KEYS (built by
:mod:`agent_core.keys`); none is built inside Lua. Every script is safe to run twice (a command
is retried after a connection error or through a failover): the second run changes nothing,
and when the first run's reply was lost it answers as the first did, recognising its own
effect (a call's claimant, the attempt that decided a gate or took a lease, the run's last
step under a fence). Every script validates its inputs before its first write, so none can
fail half-way through.

Leases and fencing: a worker advances a run only while it holds the run's lease, kept in the
run hash as ``fence`` (a counter bumped at every acquisition: the fencing token) and
``lease_until`` (Redis clock). Every script that advances a run takes the worker's fence and
checks, inside the script, that it is still the current one and the lease not released. A
lease that ran out lets another worker take the run over (bumping the fence); until one
does, the holder is still the only writer and its renewal takes the lease up again (a worker
cut off by a failover for longer than its lease carries on). A worker paused past its lease
(GC, VM pause, SIGSTOP, a blocked event loop) and taken over gets ``lost`` and writes nothing.

The scripts that stop a run (CANCEL_RUN, FAIL_RUN) are in :mod:`agent_core.stopping`, those
that put a stopped run back to work in :mod:`agent_core.reopen_scripts`.

Events are appended without MAXLEN: the worker's trimmer removes them only once every
consumer group has read them (see :mod:`agent_core.trimmer`).
"""

from __future__ import annotations

# Shared Lua helpers, prepended to the scripts that need them.
# now(): the Redis clock in seconds. holds(run_key, fence): the run is still the caller's.
# done_step/step_done: record/recognise a step (kind and turn) written under this fence.
_HELPERS = """
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function holds(run_key, fence)
  local h = redis.call('HMGET', run_key, 'fence', 'lease_until')
  return h[1] == fence and tonumber(h[2] or '0') > 0
end
local function done_step(run_key, fence, step)
  redis.call('HSET', run_key, 'step', fence .. ':' .. step)
end
local function step_done(run_key, fence, step)
  return redis.call('HGET', run_key, 'step') == fence .. ':' .. step
end
local function finished(st)
  return st == 'completed' or st == 'failed' or st == 'cancelled'
end
-- Close a pending gate as `cancelled` (its run was cancelled or failed) and announce it.
-- `extra` is more JSON for the event (',"run_failed":true') and `more` more gate fields.
local function close_gate(gate_key, gid, deadlines, events, run_id, by, reason, nowstr,
    origin, extra, more)
  redis.call('HSET', gate_key, 'status', 'cancelled', 'decided_by', by, 'reason', reason,
    'decided_at', nowstr, unpack(more))
  redis.call('ZREM', deadlines, gid)
  local g = redis.call('HMGET', gate_key, 'tool', 'call_id')
  local data = '{"gate_id":' .. cjson.encode(gid) .. ',"run_id":' .. cjson.encode(run_id)
    .. ',"call_id":' .. cjson.encode(g[2]) .. ',"tool":' .. cjson.encode(g[1])
    .. ',"status":"cancelled","by":' .. cjson.encode(by) .. ',"reason":' .. cjson.encode(reason)
    .. extra .. ',"decided_at":' .. nowstr .. ',"origin":' .. origin .. '}'
  redis.call('XADD', events, '*', 'type', 'gate.decided', 'run_id', run_id, 'data', data)
end
-- Hand a finished child run's outcome (a sub-agent's answer or failure) to the parent's
-- call, announce it, and wake the parent once nothing else of its turn is pending. A no-op
-- unless that call still waits for this child, so a second report changes nothing.
local function cut(s, n)  -- at most n bytes, never inside a UTF-8 character
  if #s <= n then return s end
  local i = n
  while i > 0 do
    local b = string.byte(s, i + 1)
    if b < 128 or b >= 192 then break end
    i = i - 1
  end
  return string.sub(s, 1, i)
end
local function report_child(child_key, parent_key, pturn_key, pjobs, pevents, text, ok)
  local c = redis.call('HMGET', child_key, 'parent', 'parent_call', 'run_id')
  local pid, cid = c[1], c[2]
  if not pid or not cid or redis.call('HGET', pturn_key, 'state:' .. cid) ~= 'child' then
    return
  end
  redis.call('HSET', pturn_key, 'state:' .. cid, 'done', 'result:' .. cid, text)
  local call = cjson.decode(redis.call('HGET', pturn_key, 'call:' .. cid))
  local gid = redis.call('HGET', pturn_key, 'gate:' .. cid)
  local pstatus = redis.call('HGET', parent_key, 'status')
  local data = cjson.encode({run_id = pid, call_id = cid, tool = call['name'], ok = ok,
    in_doubt = false, after_cancel = pstatus == 'cancelled', output = cut(text, 3000),
    child_run = c[3]})
  data = string.sub(data, 1, -2) .. ',"gate_id":' .. (gid and cjson.encode(gid) or 'null')
    .. ',"origin":' .. (redis.call('HGET', parent_key, 'origin') or '{}') .. '}'
  redis.call('XADD', pevents, '*', 'type', 'tool.executed', 'run_id', pid, 'data', data)
  -- A finished parent has no children pending (its cancel or failure set 0): never below.
  local left = tonumber(redis.call('HGET', parent_key, 'children_pending') or '0')
  if left > 0 then left = redis.call('HINCRBY', parent_key, 'children_pending', -1) end
  if left <= 0 and pstatus == 'awaiting_approval'
    and tonumber(redis.call('HGET', parent_key, 'pending') or '0') <= 0 then
    redis.call('XADD', pjobs, '*', 'type', 'resume', 'run_id', pid)
  end
end
-- BEGIN_RUN's step (the caller holds the lease), shared with ACQUIRE_LEASE, which may take
-- it in the same call. Returns {status} or {status, run hash as a flat list}.
local function begin_run(run_key, events_key, agent, nowstr)
  local st = redis.call('HGET', run_key, 'status')
  if st == 'queued' then
    redis.call('HSET', run_key, 'status', 'running', 'updated_at', nowstr)
    local r = redis.call('HMGET', run_key, 'run_id', 'task', 'requested_by', 'origin', 'agent')
    local data = '{"run_id":' .. cjson.encode(r[1]) .. ',"agent":' .. cjson.encode(r[5] or agent)
      .. ',"task":' .. cjson.encode(r[2]) .. ',"requested_by":' .. cjson.encode(r[3])
      .. ',"origin":' .. (r[4] or '{}') .. '}'
    redis.call('XADD', events_key, '*', 'type', 'run.started', 'run_id', r[1], 'data', data)
    st = 'running'
  elseif st == 'awaiting_approval' then
    if tonumber(redis.call('HGET', run_key, 'pending') or '0') > 0
      or tonumber(redis.call('HGET', run_key, 'children_pending') or '0') > 0 then
      return {st}
    end
    redis.call('HSET', run_key, 'status', 'running', 'updated_at', nowstr)
    st = 'running'
  end
  return {st, redis.call('HGETALL', run_key)}
end
-- Whoever spoke to the agent is a requester (invariant 10): the run's `requesters` field is
-- a JSON list, the run's starter first, then each author in the order they first wrote,
-- grown in the same step that moves their message into the history the model reads. A run
-- stored before the field existed gets it from its starter and its history's authors.
local function add_requesters(run_key, authors_key, authors)
  local raw = redis.call('HGET', run_key, 'requesters')
  local list, seen = {}, {}
  local function add(who)
    if who and who ~= '' and not seen[who] then
      seen[who] = true
      list[#list + 1] = who
    end
  end
  if raw then
    for _, who in ipairs(cjson.decode(raw)) do add(who) end
  else
    add(redis.call('HGET', run_key, 'requested_by'))
    local old = redis.call('HVALS', authors_key)
    table.sort(old)
    for _, who in ipairs(old) do add(who) end
  end
  for _, who in ipairs(authors) do add(who) end
  if #list > 0 then redis.call('HSET', run_key, 'requesters', cjson.encode(list)) end
end
-- READ_FOR_MODEL's step, shared with FINISH_TURN (which hands the history over with the
-- turn it closes). Under a current lease, in phase `model`, the messages queued in the
-- run's inbox are first moved to the history, in order, with their authors.
-- Returns {fence, lease_until, turn, phase, now (seconds, as a string), message...}.
local function read_for_model(run_key, history_key, authors_key, inbox_key, fence)
  local h = redis.call('HMGET', run_key, 'fence', 'lease_until', 'turn', 'phase', 'status')
  local t = redis.call('TIME')
  local tnow = tonumber(t[1]) + tonumber(t[2]) / 1000000
  if h[1] == fence and tonumber(h[2] or '0') > 0 and h[4] == 'model'
    and h[5] == 'running' then
    local queued = redis.call('LRANGE', inbox_key, 0, -1)
    local by = nil
    local authors = {}
    for i = 1, #queued do queued[i] = cjson.decode(queued[i]) end  -- all read before a write
    for i = 1, #queued do
      local e = queued[i]
      local n = redis.call('RPUSH', history_key, e['message'])
      redis.call('HSET', authors_key, tostring(n - 1), e['by'])
      by = e['by']
      authors[#authors + 1] = by
    end
    if by then
      redis.call('HSET', run_key, 'last_by', by)
      add_requesters(run_key, authors_key, authors)
      redis.call('DEL', inbox_key)
    end
  end
  local out = {h[1] or '', h[2] or '0', h[3] or '', h[4] or '',
    t[1] .. '.' .. string.format('%06d', t[2])}
  local msgs = redis.call('LRANGE', history_key, 0, -1)
  for i = 1, #msgs do out[i + 5] = msgs[i] end
  return out
end
-- HSET/RPUSH in slices: unpack() of thousands of values overflows Lua's C stack.
local function hset_from(key, argv, first)
  local i = first
  while i <= #argv do
    local last = math.min(i + 399, #argv)
    redis.call('HSET', key, unpack(argv, i, last))
    i = last + 1
  end
end
local function rpush_from(key, argv, first)
  local i = first
  while i <= #argv do
    local last = math.min(i + 399, #argv)
    redis.call('RPUSH', key, unpack(argv, i, last))
    i = last + 1
  end
end
"""

# Start a run: its hash, first message, indexes and start job, at most once per idempotency
# key (a Slack trigger id), so a client retry after a lost reply starts nothing twice.
# KEYS[1] idempotency key ('' key name when none: then KEYS[1] is the run hash again),
# KEYS[2] run hash, KEYS[3] history list, KEYS[4] user's runs zset, KEYS[5] active-runs zset,
# KEYS[6] jobs stream, KEYS[7] authors hash (who said each user message)
# ARGV[1] '1' when KEYS[1] is a real idempotency key, ARGV[2] run id, ARGV[3] first message
# JSON, ARGV[4] now (score), ARGV[5] key TTL in seconds, ARGV[6..] run hash field/value pairs
# Returns the run id: the new one, or the one the key already started.
START_RUN = (
    _HELPERS
    + """
if (#ARGV - 5) % 2 ~= 0 or #ARGV < 7 then return redis.error_reply('START_RUN: bad arguments') end
if ARGV[1] == '1' then
  local existing = redis.call('GET', KEYS[1])
  if existing then return existing end
end
if redis.call('EXISTS', KEYS[2]) == 1 then return ARGV[2] end
hset_from(KEYS[2], ARGV, 6)
redis.call('RPUSH', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[7], '0', redis.call('HGET', KEYS[2], 'requested_by') or '')
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[2])
redis.call('ZADD', KEYS[5], ARGV[4], ARGV[2])
redis.call('XADD', KEYS[6], '*', 'type', 'start', 'run_id', ARGV[2])
if ARGV[1] == '1' then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[5]))
end
return ARGV[2]
"""
)

# Take the lease of a run and, when KEYS[2] is given, begin it too (BEGIN_RUN's step: one
# round trip instead of two when a job starts). A resume job names the turn it resumes: with
# KEYS[3], that turn's hash comes back too when the run is still at that turn, in phase
# `tools` (the calls to run next: one round trip fewer).
# KEYS[1] run hash, KEYS[2] events stream (optional), KEYS[3] the turn's hash (optional)
# ARGV[1] lease in ms, ARGV[2] worker name (for people reading the run), ARGV[3] agent name
# (for run.started when the run hash names none; with KEYS[2]), ARGV[4] the turn (with KEYS[3];
# else ''), ARGV[5] the caller's attempt id (optional: made once, kept across retries)
# Returns {'ok', fence, previous owner[, BEGIN_RUN's reply[, the turn's hash]]} | {'busy',
# seconds left on the holder's lease} | {'missing'}. The previous owner is '' unless this is a
# takeover: another worker's lease ran out without being released (released leases have
# lease_until 0). A retry of an attempt that took the lease (its reply lost) gets the same
# fence back, and BEGIN_RUN's reply again.
ACQUIRE_LEASE = (
    _HELPERS
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local n = now()
local held = tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0')
local mine = ARGV[5] and ARGV[5] ~= '' and held > 0
  and redis.call('HGET', KEYS[1], 'lease_attempt') == ARGV[5]
  and redis.call('HGET', KEYS[1], 'lease_owner') == ARGV[2]
if held > n and not mine then return {'busy', string.format('%.3f', held - n)} end
local before = redis.call('HGET', KEYS[1], 'lease_owner') or ''
if held <= 0 or before == ARGV[2] then before = '' end
local fence
if mine then
  fence = tonumber(redis.call('HGET', KEYS[1], 'fence'))
else
  fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
end
redis.call('HSET', KEYS[1], 'lease_until', string.format('%.6f', n + tonumber(ARGV[1]) / 1000),
  'lease_owner', ARGV[2], 'lease_attempt', ARGV[5] or '')
if KEYS[2] then
  local began = begin_run(KEYS[1], KEYS[2], ARGV[3] or '', string.format('%.6f', n))
  if KEYS[3] and began[1] == 'running' and redis.call('HGET', KEYS[1], 'turn') == ARGV[4]
    and redis.call('HGET', KEYS[1], 'phase') == 'tools' then
    began[3] = redis.call('HGETALL', KEYS[3])
  end
  return {'ok', tostring(fence), before, began}
end
return {'ok', tostring(fence), before}
"""
)

# Extend the lease while the run is still the caller's (even one that ran out, if no other
# worker took the run over: its holder was cut off from Redis, by a failover, for longer).
# KEYS[1] run hash; ARGV[1] fence, ARGV[2] lease in ms. Returns 1 if renewed, 0 if lost.
RENEW_LEASE = (
    _HELPERS
    + """
if not holds(KEYS[1], ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', string.format('%.6f', now() + tonumber(ARGV[2]) / 1000))
return 1
"""
)

# What a model call needs, in one step: the lease as it stands (by the Redis clock) and the
# history. A worker paused before this point (and taken over) stops here instead of paying
# for a model call on a stale history. Under a current lease, in phase `model`, the messages
# queued in the run's inbox (Gateway.continue_run while it worked) are first moved to the
# history, in order, with their authors: in one script, so none is lost or given twice.
# Otherwise read-only. (A script, not MULTI with TIME: Redis Cluster refuses a keyless
# command in a transaction.)
# KEYS[1] run hash, KEYS[2] history list, KEYS[3] authors hash, KEYS[4] inbox list
# ARGV[1] fence
# Returns {fence, lease_until, turn, phase, now (seconds, as a string), message...}.
READ_FOR_MODEL = (
    _HELPERS
    + """
return read_for_model(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1])
"""
)

# Give the lease back (only its holder can).
# KEYS[1] run hash; ARGV[1] fence. Returns 1 if released.
RELEASE_LEASE = """
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', '0')
return 1
"""

# Finish a job: acknowledge it, delete it from the stream (one group reads jobs, so an
# acknowledged job is never needed again) and release the run's lease. Only the lease
# holder may: a worker that lost the lease leaves the job to the new owner.
# KEYS[1] jobs stream, KEYS[2] run hash
# ARGV[1] group, ARGV[2] message id, ARGV[3] fence
# Returns 1 when done (a retry, its lease released by the first run, too), 0 when the lease
# was lost (nothing written).
FINISH_JOB = (
    _HELPERS
    + """
if redis.call('HGET', KEYS[2], 'fence') ~= ARGV[3] then return 0 end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], 'lease_until', '0')
return 1
"""
)

# Put a job back at the end of the stream as a new entry (its run was busy): the old entry is
# acknowledged and deleted, so waiting for a busy run never counts as a failed delivery.
# KEYS[1] jobs stream
# ARGV[1] group, ARGV[2] message id, ARGV[3..] field, value pairs of the job
# Returns the new entry's id, or false when the entry is no longer pending (done elsewhere).
REQUEUE_JOB = """
if #ARGV < 4 or (#ARGV - 2) % 2 ~= 0 then return redis.error_reply('bad job fields') end
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 then return false end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return id
"""

# Move a gate out of `pending`, exactly once. Gateway.decide_many calls it once per gate:
# each gate is decided atomically, and only the last pending gate's decision resumes the run.
# KEYS[1] gate hash, KEYS[2] run hash, KEYS[3] deadlines zset, KEYS[4] jobs stream,
# KEYS[5] events stream
# ARGV[1] gate id, ARGV[2] approved|denied|expired, ARGV[3] decided by, ARGV[4] reason,
# ARGV[5] the decider's attempt id ('' for none: made once, kept across retries), ARGV[6] run
# id (must match the gate's), ARGV[7] the arguments hash the decider saw ('' when not given:
# the gate's own)
# Returns {outcome, gate hash as a flat list}; outcome is applied | decided (someone else
# was first) | missing | not_due (expiry asked too early) | mismatch (ARGV[7] is not the
# gate's hash: nothing decided); the last three carry no hash.
# A person's decision that arrives after the deadline becomes `expired`: the card said so.
# A retry of the attempt that decided (its reply lost) is told `applied` again, not that it
# was decided already (by itself), and writes the attempt again (a WAIT after it covers it).
DECIDE_GATE = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st or redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[6] then return {'missing'} end
if st ~= 'pending' then
  if ARGV[5] ~= '' and redis.call('HGET', KEYS[1], 'decided_attempt') == ARGV[5] then
    redis.call('HSET', KEYS[1], 'decided_attempt', ARGV[5])
    return {'applied', redis.call('HGETALL', KEYS[1])}
  end
  return {'decided', redis.call('HGETALL', KEYS[1])}
end
local ahash = redis.call('HGET', KEYS[1], 'args_hash')
if ARGV[7] ~= '' and ARGV[7] ~= ahash then return {'mismatch'} end
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
local seen = ''
if status == 'approved' or status == 'denied' then
  seen = ARGV[7] ~= '' and ARGV[7] or ahash
end
redis.call('HSET', KEYS[1], 'status', status, 'decided_by', by, 'reason', reason,
  'decided_at', nowstr, 'decided_hash', seen, 'decided_attempt', ARGV[5])
redis.call('ZREM', KEYS[3], ARGV[1])
local g = redis.call('HMGET', KEYS[1], 'tool', 'turn', 'call_id')
local origin = redis.call('HGET', KEYS[2], 'origin') or '{}'
local data = '{"gate_id":' .. cjson.encode(ARGV[1]) .. ',"run_id":' .. cjson.encode(ARGV[6])
  .. ',"call_id":' .. cjson.encode(g[3]) .. ',"tool":' .. cjson.encode(g[1])
  .. ',"status":' .. cjson.encode(status) .. ',"by":' .. cjson.encode(by)
  .. ',"reason":' .. cjson.encode(reason) .. ',"decided_at":' .. nowstr
  .. ',"origin":' .. origin .. '}'
redis.call('XADD', KEYS[5], '*', 'type', 'gate.decided', 'run_id', ARGV[6], 'data', data)
local pending = redis.call('HINCRBY', KEYS[2], 'pending', -1)
local rs = redis.call('HGET', KEYS[2], 'status')
-- An extra resume job is harmless (it finds nothing to do); a missing one hangs the run.
if pending <= 0 and (rs == 'awaiting_approval' or rs == 'running')
  and tonumber(redis.call('HGET', KEYS[2], 'children_pending') or '0') <= 0 then
  redis.call('XADD', KEYS[4], '*', 'type', 'resume', 'run_id', ARGV[6], 'turn', g[2])
end
return {'applied', redis.call('HGETALL', KEYS[1])}
"""

# Take a run to `running` when a job for it starts.
# KEYS[1] run hash, KEYS[2] events stream
# ARGV[1] fence, ARGV[2] agent name (when the run hash names none), ARGV[3] now
# Returns {status after the call, run hash as a flat list}: running, awaiting_approval
# (gates still pending) or the finished status; {''} when the run does not exist; {'lost'}
# when the lease is no longer the caller's.
BEGIN_RUN = (
    _HELPERS
    + """
if not redis.call('HGET', KEYS[1], 'status') then return {''} end
if not holds(KEYS[1], ARGV[1]) then return {'lost'} end
return begin_run(KEYS[1], KEYS[2], ARGV[2], ARGV[3])
"""
)

# Persist a model turn: the assistant message and its tool calls, or the final answer.
# KEYS[1] run hash, KEYS[2] history list, KEYS[3] the new turn's hash, KEYS[4] events stream,
# KEYS[5] finished-runs zset, KEYS[6] active-runs zset, KEYS[7] the run's inbox (optional:
# a final answer with messages queued in it does not finish the run, whose next model turn
# takes them), KEYS[8..10] a child run's parent hash, parent turn hash and jobs stream
# (optional: the final answer becomes the parent call's result, see report_child)
# ARGV[1] fence, ARGV[2] the run's current turn (guard), ARGV[3] assistant message JSON,
# ARGV[4] 'tools' (calls follow) or 'done' (final answer), ARGV[5] final text,
# ARGV[6] run.completed event data JSON, ARGV[7] now,
# ARGV[8..] field, value pairs for the turn hash
# Returns the run hash (flat list); 0 when the run is no longer running at that turn
# (cancelled, or a replay); 'lost' (a status reply) when the lease is not the caller's. A
# retry after this fence recorded that turn (the first reply lost) gets the run hash again.
RECORD_TURN = (
    _HELPERS
    + """
if (#ARGV - 7) % 2 ~= 0 or (ARGV[4] ~= 'tools' and ARGV[4] ~= 'done') then
  return redis.error_reply('RECORD_TURN: bad arguments')
end
if not holds(KEYS[1], ARGV[1]) then return {ok = 'lost'} end
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'turn') ~= ARGV[2]
  or redis.call('HGET', KEYS[1], 'phase') ~= 'model' then
  if step_done(KEYS[1], ARGV[1], 'record:' .. ARGV[2]) then return redis.call('HGETALL', KEYS[1]) end
  return 0
end
done_step(KEYS[1], ARGV[1], 'record:' .. ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('HINCRBY', KEYS[1], 'turn', 1)
redis.call('HSET', KEYS[1], 'updated_at', ARGV[7])
hset_from(KEYS[3], ARGV, 8)
if ARGV[4] == 'done' and KEYS[7] and redis.call('LLEN', KEYS[7]) > 0 then
  redis.call('HSET', KEYS[1], 'phase', 'model')
elseif ARGV[4] == 'done' then
  redis.call('HSET', KEYS[1], 'status', 'completed', 'phase', 'done', 'final', ARGV[5])
  local run_id = redis.call('HGET', KEYS[1], 'run_id')
  redis.call('XADD', KEYS[4], '*', 'type', 'run.completed', 'run_id', run_id, 'data', ARGV[6])
  redis.call('ZADD', KEYS[5], ARGV[7], run_id)
  redis.call('ZREM', KEYS[6], run_id)
  if KEYS[10] then report_child(KEYS[1], KEYS[8], KEYS[9], KEYS[10], KEYS[4], ARGV[5], true) end
else
  redis.call('HSET', KEYS[1], 'phase', 'tools')
end
return redis.call('HGETALL', KEYS[1])
"""
)

# Claim a tool call for execution (at most once unless the tool is idempotent). Nothing
# starts once the run is cancelled: the claim checks the run's status in the same step.
# The claim records its claimant (`claimant:<call id>`: fence and attempt), so that a retry
# of the same attempt (the first reply lost) is told the claim is its own ('yours'), never
# that another worker claimed the call and stopped (which reports it in doubt).
# KEYS[1] run hash, KEYS[2] turn hash
# ARGV[1] fence, ARGV[2] turn (guard), ARGV[3] call id, ARGV[4] '1' when a `claimed` call
# may be claimed again (idempotent tool), ARGV[5] the claimant's attempt id (optional: made
# once before the first try, kept across retries)
# Returns {'ok'|'no', previous state} | {'yours'} | {'lost'} | {'stopped', run status}.
CLAIM_CALL = (
    _HELPERS
    + """
if not holds(KEYS[1], ARGV[1]) then return {'lost'} end
local field = 'state:' .. ARGV[3]
local s = redis.call('HGET', KEYS[2], field)
local me = ARGV[1] .. ':' .. (ARGV[5] or '')
if s == 'claimed' and ARGV[5] and ARGV[5] ~= ''
  and redis.call('HGET', KEYS[2], 'claimant:' .. ARGV[3]) == me then
  redis.call('HSET', KEYS[2], 'claimant:' .. ARGV[3], me)  -- a write for a WAIT to cover
  return {'yours'}
end
local rs = redis.call('HGET', KEYS[1], 'status')
if rs ~= 'running' or redis.call('HGET', KEYS[1], 'turn') ~= ARGV[2] then
  return {'stopped', rs or ''}
end
if s == 'ready' or s == 'gated' or (s == 'claimed' and ARGV[4] == '1') then
  redis.call('HSET', KEYS[2], field, 'claimed', 'claimant:' .. ARGV[3], me)
  return {'ok', s}
end
return {'no', s or ''}
"""
)

# Record the result of a claimed call and announce it. Allowed after a cancel (the call was
# already running: its card says it finished after the cancel), never without the lease.
# KEYS[1] run hash, KEYS[2] turn hash, KEYS[3] events stream
# ARGV[1] fence, ARGV[2] call id, ARGV[3] result text,
# ARGV[4] tool.executed event data JSON without its closing brace (after_cancel is appended)
# Returns 'ok' | 'lost' | 'stale' (the call is not `claimed`: nothing written) as status
# replies.
COMPLETE_CALL = (
    _HELPERS
    + """
if not holds(KEYS[1], ARGV[1]) then return {ok = 'lost'} end
if redis.call('HGET', KEYS[2], 'state:' .. ARGV[2]) ~= 'claimed' then return {ok = 'stale'} end
local rs = redis.call('HGET', KEYS[1], 'status')
redis.call('HSET', KEYS[2], 'state:' .. ARGV[2], 'done', 'result:' .. ARGV[2], ARGV[3])
local after = (rs == 'cancelled') and 'true' or 'false'
redis.call('XADD', KEYS[3], '*', 'type', 'tool.executed',
  'run_id', redis.call('HGET', KEYS[1], 'run_id'),
  'data', ARGV[4] .. ',"after_cancel":' .. after .. '}')
return {ok = 'ok'}
"""
)

# Record the result of a call that will not run (declined, expired, invalid, unknown tool).
# KEYS[1] run hash, KEYS[2] turn hash
# ARGV[1] fence, ARGV[2] turn (guard), ARGV[3] call id, ARGV[4] result text
# Returns 'ok' | 'lost' | 'stopped' as status replies.
SETTLE_CALL = (
    _HELPERS
    + """
if not holds(KEYS[1], ARGV[1]) then return {ok = 'lost'} end
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'turn') ~= ARGV[2] then
  return {ok = 'stopped'}
end
if redis.call('HGET', KEYS[2], 'state:' .. ARGV[3]) ~= 'done' then
  redis.call('HSET', KEYS[2], 'state:' .. ARGV[3], 'done', 'result:' .. ARGV[3], ARGV[4])
end
return {ok = 'ok'}
"""
)

# Open the gates of a turn and pause the run. Deadlines are taken on the Redis clock, the
# same clock DECIDE_GATE compares them with. All or nothing: a gate that already exists or a
# call that no longer needs one means the caller's view is stale, and nothing is written.
# A gate an approver rule decided (agent_core.approvers) is opened decided, with both its
# events; when every gate of the turn is decided so, the run does not pause.
# KEYS[1] run hash, KEYS[2] turn hash, KEYS[3] deadlines zset, KEYS[4] events stream,
# KEYS[5] run gates set, KEYS[6..] one gate hash per gate, in ARGV order
# ARGV[1] fence, ARGV[2] turn (guard),
# then per gate 5 values: gate id, timeout in seconds, gate fields (flat JSON object of
# strings, among them `index`: the call's position in the turn, by which gates are listed,
# and `status`), gate.opened event data JSON without its closing brace (created_at and
# deadline are appended here), gate.decided event data JSON without its closing brace
# (decided_at is appended) or '' for a gate left to a person
# Returns 'ok' (paused) | 'decided' (no gate left to a person: go on) | 'lost' | 'stopped'
# (not running at that turn) | 'stale' as status replies. A retry after this fence opened
# that turn's gates (the first reply lost) gets the first run's answer again.
OPEN_GATES = (
    _HELPERS
    + """
local n = (#ARGV - 2) / 5
if n < 1 or n ~= math.floor(n) or #KEYS ~= 5 + n then
  return redis.error_reply('OPEN_GATES: bad arguments')
end
if not holds(KEYS[1], ARGV[1]) then return {ok = 'lost'} end
if step_done(KEYS[1], ARGV[1], 'open:' .. ARGV[2]) then
  -- Paused (awaiting approval) unless every gate was decided by a rule.
  local st = redis.call('HGET', KEYS[1], 'status')
  return {ok = (st == 'awaiting_approval') and 'ok' or 'decided'}
end
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'turn') ~= ARGV[2] then
  return {ok = 'stopped'}
end
local all = {}
for i = 1, n do
  local base = 2 + (i - 1) * 5
  local fields = cjson.decode(ARGV[base + 3])
  if redis.call('EXISTS', KEYS[5 + i]) == 1
    or redis.call('HGET', KEYS[2], 'state:' .. fields['call_id']) ~= 'needs_gate' then
    return {ok = 'stale'}
  end
  all[i] = fields
end
local tnow = now()
local nowstr = string.format('%.6f', tnow)
local run_id = redis.call('HGET', KEYS[1], 'run_id')
local pending = 0
done_step(KEYS[1], ARGV[1], 'open:' .. ARGV[2])
for i = 1, n do
  local base = 2 + (i - 1) * 5
  local gid = ARGV[base + 1]
  local decided = ARGV[base + 5] ~= ''
  local deadline = string.format('%.6f', tnow + tonumber(ARGV[base + 2]))
  local fields = all[i]
  local flat = {'created_at', nowstr, 'deadline', deadline}
  if decided then
    flat[#flat + 1] = 'decided_at'
    flat[#flat + 1] = nowstr
  end
  for k, v in pairs(fields) do
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
  redis.call('HSET', KEYS[5 + i], unpack(flat))
  if not decided then
    redis.call('ZADD', KEYS[3], deadline, gid)
    pending = pending + 1
  end
  redis.call('SADD', KEYS[5], gid)
  redis.call('HSET', KEYS[2], 'state:' .. fields['call_id'], 'gated', 'gate:' .. fields['call_id'], gid)
  redis.call('XADD', KEYS[4], '*', 'type', 'gate.opened', 'run_id', run_id, 'data',
    ARGV[base + 4] .. ',"created_at":' .. nowstr .. ',"deadline":' .. deadline .. '}')
  if decided then
    redis.call('XADD', KEYS[4], '*', 'type', 'gate.decided', 'run_id', run_id, 'data',
      ARGV[base + 5] .. ',"decided_at":' .. nowstr .. '}')
  end
end
if pending == 0 then
  redis.call('HSET', KEYS[1], 'updated_at', nowstr)
  return {ok = 'decided'}
end
redis.call('HSET', KEYS[1], 'status', 'awaiting_approval', 'pending', pending, 'updated_at', nowstr)
return {ok = 'ok'}
"""
)

# Close a turn: append the tool messages in call order and hand back to the model; with
# KEYS[3] and KEYS[4], also read what the model call needs (READ_FOR_MODEL's reply), saving
# the next step a round trip.
# KEYS[1] run hash, KEYS[2] history list, KEYS[3] authors hash, KEYS[4] inbox list
# ARGV[1] fence, ARGV[2] turn (guard), ARGV[3] now, ARGV[4..] tool messages JSON
# Returns the run hash (flat list), or with KEYS[4] {'read', n, the run hash's n values,
# READ_FOR_MODEL's reply...}; 0 when the run is not running at that turn in phase `tools`;
# 'lost' (status reply) when the lease is not the caller's. A retry after this fence closed
# that turn (the first reply lost) gets the same kind of reply again.
FINISH_TURN = (
    _HELPERS
    + """
if not holds(KEYS[1], ARGV[1]) then return {ok = 'lost'} end
local again = step_done(KEYS[1], ARGV[1], 'finish:' .. ARGV[2])
if not again and (redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'turn') ~= ARGV[2]
  or redis.call('HGET', KEYS[1], 'phase') ~= 'tools') then
  return 0
end
if not again then
  done_step(KEYS[1], ARGV[1], 'finish:' .. ARGV[2])
  rpush_from(KEYS[2], ARGV, 4)
  redis.call('HSET', KEYS[1], 'phase', 'model', 'updated_at', ARGV[3])
end
if not KEYS[4] then return redis.call('HGETALL', KEYS[1]) end
local run = redis.call('HGETALL', KEYS[1])
local out = {'read', #run}
for i = 1, #run do out[#out + 1] = run[i] end
local read = read_for_model(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1])
for i = 1, #read do out[#out + 1] = read[i] end
return out
"""
)

# Repair a run that nothing will advance: no live lease, no recent progress, and either no
# pending gate while it waits for approval, or no job while it is queued or running. It
# recounts the pending gates and enqueues a resume job (an extra job is harmless).
# KEYS[1] run hash, KEYS[2] jobs stream, KEYS[3] run gates set, KEYS[4] active-runs zset,
# KEYS[5..] every gate hash of the run (the members of KEYS[3], in ARGV order)
# ARGV[1] seconds without progress before a run counts as stuck, ARGV[2] run id,
# ARGV[3..] gate ids
# Returns 'repaired' | 'waiting' (gates pending: their deadlines move it) | 'busy' | 'recent'
# | 'finished' | 'retry' | 'missing' as status replies.
REPAIR_RUN = (
    _HELPERS
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then
  redis.call('ZREM', KEYS[4], ARGV[2])
  return {ok = 'missing'}
end
if finished(st) then
  redis.call('ZREM', KEYS[4], ARGV[2])
  return {ok = 'finished'}
end
local n = now()
if tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0') > n then return {ok = 'busy'} end
if tonumber(redis.call('HGET', KEYS[1], 'updated_at') or '0') > n - tonumber(ARGV[1]) then
  return {ok = 'recent'}
end
if redis.call('SCARD', KEYS[3]) ~= #KEYS - 4 then return {ok = 'retry'} end
local pending = 0
for i = 5, #KEYS do
  if redis.call('HGET', KEYS[i], 'status') == 'pending' then pending = pending + 1 end
end
local nowstr = string.format('%.6f', n)
if pending == 0 and st == 'awaiting_approval'
  and tonumber(redis.call('HGET', KEYS[1], 'children_pending') or '0') > 0 then
  return {ok = 'waiting'}  -- its sub-agents' runs report to it when they finish
end
if pending > 0 then
  -- Its gates have deadlines: the sweeper (or a decision) moves it on.
  if st ~= 'awaiting_approval'
    or tonumber(redis.call('HGET', KEYS[1], 'pending') or '0') ~= pending then
    redis.call('HSET', KEYS[1], 'status', 'awaiting_approval', 'pending', pending)
  end
  return {ok = 'waiting'}
end
redis.call('HSET', KEYS[1], 'pending', pending, 'updated_at', nowstr)
redis.call('HINCRBY', KEYS[1], 'repairs', 1)
redis.call('XADD', KEYS[2], '*', 'type', 'resume', 'run_id', ARGV[2])
return {ok = 'repaired'}
"""
)
