-- ACQUIRE_LEASE: take the lease of a run and, with events_key, begin it too (BEGIN_RUN's
-- step: one round trip instead of two when a job starts). A resume job names the turn it
-- resumes: with turn_key, that turn's hash comes back too when the run is still at that
-- turn, in phase `tools` (the calls to run next: one round trip fewer).
-- KEYS: run_key, events_key (optional), turn_key (optional)
-- ARGV: lease_ms, worker (its name, for people reading the run), agent (for run.started
--   when the run hash names none; with events_key), turn (with turn_key, else ''),
--   attempt (the caller's attempt id, optional: made once, kept across retries)
-- Returns: {'ok', fence, previous owner[, BEGIN_RUN's reply[, the turn's hash]]} |
--   {'busy', seconds left on the holder's lease} | {'missing'}. The previous owner is ''
--   unless this is a takeover: another worker's lease ran out without being released
--   (released leases have lease_until 0). A retry of an attempt that took the lease (its
--   reply lost) gets the same fence back, and BEGIN_RUN's reply again.
local run_key, events_key, turn_key = KEYS[1], KEYS[2], KEYS[3]
local lease_ms, worker, agent, turn, attempt = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
--!include clock.lua
--!include begin_run.lua
if redis.call('EXISTS', run_key) == 0 then return {'missing'} end
local n = now()
local held = tonumber(redis.call('HGET', run_key, 'lease_until') or '0')
local mine = attempt and attempt ~= '' and held > 0
  and redis.call('HGET', run_key, 'lease_attempt') == attempt
  and redis.call('HGET', run_key, 'lease_owner') == worker
if held > n and not mine then return {'busy', string.format('%.3f', held - n)} end
local before = redis.call('HGET', run_key, 'lease_owner') or ''
if held <= 0 or before == worker then before = '' end
local fence
if mine then
  fence = tonumber(redis.call('HGET', run_key, 'fence'))
else
  fence = redis.call('HINCRBY', run_key, 'fence', 1)
end
redis.call('HSET', run_key, 'lease_until', string.format('%.6f', n + tonumber(lease_ms) / 1000),
  'lease_owner', worker, 'lease_attempt', attempt or '')
if events_key then
  local began = begin_run(run_key, events_key, agent or '', string.format('%.6f', n))
  if turn_key and began[1] == 'running' and redis.call('HGET', run_key, 'turn') == turn
    and redis.call('HGET', run_key, 'phase') == 'tools' then
    began[3] = redis.call('HGETALL', turn_key)
  end
  return {'ok', tostring(fence), before, began}
end
return {'ok', tostring(fence), before}
