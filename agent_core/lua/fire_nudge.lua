-- FIRE_NUDGE: fire one reminder or escalation of a gate, once. Only while the gate is
-- pending and before its deadline: it sets `reminded_at` (or `escalated_at`), removes the
-- entry and appends gate.reminded (or gate.escalated) to the shard's events stream, all at
-- once. Whatever else it finds, the entry is dropped and nothing fires: a second sweeper (or
-- a retry) finds no entry, and a decided, closed or purged gate is never nudged.
-- KEYS: gate_key, nudges_key, events_key, audit_key, audit_head_key (the shard's audit trail)
-- ARGV: gate_id, step ('remind' | 'escalate')
-- Returns: {outcome, gate hash as a flat list when fired}; outcome is fired | gone (no
--   entry: fired already, or removed by a decision) | not_due | not_pending | late (past
--   the deadline: the expiry comes next).
local gate_key, nudges_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local audit_key, audit_head_key = KEYS[4], KEYS[5]
local gate_id, step = ARGV[1], ARGV[2]
--!include clock.lua
--!include audit.lua
if step ~= 'remind' and step ~= 'escalate' then
  return redis.error_reply('FIRE_NUDGE: bad step')
end
local member = step .. ':' .. gate_id
local due = redis.call('ZSCORE', nudges_key, member)
if not due then return {'gone'} end
local tnow = now()
if tnow < tonumber(due) then return {'not_due'} end
redis.call('ZREM', nudges_key, member)
if redis.call('HGET', gate_key, 'status') ~= 'pending' then return {'not_pending'} end
local fired_field = (step == 'remind') and 'reminded_at' or 'escalated_at'
if (redis.call('HGET', gate_key, fired_field) or '') ~= '' then return {'gone'} end
if tnow >= tonumber(redis.call('HGET', gate_key, 'deadline')) then return {'late'} end
local nowstr = string.format('%.6f', tnow)
redis.call('HSET', gate_key, fired_field, nowstr)
local g = redis.call('HMGET', gate_key, 'run_id', 'call_id', 'tool', 'deadline',
  'escalate_to', 'origin', 'remind_at', 'escalate_at')
local data = '{"gate_id":' .. cjson.encode(gate_id) .. ',"run_id":' .. cjson.encode(g[1])
  .. ',"call_id":' .. cjson.encode(g[2]) .. ',"tool":' .. cjson.encode(g[3])
  .. ',"step":' .. cjson.encode(step) .. ',"at":' .. nowstr .. ',"deadline":' .. g[4]
  .. ',"remind_at":' .. cjson.encode(g[7] or '') .. ',"escalate_at":' .. cjson.encode(g[8] or '')
  .. ',"escalate_to":' .. (g[5] or '[]') .. ',"origin":' .. (g[6] or '{}') .. '}'
local kind = (step == 'remind') and 'gate.reminded' or 'gate.escalated'
redis.call('XADD', events_key, '*', 'type', kind, 'run_id', g[1], 'data', data)
audit(audit_key, audit_head_key, (step == 'remind') and 'reminded' or 'escalated', gate_key,
  {at = nowstr, to = (step == 'escalate') and (g[5] or '[]') or nil})
return {'fired', redis.call('HGETALL', gate_key)}
