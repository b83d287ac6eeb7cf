-- CONTINUE_RUN: continue a run's conversation with a user message. A finished run
-- (completed or failed) is queued again for its next turn: the message joins the history,
-- unless it has to wait behind messages already queued or the run failed in its tools phase
-- (that turn is closed first); then it joins the inbox. A run still working keeps the
-- message in its inbox until its next model turn (READ_FOR_MODEL). A cancelled run does not
-- continue. With a dedupe key (seen_key, e.g. a chat message's id), the message is handled
-- once: the key is written last, in this script, with the outcome, so a message is either
-- recorded and marked, or neither; a later call with the key answers 'duplicate', and a
-- retry of this very call (same token, after a lost reply) answers the outcome it had.
-- KEYS: run_key, history_key, authors_key, inbox_key, jobs_key, active_key, finished_key,
--   events_key, user_runs_key (the author's runs zset: the run joins their /agent status),
--   seen_key (optional: the dedupe key's record, Keys.seen_key, in the run's shard)
-- ARGV: run_id, message (the user message JSON), by, now, entry (inbox entry JSON: {"by":
--   …, "message": the user message JSON as a string}), token (this call's, with seen_key),
--   seen_ttl (the dedupe record's TTL in seconds, with seen_key)
-- Returns: 'started' | 'queued' | 'cancelled' | 'missing' | 'duplicate' as status replies.
local run_key, history_key, authors_key, inbox_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local jobs_key, active_key, finished_key, events_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local user_runs_key, seen_key = KEYS[9], KEYS[10]
local run_id, message, by, nowstr, entry, token, seen_ttl =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
--!include requesters.lua
local function answer(outcome)
  if seen_key then
    redis.call('SET', seen_key, 'continue:' .. token .. ':' .. outcome, 'EX', seen_ttl)
  end
  return {ok = outcome}
end
if seen_key then
  local seen = redis.call('GET', seen_key)
  if seen then
    local mine = 'continue:' .. token .. ':'
    if string.sub(seen, 1, #mine) == mine then return {ok = string.sub(seen, #mine + 1)} end
    return {ok = 'duplicate'}
  end
end
local st = redis.call('HGET', run_key, 'status')
if not st then return answer('missing') end
if st == 'cancelled' then return answer('cancelled') end
local queued = st ~= 'completed' and st ~= 'failed'
if queued then
  redis.call('RPUSH', inbox_key, entry)
else
  local phase = 'model'
  if st == 'failed' and redis.call('HGET', run_key, 'failed_phase') == 'tools' then
    phase = 'tools'
  end
  if phase == 'tools' or redis.call('LLEN', inbox_key) > 0 then
    redis.call('RPUSH', inbox_key, entry)
  else
    local n = redis.call('RPUSH', history_key, message)
    redis.call('HSET', authors_key, tostring(n - 1), by)
    redis.call('HSET', run_key, 'last_by', by)
    add_requesters(run_key, authors_key, {by})
  end
  redis.call('HSET', run_key, 'status', 'queued', 'phase', phase, 'final', '', 'error', '',
    'retryable', '0', 'pending', 0, 'children_pending', 0,
    'turns_from', redis.call('HGET', run_key, 'turn') or '0', 'updated_at', nowstr)
  redis.call('ZREM', finished_key, run_id)
  redis.call('ZADD', active_key, nowstr, run_id)
  redis.call('XADD', jobs_key, '*', 'type', 'start', 'run_id', run_id)
end
if user_runs_key then redis.call('ZADD', user_runs_key, nowstr, run_id) end
local origin = redis.call('HGET', run_key, 'origin') or '{}'
redis.call('XADD', events_key, '*', 'type', 'run.continued', 'run_id', run_id, 'data',
  '{"run_id":' .. cjson.encode(run_id) .. ',"by":' .. cjson.encode(by)
  .. ',"queued":' .. (queued and 'true' or 'false') .. ',"origin":' .. origin .. '}')
return answer(queued and 'queued' or 'started')
