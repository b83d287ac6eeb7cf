-- A step (kind and turn) written under a fence, recorded in the run hash's `step`, so that a
-- retry of that step (its first reply lost) recognises its own effect (invariant 11).
local function done_step(run_key, fence, step)
  redis.call('HSET', run_key, 'step', fence .. ':' .. step)
end
local function step_done(run_key, fence, step)
  return redis.call('HGET', run_key, 'step') == fence .. ':' .. step
end
