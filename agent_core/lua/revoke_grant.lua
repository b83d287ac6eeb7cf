-- REVOKE_GRANT: end a grant now (agent_core.grants). A call whose gate has not been opened
-- yet asks a person again; calls its grant already approved stay approved.
-- KEYS: grants_key (the thread's grants), live_key (the shard's live grants), events_key,
--   audit_key, audit_head_key (the shard's audit trail: `revoked`)
-- ARGV: grant_id, by, run_id (the thread's top run, for the event)
-- Returns: 'revoked' | 'ended' (revoked or expired already) | 'missing'
local grants_key, live_key, events_key, audit_key, audit_head_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local grant_id, by, run_id = ARGV[1], ARGV[2], ARGV[3]
--!include clock.lua
--!include audit.lua
local raw = redis.call('HGET', grants_key, grant_id)
if not raw then return {ok = 'missing'} end
local g = cjson.decode(raw)
local tnow = now()
if g['revoked_at'] or tonumber(g['expires_at']) <= tnow then return {ok = 'ended'} end
g['revoked_at'] = tnow
g['revoked_by'] = by
redis.call('HSET', grants_key, grant_id, cjson.encode(g))
redis.call('ZREM', live_key, grant_id)
redis.call('XADD', events_key, '*', 'type', 'grant.revoked', 'run_id', run_id, 'data',
  cjson.encode({grant_id = grant_id, scope = g['scope'], agent = g['agent'], tool = g['tool'],
    granted_by = g['granted_by'], by = by, revoked_at = tnow, gate_id = g['gate_id']}))
audit(audit_key, audit_head_key, 'revoked', false, {gate_id = g['gate_id'], run_id = run_id,
  tool = g['tool'], by = by, at = string.format('%.6f', tnow), grant_id = grant_id,
  granted_by = g['granted_by']})
return {ok = 'revoked'}
