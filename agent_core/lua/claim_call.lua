-- CLAIM_CALL: claim a tool call for execution (at most once unless the tool is idempotent).
-- Nothing starts once the run is cancelled: the claim checks the run's status in the same
-- step. The claim records its claimant (`claimant:<call id>`: fence and attempt), so that a
-- retry of the same attempt (the first reply lost) is told the claim is its own ('yours'),
-- never that another worker claimed the call and stopped (which reports it in doubt).
-- KEYS: run_key, turn_key
-- ARGV: fence, turn (guard), call_id, again ('1' when a `claimed` call may be claimed
--   again: an idempotent tool), attempt (the claimant's attempt id, optional: made once
--   before the first try, kept across retries)
-- Returns: {'ok'|'no', previous state} | {'yours'} | {'lost'} | {'stopped', run status}.
local run_key, turn_key = KEYS[1], KEYS[2]
local fence, turn, call_id, again, attempt = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
--!include lease.lua
if not holds(run_key, fence) then return {'lost'} end
local field = 'state:' .. call_id
local s = redis.call('HGET', turn_key, field)
local me = fence .. ':' .. (attempt or '')
if s == 'claimed' and attempt and attempt ~= ''
  and redis.call('HGET', turn_key, 'claimant:' .. call_id) == me then
  redis.call('HSET', turn_key, 'claimant:' .. call_id, me)  -- a write for a WAIT to cover
  return {'yours'}
end
local rs = redis.call('HGET', run_key, 'status')
if rs ~= 'running' or redis.call('HGET', run_key, 'turn') ~= turn then
  return {'stopped', rs or ''}
end
if s == 'ready' or s == 'gated' or (s == 'claimed' and again == '1') then
  redis.call('HSET', turn_key, field, 'claimed', 'claimant:' .. call_id, me)
  return {'ok', s}
end
return {'no', s or ''}
