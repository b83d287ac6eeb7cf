-- ANNOUNCE_WORKER: record that a worker is alive. Writes its record with seen_at (now) and
-- started_at (kept from the worker's previous record), removes stale or unreadable records,
-- and sets the hash to expire once the slowest live worker is overdue.
-- KEYS: presence_key (the deployment's presence hash)
-- ARGV: worker (its name), record (JSON, without times), stale_after (STALE_AFTER)
-- Returns: now (the Redis clock, as a string).
local presence_key = KEYS[1]
local worker, record, stale_after = ARGV[1], ARGV[2], ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ok, rec = pcall(cjson.decode, record)
if not ok or type(rec) ~= 'table' or type(rec.every) ~= 'number' then
  return redis.error_reply('ERR invalid presence record')
end
local stale = tonumber(stale_after)
rec.started_at = now
local old = redis.call('HGET', presence_key, worker)
if old then
  local ok2, prev = pcall(cjson.decode, old)
  if ok2 and type(prev) == 'table' and type(prev.started_at) == 'number' then
    rec.started_at = prev.started_at
  end
end
rec.seen_at = now
redis.call('HSET', presence_key, worker, cjson.encode(rec))
local longest = rec.every
local all = redis.call('HGETALL', presence_key)
for i = 1, #all, 2 do
  local ok3, r = pcall(cjson.decode, all[i + 1])
  if not ok3 or type(r) ~= 'table' or type(r.seen_at) ~= 'number'
      or type(r.every) ~= 'number' or now - r.seen_at > stale * r.every then
    redis.call('HDEL', presence_key, all[i])
  elseif r.every > longest then
    longest = r.every
  end
end
redis.call('PEXPIRE', presence_key, math.ceil((stale * longest + 1) * 1000))
return tostring(now)
