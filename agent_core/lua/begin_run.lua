-- BEGIN_RUN: take a run to `running` when a job for it starts.
-- KEYS: run_key, events_key
-- ARGV: fence, agent (when the run hash names none), now
-- Returns: {status after the call, run hash as a flat list}: running, awaiting_approval
--   (gates still pending) or the finished status; {''} when the run does not exist;
--   {'lost'} when the lease is no longer the caller's.
local run_key, events_key = KEYS[1], KEYS[2]
local fence, agent, nowstr = ARGV[1], ARGV[2], ARGV[3]
--!include lease.lua
--!include begin_run.lua
if not redis.call('HGET', run_key, 'status') then return {''} end
if not holds(run_key, fence) then return {'lost'} end
return begin_run(run_key, events_key, agent, nowstr)
