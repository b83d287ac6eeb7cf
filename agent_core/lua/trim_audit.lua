-- TRIM_AUDIT: remove a shard's audit entries older than a cut (AUDIT_RETENTION), keeping
-- the chain verifiable: the `prev` of the first entry kept becomes the head's `anchor` (and
-- the last entry removed its `anchor_id`), where agent-audit verify starts. When no entry
-- is kept, the anchor is the head's own hash (the next entry's prev).
-- KEYS: audit_key, audit_head_key
-- ARGV: cut (a stream id: the entries before it go), limit (the most removed in one call)
-- Returns: the number of entries removed.
local audit_key, audit_head_key = KEYS[1], KEYS[2]
local cut, limit = ARGV[1], tonumber(ARGV[2])
local old = redis.call('XRANGE', audit_key, '-', '(' .. cut, 'COUNT', limit)
if #old == 0 then return 0 end
local last = old[#old][1]
local kept = redis.call('XRANGE', audit_key, '(' .. last, '+', 'COUNT', 1)
local anchor = redis.call('HGET', audit_head_key, 'hash') or ''
if #kept > 0 then
  local f = kept[1][2]
  for i = 1, #f - 1, 2 do
    if f[i] == 'prev' then anchor = f[i + 1] end
  end
  redis.call('XTRIM', audit_key, 'MINID', kept[1][1])
else
  redis.call('XTRIM', audit_key, 'MAXLEN', 0)
end
redis.call('HSET', audit_head_key, 'anchor', anchor, 'anchor_id', last)
return #old
