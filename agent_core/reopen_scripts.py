"""Lua scripts that put a stopped run back to work: a retry after its model call kept
failing (Gateway.retry_run), and the next message of its conversation (Gateway.continue_run).

As in :mod:`agent_core.scripts`: each names its KEYS and ARGV in a header comment, every key
arrives in KEYS, and running one twice changes nothing more.
"""

from __future__ import annotations

from .scripts import _HELPERS

# Continue a run that failed retryably (its model call kept failing) from the step it
# failed in: nothing that ran runs again, since every earlier step is recorded.
# A sub-agent's run is retried only while its parent still waits for it: the parent's call
# is still `child` in its turn, for this very run, and the parent has not finished. Once the
# parent took the failure as the call's result (that happens with the failure itself) the
# child's answer would reach nobody: the caller is told to retry the top run instead.
# KEYS[1] run hash, KEYS[2] finished-runs zset, KEYS[3] active-runs zset, KEYS[4] jobs
# stream, KEYS[5] events stream, KEYS[6] parent run hash, KEYS[7] parent turn hash (for a
# run without parent: KEYS[1] twice, never read)
# ARGV[1] run id, ARGV[2] by, ARGV[3] now, ARGV[4] the parent run id ('' for none) and
# ARGV[5] its turn, as the caller read them (a mismatch means KEYS[6..7] are not the
# parent's: nothing is written), ARGV[6] this call's attempt id (recorded as
# `retry_attempt`: a re-run of the same attempt, its first reply lost, answers 'queued'
# again and writes nothing, whatever the run did since)
# Returns 'queued' | 'missing' | 'not_failed' | 'not_retryable' | 'parent_moved_on' (a
# sub-agent's run its parent no longer waits for) | 'retry' (read the parent again) as
# status replies.
RETRY_RUN = """
local r = redis.call('HMGET', KEYS[1], 'status', 'parent', 'parent_turn', 'parent_call',
  'retry_attempt')
local st = r[1]
if not st then return {ok = 'missing'} end
if ARGV[6] ~= '' and r[5] == ARGV[6] then return {ok = 'queued'} end
if st ~= 'failed' then return {ok = 'not_failed'} end
if (r[2] or '') ~= ARGV[4] or (r[2] and (r[3] or '0') ~= ARGV[5]) then
  return {ok = 'retry'}
end
if r[2] then
  local pst = redis.call('HGET', KEYS[6], 'status')
  if not r[4] or not pst or pst == 'completed' or pst == 'failed' or pst == 'cancelled'
    or redis.call('HGET', KEYS[7], 'state:' .. r[4]) ~= 'child'
    or redis.call('HGET', KEYS[7], 'child:' .. r[4]) ~= ARGV[1] then
    return {ok = 'parent_moved_on'}
  end
end
if redis.call('HGET', KEYS[1], 'retryable') ~= '1' then return {ok = 'not_retryable'} end
local phase = redis.call('HGET', KEYS[1], 'failed_phase') or 'model'
redis.call('HSET', KEYS[1], 'status', 'queued', 'phase', phase, 'error', '',
  'retryable', '0', 'retried_by', ARGV[2], 'retry_attempt', ARGV[6], 'updated_at', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'retries', 1)
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
redis.call('XADD', KEYS[4], '*', 'type', 'start', 'run_id', ARGV[1])
local origin = redis.call('HGET', KEYS[1], 'origin') or '{}'
redis.call('XADD', KEYS[5], '*', 'type', 'run.retried', 'run_id', ARGV[1], 'data',
  '{"run_id":' .. cjson.encode(ARGV[1]) .. ',"by":' .. cjson.encode(ARGV[2])
  .. ',"origin":' .. origin .. '}')
return {ok = 'queued'}
"""

