-- FAIL_RUN: fail a run that is not finished yet, closing its pending gates (their cards say
-- why). Only the lease holder may fail a run. A retryable failure (the model call kept
-- failing) keeps the phase it failed in, so that Gateway.retry_run continues from there.
-- A failure in the tools phase also closes the current turn's calls that did not run, so
-- that no later continuation or retry runs them on an approval given before the failure:
-- calls not started (ready, gated and approved, or whose gate this failure closed) are
-- recorded as not run (not_run), a call claimed by a worker that never reported as in doubt
-- (in_doubt). A call whose gate was denied or expired keeps its decision (the model is told
-- it on the next turn); a sub-agent's call is settled by its child's cancel (Stopper.fail
-- starts it; a crash before it is made good by Stopper.cancel_orphans). The run.failed
-- event lists the approved gates whose calls never ran (`never_ran`) and those in doubt
-- (`in_doubt`), so that their cards stop saying "Running…". A re-run of the same attempt
-- (its first reply lost) answers 'failed' again (invariant 11).
-- KEYS: run_key, events_key, finished_key, deadlines_key, run_gates_key, active_key,
--   parent_key, parent_turn_key, jobs_key (a child run's failure is its parent call's
--   result; a run without parent: run_key twice and the shard's jobs stream), turn_key (the
--   current turn's hash), audit_key, audit_head_key (the shard's audit trail), nudges_key
--   (the shard's), then every gate hash of the run (the members of run_gates_key, in ARGV
--   order), then
--   parent_gate_key (the gate of the parent's call; run_key when it had none or for a run
--   without parent)
-- ARGV: fence, error text, run.failed event data JSON (an object; the two lists are added
--   to it), now, run_id, retryable ('1' or '0'), told (what the parent's model is told; ''
--   for a run without parent), turn (the current turn: guard), not_run (the result of a
--   call that did not run), in_doubt (the result of a call in doubt), attempt (recorded as
--   `fail_attempt`), then the gate ids (ARGV[i - 2] is KEYS[i]'s)
-- Returns: 'failed' (also to a re-run of the same attempt: its first reply was lost) |
--   'finished' (already finished) | 'lost' | 'retry' (a gate was opened or a turn recorded
--   since the caller looked: look again) | 'missing' as status replies.
local run_key, events_key, finished_key, deadlines_key, run_gates_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local active_key, parent_key, parent_turn_key, jobs_key, turn_key =
  KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local audit_key, audit_head_key, nudges_key = KEYS[11], KEYS[12], KEYS[13]
local parent_gate_key = KEYS[#KEYS]
local fence, err, failed_data, nowarg, run_id, retryable =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local told, turn, not_run, in_doubt, attempt = ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]
--!include clock.lua
--!include lease.lua
--!include finished.lua
--!include nudges.lua
--!include close_gate.lua
--!include audit.lua
--!include report_child.lua
--!include json_list.lua
local st = redis.call('HGET', run_key, 'status')
if not st then return {ok = 'missing'} end
if finished(st) then
  if st == 'failed' and (attempt or '') ~= ''
    and redis.call('HGET', run_key, 'fail_attempt') == attempt then
    return {ok = 'failed'}
  end
  return {ok = 'finished'}
end
if not holds(run_key, fence) then return {ok = 'lost'} end
if redis.call('SCARD', run_gates_key) ~= #KEYS - 14
  or (redis.call('HGET', run_key, 'turn') or '0') ~= turn then
  return {ok = 'retry'}
end
local nowstr = string.format('%.6f', now())
local origin = redis.call('HGET', run_key, 'origin') or '{}'
local reason = 'the run failed: ' .. err
local gate_keys = {}
for i = 14, #KEYS - 1 do
  gate_keys[ARGV[i - 2]] = KEYS[i]
  if redis.call('HGET', KEYS[i], 'status') == 'pending' then
    close_gate(KEYS[i], ARGV[i - 2], deadlines_key, nudges_key, events_key, run_id, '', reason,
      nowstr, origin, ',"run_failed":true', {'closed_by_failure', '1'})
    audit(audit_key, audit_head_key, 'closed', KEYS[i], {reason = reason, at = nowstr})
  end
end
local phase = redis.call('HGET', run_key, 'phase') or 'model'
local never, doubt = {}, {}
if phase == 'tools' then
  local order = cjson.decode(redis.call('HGET', turn_key, 'order') or '[]')
  for _, cid in ipairs(order) do
    local s = redis.call('HGET', turn_key, 'state:' .. cid)
    local gid = redis.call('HGET', turn_key, 'gate:' .. cid)
    local gs = nil
    if gid and gate_keys[gid] then gs = redis.call('HGET', gate_keys[gid], 'status') end
    if s == 'claimed' then
      redis.call('HSET', turn_key, 'state:' .. cid, 'done', 'result:' .. cid, in_doubt)
      if gid then doubt[#doubt + 1] = gid end
      if gid then audit(audit_key, audit_head_key, 'in_doubt', gate_keys[gid] or false,
        {gate_id = gid, at = nowstr}) end
    elseif s == 'ready' or s == 'needs_gate'
      or (s == 'gated' and gs ~= 'denied' and gs ~= 'expired') then
      redis.call('HSET', turn_key, 'state:' .. cid, 'done', 'result:' .. cid, not_run)
      if gs == 'approved' then never[#never + 1] = gid end
      if gs == 'approved' then
        audit(audit_key, audit_head_key, 'not_run', gate_keys[gid], {at = nowstr}) end
    end
  end
end
local head = string.sub(failed_data, 1, -2)
local data = head .. (head == '{' and '' or ',') .. '"never_ran":' .. json_list(never)
  .. ',"in_doubt":' .. json_list(doubt) .. '}'
redis.call('HSET', run_key, 'status', 'failed', 'error', err, 'phase', 'done',
  'failed_phase', phase, 'retryable', retryable, 'fail_attempt', attempt or '',
  'pending', 0, 'children_pending', 0, 'updated_at', nowarg)
redis.call('XADD', events_key, '*', 'type', 'run.failed', 'run_id', run_id, 'data', data)
redis.call('ZADD', finished_key, nowarg, run_id)
redis.call('ZREM', active_key, run_id)
if told ~= '' then
  report_child(run_key, parent_key, parent_turn_key, jobs_key, events_key, told, false,
    audit_key, audit_head_key, parent_gate_key)
end
return {ok = 'failed'}
