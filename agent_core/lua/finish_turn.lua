-- FINISH_TURN: close a turn: record the results of the calls this worker claimed and ran
-- (COMPLETE_CALL's step for each, with its event and a gated call's audit entry), append
-- the tool messages in call order and hand back to the model; with read, also read what the
-- model call needs (READ_FOR_MODEL's reply), saving the next step a round trip. The results
-- are recorded even when the run stopped meanwhile (a cancel: the calls had started; their
-- events say after_cancel), never without the lease.
-- KEYS: run_key, history_key, authors_key, inbox_key, turn_key, events_key, audit_key,
--   audit_head_key (the shard's audit trail), then the gate hashes of the gated calls whose
--   results are recorded
-- ARGV: fence, turn (guard), now, read ('1': read for the model, else '0'), the number of
--   results to record, then per result 5 values: call id, result text, tool.executed event
--   data JSON without its closing brace (after_cancel is appended), outcome (a gated call's
--   audit entry: executed | failed | in_doubt), its gate hash's position among the gate
--   KEYS (1-based; 0 for a call without gate); then the tool messages' JSON
-- Returns: the run hash (flat list), or with read {'read', n, the run hash's n values,
--   READ_FOR_MODEL's reply...} (the history: the LRANGE the caller pipelines after it); 0 when the run is not running at that turn in phase
--   `tools`; 'lost' (status reply) when the lease is not the caller's. A retry after this
--   fence closed that turn (the first reply lost) gets the same kind of reply again; a
--   result already recorded (not `claimed`) is not recorded again.
local run_key, history_key, authors_key, inbox_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local turn_key, events_key, audit_key, audit_head_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local fence, turn, nowstr, read, results = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
--!include lease.lua
--!include steps.lua
--!include slices.lua
--!include audit.lua
--!include read_for_model.lua
if not results or #ARGV < 5 + results * 5 or #KEYS < 8 then
  return redis.error_reply('FINISH_TURN: bad arguments')
end
if not holds(run_key, fence) then return {ok = 'lost'} end
local rs = redis.call('HGET', run_key, 'status')
local after = (rs == 'cancelled') and 'true' or 'false'
local run_id = redis.call('HGET', run_key, 'run_id')
for i = 1, results do
  local base = 5 + (i - 1) * 5
  local cid, gate_at = ARGV[base + 1], tonumber(ARGV[base + 5])
  if redis.call('HGET', turn_key, 'state:' .. cid) == 'claimed' then
    redis.call('HSET', turn_key, 'state:' .. cid, 'done', 'result:' .. cid, ARGV[base + 2])
    redis.call('XADD', events_key, '*', 'type', 'tool.executed', 'run_id', run_id,
      'data', ARGV[base + 3] .. ',"after_cancel":' .. after .. '}')
    if gate_at > 0 then
      audit(audit_key, audit_head_key, ARGV[base + 4], KEYS[8 + gate_at], {after_cancel = after})
    end
  end
end
local again = step_done(run_key, fence, 'finish:' .. turn)
if not again and (rs ~= 'running' or redis.call('HGET', run_key, 'turn') ~= turn
  or redis.call('HGET', run_key, 'phase') ~= 'tools') then
  return 0
end
if not again then
  done_step(run_key, fence, 'finish:' .. turn)
  rpush_from(history_key, ARGV, 6 + results * 5)
  redis.call('HSET', run_key, 'phase', 'model', 'updated_at', nowstr)
end
if read ~= '1' then return redis.call('HGETALL', run_key) end
local model_read = read_for_model(run_key, history_key, authors_key, inbox_key, fence)
local run = redis.call('HGETALL', run_key)  -- as the read left it (the inbox moved in)
local out = {'read', #run}
for i = 1, #run do out[#out + 1] = run[i] end
for i = 1, #model_read do out[#out + 1] = model_read[i] end
return out
