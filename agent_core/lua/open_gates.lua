-- OPEN_GATES: open the gates of a turn and pause the run. Deadlines are taken on the Redis
-- clock, the same clock DECIDE_GATE compares them with. All or nothing: a gate that already
-- exists or a call that no longer needs one means the caller's view is stale, and nothing
-- is written. A gate an approver rule decided (agent_core.approvers) is opened decided, with
-- both its events; when every gate of the turn is decided so, the run does not pause.
-- A gate a live grant of the thread decides (agent_core.grants, include/grants.lua) is
-- opened approved by `grant:<id>`, as a rule's is.
-- KEYS: run_key, turn_key, deadlines_key, events_key, run_gates_key, grants_key (the grants
--   of the thread: its top run's), audit_key, audit_head_key (the shard's audit trail), then
--   one gate hash per gate, in ARGV order, then nudges_key (the shard's reminders and
--   escalations)
-- ARGV: fence, turn (guard), then per gate 5 values: gate id, timeout in seconds, gate
--   fields (flat JSON object of strings, among them `index`: the call's position in the
--   turn, by which gates are listed, and `status`), gate.opened event data JSON without its
--   closing brace (created_at and deadline are appended here), gate.decided event data JSON
--   without its closing brace (decided_at is appended) or '' for a gate left to a person
-- Returns: 'ok' (paused) | 'decided' (no gate left to a person: go on) | 'lost' | 'stopped'
--   (not running at that turn) | 'stale' as status replies. A retry after this fence opened
--   that turn's gates (the first reply lost) gets the first run's answer again.
local run_key, turn_key, deadlines_key, events_key, run_gates_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local grants_key, audit_key, audit_head_key = KEYS[6], KEYS[7], KEYS[8]
local fence, turn = ARGV[1], ARGV[2]
--!include clock.lua
--!include lease.lua
--!include steps.lua
--!include nudges.lua
--!include audit.lua
--!include grants.lua
local n = (#ARGV - 2) / 5
if n < 1 or n ~= math.floor(n) or #KEYS ~= 9 + n then
  return redis.error_reply('OPEN_GATES: bad arguments')
end
local nudges_key = KEYS[#KEYS]
if not holds(run_key, fence) then return {ok = 'lost'} end
if step_done(run_key, fence, 'open:' .. turn) then
  -- Paused (awaiting approval) unless every gate was decided by a rule.
  local st = redis.call('HGET', run_key, 'status')
  return {ok = (st == 'awaiting_approval') and 'ok' or 'decided'}
end
if redis.call('HGET', run_key, 'status') ~= 'running'
  or redis.call('HGET', run_key, 'turn') ~= turn then
  return {ok = 'stopped'}
end
local all = {}
for i = 1, n do
  local base = 2 + (i - 1) * 5
  local fields = cjson.decode(ARGV[base + 3])
  if redis.call('EXISTS', KEYS[8 + i]) == 1
    or redis.call('HGET', turn_key, 'state:' .. fields['call_id']) ~= 'needs_gate' then
    return {ok = 'stale'}
  end
  all[i] = fields
end
local tnow = now()
local nowstr = string.format('%.6f', tnow)
local run_id = redis.call('HGET', run_key, 'run_id')
local pending = 0
done_step(run_key, fence, 'open:' .. turn)
for i = 1, n do
  local base = 2 + (i - 1) * 5
  local gate_key = KEYS[8 + i]
  local gid = ARGV[base + 1]
  local fields = all[i]
  local decided_data = ARGV[base + 5]
  if decided_data == '' then decided_data = grant_decides(grants_key, fields, tnow) or '' end
  local decided = decided_data ~= ''
  local deadline = string.format('%.6f', tnow + tonumber(ARGV[base + 2]))
  local flat = {'created_at', nowstr, 'deadline', deadline}
  if decided then
    flat[#flat + 1] = 'decided_at'
    flat[#flat + 1] = nowstr
  end
  for k, v in pairs(fields) do
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
  redis.call('HSET', gate_key, unpack(flat))
  if not decided then
    redis.call('ZADD', deadlines_key, deadline, gid)
    schedule_nudges(gate_key, nudges_key, gid, tnow, fields, tonumber(ARGV[base + 2]))
    pending = pending + 1
  end
  audit_opened(audit_key, audit_head_key, gate_key, fields, decided, nowstr)
  redis.call('SADD', run_gates_key, gid)
  redis.call('HSET', turn_key, 'state:' .. fields['call_id'], 'gated', 'gate:' .. fields['call_id'], gid)
  redis.call('XADD', events_key, '*', 'type', 'gate.opened', 'run_id', run_id, 'data',
    ARGV[base + 4] .. ',"created_at":' .. nowstr .. ',"deadline":' .. deadline .. '}')
  if decided then
    redis.call('XADD', events_key, '*', 'type', 'gate.decided', 'run_id', run_id, 'data',
      decided_data .. ',"decided_at":' .. nowstr .. '}')
  end
end
if pending == 0 then
  redis.call('HSET', run_key, 'updated_at', nowstr)
  return {ok = 'decided'}
end
redis.call('HSET', run_key, 'status', 'awaiting_approval', 'pending', pending, 'updated_at', nowstr)
return {ok = 'ok'}
