-- ACQUIRE_LEASE: take the lease of a run and, with events_key, begin it too (BEGIN_RUN's
-- step) and read what the job's first step needs, in the same round trip:
-- * a run in phase `model`: READ_FOR_MODEL's reply (the history for the model call is read
--   by the LRANGE the caller pipelines after this script);
-- * a resume job names the turn it resumes: with turn_key, when the run is still at that
--   turn in phase `tools`, that turn's hash and the hashes of the gates named (the job
--   carries them: DECIDE_GATE copies the run's `open_gates`), and, with a batch rule, the
--   approved calls claimed at once (CLAIM_CALL's step for each: state `gated` → `claimed`,
--   claimant fence:attempt), the worker then starting them together. A call is claimed so
--   only when its gate (of this run and turn) is approved without edits, and the call's
--   recorded `args_hash` is the hash the approver decided, in a run that is not a
--   sub-agent's: anything else is left to the per-call path (edits are validated by the
--   tool's own model before their claim; a child run's parent is checked first).
-- KEYS: run_key, events_key (optional), then with events_key: history_key, authors_key,
--   inbox_key (the model read), turn_key (optional), then the gate hashes named in ARGV
--   (optional)
-- ARGV: lease_ms, worker (its name, for people reading the run), agent (for run.started
--   when the run hash names none; with events_key), turn (with turn_key, else ''), attempt
--   (the caller's attempt id, optional: made once, kept across retries; also the claims'
--   attempt), batch (with turn_key: '' claims nothing, else JSON {"default": the agent of a
--   run naming none, "agents": {agent name: [tool names never claimed in a batch]}}: an
--   agent not listed claims nothing in a batch), then the gate ids of the gate hashes
-- Returns: {'ok', fence, previous owner[, began]} | {'busy', seconds left on the holder's
--   lease} | {'missing'}, began being {BEGIN_RUN's status, the run hash (flat, after the
--   read), the turn's hash | false, {gate hash (flat)...} | false, {call ids claimed} |
--   false, READ_FOR_MODEL's reply | false}. The previous owner is '' unless this is a
--   takeover: another worker's lease ran out without being released (released leases have
--   lease_until 0). A retry of an attempt that took the lease (its reply lost) gets the same
--   fence back, BEGIN_RUN's reply and its own claims again.
local run_key, events_key, history_key, authors_key, inbox_key, turn_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local lease_ms, worker, agent, turn, attempt, batch =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
--!include clock.lua
--!include begin_run.lua
--!include read_for_model.lua
if events_key and not inbox_key then return redis.error_reply('ACQUIRE_LEASE: bad keys') end
if #KEYS > 6 and #ARGV - 6 ~= #KEYS - 6 then
  return redis.error_reply('ACQUIRE_LEASE: bad gates')
end
local rule = nil
if batch and batch ~= '' then
  local ok, decoded = pcall(cjson.decode, batch)
  if not ok or type(decoded) ~= 'table' or type(decoded['agents']) ~= 'table' then
    return redis.error_reply('ACQUIRE_LEASE: bad batch rule')
  end
  rule = decoded
end
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
if not events_key then return {'ok', tostring(fence), before} end

-- The approved calls of the turn this job resumes, claimed as one batch (see the header).
local function claim_batch(gate_hashes)
  local claimed = {}
  if not rule then return claimed end
  -- A sub-agent's run claims call by call, once the worker has seen its parent is live: a
  -- parent ended by a crash mid-cascade leaves it to be cancelled, and what it claimed here
  -- would be reported as possibly run although it never started.
  local parent = redis.call('HGET', run_key, 'parent')
  if parent and parent ~= '' then return claimed end
  local name = redis.call('HGET', run_key, 'agent')
  if not name or name == '' then name = rule['default'] end
  local never = rule['agents'][name]
  if type(never) ~= 'table' then return claimed end
  local skip = {}
  for _, t in ipairs(never) do skip[t] = true end
  local run_id = redis.call('HGET', run_key, 'run_id')
  local me = tostring(fence) .. ':' .. (attempt or '')
  for i = 1, #gate_hashes do
    local g = {}
    local flat = gate_hashes[i]
    for j = 1, #flat, 2 do g[flat[j]] = flat[j + 1] end
    local cid = g['call_id']
    if g['status'] == 'approved' and g['run_id'] == run_id and g['turn'] == turn and cid
      and not g['edited_args'] and redis.call('HGET', turn_key, 'gate:' .. cid) == ARGV[6 + i] then
      local s = redis.call('HGET', turn_key, 'state:' .. cid)
      -- A record that does not decode is left to the per-call path (which fails the job).
      local ok, call = pcall(cjson.decode, redis.call('HGET', turn_key, 'call:' .. cid) or '')
      if s == 'gated' and ok and type(call) == 'table' then
        local seen = g['decided_hash']
        if not seen or seen == '' then seen = g['args_hash'] end
        if not skip[call['name']] and call['args_hash'] and call['args_hash'] == seen
          and g['args_hash'] == seen then
          redis.call('HSET', turn_key, 'state:' .. cid, 'claimed', 'claimant:' .. cid, me)
          claimed[#claimed + 1] = cid
        end
      elseif s == 'claimed' and attempt ~= ''
        and redis.call('HGET', turn_key, 'claimant:' .. cid) == me then
        claimed[#claimed + 1] = cid  -- this attempt's own claim (its first reply lost)
      end
    end
  end
  return claimed
end

local began = begin_run(run_key, events_key, agent or '', string.format('%.6f', n))
local out = {began[1], began[2] or false, false, false, false, false}
if began[1] == 'running' then
  local phase = redis.call('HGET', run_key, 'phase')
  if phase == 'model' then
    out[6] = read_for_model(run_key, history_key, authors_key, inbox_key, tostring(fence))
    out[2] = redis.call('HGETALL', run_key)  -- the run as the read left it
  elseif turn_key and phase == 'tools' and redis.call('HGET', run_key, 'turn') == turn then
    out[3] = redis.call('HGETALL', turn_key)
    local gates = {}
    for i = 7, #KEYS do gates[#gates + 1] = redis.call('HGETALL', KEYS[i]) end
    out[4] = gates
    out[5] = claim_batch(gates)
  end
end
return {'ok', tostring(fence), before, out}