# Continue a run's conversation with a user message. A finished run (completed or failed)
# is queued again for its next turn: the message joins the history, unless it has to wait
# behind messages already queued or the run failed in its tools phase (that turn is closed
# first); then it joins the inbox. A run still working keeps the message in its inbox until
# its next model turn (READ_FOR_MODEL). A cancelled run does not continue.
# With a dedupe key (KEYS[10], e.g. a chat message's id), the message is handled once: the
# key is written last, in this script, with the outcome, so a message is either recorded
# and marked, or neither; a later call with the key answers 'duplicate', and a retry of
# this very call (same ARGV[6], after a lost reply) answers the outcome it had.
# KEYS[1] run hash, KEYS[2] history list, KEYS[3] authors hash, KEYS[4] inbox list,
# KEYS[5] jobs stream, KEYS[6] active-runs zset, KEYS[7] finished-runs zset,
# KEYS[8] events stream, KEYS[9] the author's runs zset (the run joins their /agent status),
# KEYS[10] the dedupe key's record (optional; Keys.seen_key, in the run's shard)
# ARGV[1] run id, ARGV[2] user message JSON, ARGV[3] by, ARGV[4] now,
# ARGV[5] inbox entry JSON ({"by": …, "message": the user message JSON as a string}),
# ARGV[6] this call's token, ARGV[7] the dedupe record's TTL in seconds (both with KEYS[10])
# Returns 'started' | 'queued' | 'cancelled' | 'missing' | 'duplicate' as status replies.
CONTINUE_RUN = (
    _HELPERS
    + """
local function answer(outcome)
  if KEYS[10] then
    redis.call('SET', KEYS[10], 'continue:' .. ARGV[6] .. ':' .. outcome, 'EX', ARGV[7])
  end
  return {ok = outcome}
end
if KEYS[10] then
  local seen = redis.call('GET', KEYS[10])
  if seen then
    local mine = 'continue:' .. ARGV[6] .. ':'
    if string.sub(seen, 1, #mine) == mine then return {ok = string.sub(seen, #mine + 1)} end
    return {ok = 'duplicate'}
  end
end
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return answer('missing') end
if st == 'cancelled' then return answer('cancelled') end
local queued = st ~= 'completed' and st ~= 'failed'
if queued then
  redis.call('RPUSH', KEYS[4], ARGV[5])
else
  local phase = 'model'
  if st == 'failed' and redis.call('HGET', KEYS[1], 'failed_phase') == 'tools' then
    phase = 'tools'
  end
  if phase == 'tools' or redis.call('LLEN', KEYS[4]) > 0 then
    redis.call('RPUSH', KEYS[4], ARGV[5])
  else
    local n = redis.call('RPUSH', KEYS[2], ARGV[2])
    redis.call('HSET', KEYS[3], tostring(n - 1), ARGV[3])
    redis.call('HSET', KEYS[1], 'last_by', ARGV[3])
    add_requesters(KEYS[1], KEYS[3], {ARGV[3]})
  end
  redis.call('HSET', KEYS[1], 'status', 'queued', 'phase', phase, 'final', '', 'error', '',
    'retryable', '0', 'pending', 0, 'children_pending', 0, 'turns_from', redis.call('HGET', KEYS[1], 'turn') or '0',
    'updated_at', ARGV[4])
  redis.call('ZREM', KEYS[7], ARGV[1])
  redis.call('ZADD', KEYS[6], ARGV[4], ARGV[1])
  redis.call('XADD', KEYS[5], '*', 'type', 'start', 'run_id', ARGV[1])
end
if KEYS[9] then redis.call('ZADD', KEYS[9], ARGV[4], ARGV[1]) end
local origin = redis.call('HGET', KEYS[1], 'origin') or '{}'
redis.call('XADD', KEYS[8], '*', 'type', 'run.continued', 'run_id', ARGV[1], 'data',
  '{"run_id":' .. cjson.encode(ARGV[1]) .. ',"by":' .. cjson.encode(ARGV[3])
  .. ',"queued":' .. (queued and 'true' or 'false') .. ',"origin":' .. origin .. '}')
return answer(queued and 'queued' or 'started')
"""
)
