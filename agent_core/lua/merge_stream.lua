-- MERGE_STREAM: append entries of an old-layout stream to the new stream (see
-- agent_core.layout_merge). Entries the record or the stream already holds (the same id,
-- the same fields) are skipped, so running it twice appends nothing more.
-- KEYS: stream_key (the new stream), record_key (its merge record: hash of old entry id ->
--   new entry id)
-- ARGV: per entry: its old id, its field count n (names and values), then those n strings
-- Returns: how many entries were appended.
local stream, record = KEYS[1], KEYS[2]
local entries = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i + 1])
  if not n or n < 2 or n % 2 ~= 0 or i + 1 + n > #ARGV then
    return redis.error_reply('ERR MERGE_STREAM: malformed entry at ARGV ' .. i)
  end
  local fields = {}
  for j = 1, n do fields[j] = ARGV[i + 1 + j] end
  entries[#entries + 1] = {ARGV[i], fields}
  i = i + 2 + n
end
local function same(a, b)
  if #a ~= #b then return false end
  for j = 1, #a do
    if a[j] ~= b[j] then return false end
  end
  return true
end
local added = 0
for _, entry in ipairs(entries) do
  local old_id, fields = entry[1], entry[2]
  if redis.call('HEXISTS', record, old_id) == 0 then
    local there = redis.call('XRANGE', stream, old_id, old_id)
    if not (there[1] and same(there[1][2], fields)) then
      redis.call('HSET', record, old_id, redis.call('XADD', stream, '*', unpack(fields)))
      added = added + 1
    end
  end
end
return added
