-- GRANT_GATE: "Approve & allow": approve a pending gate exactly as DECIDE_GATE does
-- (include/decide.lua) and, in the same step, record a grant that approves the thread's later
-- matching calls of the same agent and tool (agent_core.grants, include/grants.lua). Only a
-- gate whose tool allows grants (its `allow_for` field), with no quorum, can be granted; the
-- grant's agent, tool and approver list are the gate's own, and it ends at `until` (at most
-- the gate's allow_for from now). A retry of the attempt that decided is told `applied`
-- again and records nothing twice.
-- KEYS: gate_key, run_key, deadlines_key, jobs_key, events_key, nudges_key, audit_key,
--   audit_head_key (as DECIDE_GATE's; the trail gets the approval, then `granted`),
--   grants_key (the thread's grants: its top run's), live_key (the shard's live grants)
-- ARGV: gate_id, by, reason, attempt, run_id, seen_hash, self_ok (as DECIDE_GATE's), grant_id,
--   until (Redis clock), grant JSON ({scope, field, value, note, team}), max_grants (of a
--   thread, revoked and expired ones included)
-- Returns: DECIDE_GATE's reply ({outcome, gate hash[, why]}), the gate's `granted` field
--   naming the grant when one was recorded; or {'not_allowed'} (the tool allows no grant,
--   or the gate needs a quorum) | {'too_many'} | {'bad_until'}.
local gate_key, run_key, deadlines_key, jobs_key, events_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local nudges_key, audit_key, audit_head_key = KEYS[6], KEYS[7], KEYS[8]
local grants_key, live_key = KEYS[9], KEYS[10]
local gate_id, decider, why, attempt, run_id, seen_hash, self_ok =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local grant_id, untilnum, spec, max_grants =
  ARGV[8], tonumber(ARGV[9]), cjson.decode(ARGV[10]), tonumber(ARGV[11])
local wanted, mine = 'approved', ''
local edited_json, edited_hash = '', ''  -- an approval that grants edits nothing
--!include clock.lua
--!include decide.lua
local g = redis.call('HMGET', gate_key, 'allow_for', 'quorum', 'status', 'granted')
local allow_for = tonumber(g[1] or '')
if g[3] == 'pending' then
  if not allow_for or allow_for <= 0 or (g[2] or '') ~= '' then return {'not_allowed'} end
  if not untilnum or untilnum > now() + allow_for + 1 then return {'bad_until'} end
  if redis.call('HLEN', grants_key) >= max_grants then return {'too_many'} end
end
local reply = decide()
if reply[1] ~= 'applied' or g[4] then return reply end
local d = redis.call('HMGET', gate_key, 'status', 'decided_attempt', 'decided_by', 'agent',
  'tool', 'approvers')
if d[1] ~= 'approved' or d[2] ~= attempt or d[3] ~= decider then return reply end
local tnow = now()
local record = {id = grant_id, scope = spec['scope'], agent = d[4], tool = d[5],
  approvers = d[6], field = spec['field'] or '', value = spec['value'] or '',
  expires_at = untilnum, granted_by = decider, self_ok = self_ok, note = spec['note'],
  team = spec['team'] or '', gate_id = gate_id, created_at = tnow}
redis.call('HSET', grants_key, grant_id, cjson.encode(record))
redis.call('ZADD', live_key, untilnum, grant_id)
redis.call('ZREMRANGEBYSCORE', live_key, '-inf', tnow)
redis.call('HSET', gate_key, 'granted', grant_id)
redis.call('XADD', events_key, '*', 'type', 'grant.created', 'run_id', run_id, 'data',
  cjson.encode(record))
audit(audit_key, audit_head_key, 'granted', gate_key, {by = decider, grant_id = grant_id,
  ['until'] = string.format('%.6f', untilnum), field = record['field'],
  value = record['value']})
return {'applied', redis.call('HGETALL', gate_key)}
