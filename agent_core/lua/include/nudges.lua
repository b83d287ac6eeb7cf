-- Reminders and escalation (agent_core.nudges): a pending gate's steps are entries of the
-- shard's nudges sorted set, `remind:<gate id>` and `escalate:<gate id>`, scored by when
-- they are due. schedule_nudges writes `remind_at` / `escalate_at` into the gate from its
-- `remind_after` / `escalate_after` fields (a step not before the deadline is skipped).
local function schedule_nudges(gate_key, nudges_key, gid, tnow, fields, timeout)
  for _, step in ipairs({'remind', 'escalate'}) do
    local after = tonumber(fields[step .. '_after'] or '')
    if after and after > 0 and after < timeout then
      local at = string.format('%.6f', tnow + after)
      redis.call('HSET', gate_key, step .. '_at', at)
      redis.call('ZADD', nudges_key, at, step .. ':' .. gid)
    end
  end
end
-- drop_nudges: a decided gate is reminded and escalated no more.
local function drop_nudges(nudges_key, gid)
  redis.call('ZREM', nudges_key, 'remind:' .. gid, 'escalate:' .. gid)
end
