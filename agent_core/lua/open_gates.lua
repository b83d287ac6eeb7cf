-- OPEN_GATES: open the gates of a turn and pause the run (a turn whose gates RECORD_TURN did
-- not open as it recorded it: one with calls that run first). Deadlines are taken on the
-- Redis clock, the same clock DECIDE_GATE compares them with. All or nothing: a gate that
-- already exists or a call that no longer needs one means the caller's view is stale, and
-- nothing is written. A gate an approver rule decided (agent_core.approvers) is opened
-- decided, with both its events; when every gate of the turn is decided so, the run does not
-- pause. A gate a live grant of the thread decides (agent_core.grants, include/grants.lua) is
-- opened approved by `grant:<id>`, as a rule's is. The body is include/open_gates.lua.
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
--!include lease.lua
--!include open_gates.lua
local n = (#ARGV - 2) / 5
if n < 1 or n ~= math.floor(n) or #KEYS ~= 9 + n then
  return redis.error_reply('OPEN_GATES: bad arguments')
end
local nudges_key = KEYS[#KEYS]
if not holds(run_key, fence) then return {ok = 'lost'} end
return {ok = open_gates(run_key, turn_key, deadlines_key, events_key, run_gates_key,
  grants_key, audit_key, audit_head_key, nudges_key, fence, turn, n, 8, 2)}
