-- FINISH_TURN: close a turn: append the tool messages in call order and hand back to the
-- model; with authors_key and inbox_key, also read what the model call needs
-- (READ_FOR_MODEL's reply), saving the next step a round trip.
-- KEYS: run_key, history_key, authors_key (optional), inbox_key (optional)
-- ARGV: fence, turn (guard), now, then the tool messages' JSON
-- Returns: the run hash (flat list), or with inbox_key {'read', n, the run hash's n values,
--   READ_FOR_MODEL's reply...}; 0 when the run is not running at that turn in phase
--   `tools`; 'lost' (status reply) when the lease is not the caller's. A retry after this
--   fence closed that turn (the first reply lost) gets the same kind of reply again.
local run_key, history_key, authors_key, inbox_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local fence, turn, nowstr = ARGV[1], ARGV[2], ARGV[3]
--!include lease.lua
--!include steps.lua
--!include slices.lua
--!include read_for_model.lua
if not holds(run_key, fence) then return {ok = 'lost'} end
local again = step_done(run_key, fence, 'finish:' .. turn)
if not again and (redis.call('HGET', run_key, 'status') ~= 'running'
  or redis.call('HGET', run_key, 'turn') ~= turn
  or redis.call('HGET', run_key, 'phase') ~= 'tools') then
  return 0
end
if not again then
  done_step(run_key, fence, 'finish:' .. turn)
  rpush_from(history_key, ARGV, 4)
  redis.call('HSET', run_key, 'phase', 'model', 'updated_at', nowstr)
end
if not inbox_key then return redis.call('HGETALL', run_key) end
local run = redis.call('HGETALL', run_key)
local out = {'read', #run}
for i = 1, #run do out[#out + 1] = run[i] end
local read = read_for_model(run_key, history_key, authors_key, inbox_key, fence)
for i = 1, #read do out[#out + 1] = read[i] end
return out
