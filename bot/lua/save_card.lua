-- SAVE_CARD: record where a card went. The first message of a gate becomes its card; any
-- other one (two processes posted it) joins `others` and the stored digest is cleared, so
-- that the next rendering updates them all.
-- KEYS: card_key (the card record)
-- ARGV: channel, ts, digest, ttl (seconds)
-- Returns: 1 for the card itself, 0 for another message.
local card_key = KEYS[1]
local channel, ts, digest, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('HGET', card_key, 'ts')
if (not cur) or cur == '' or cur == ts then
  redis.call('HSET', card_key, 'channel', channel, 'ts', ts, 'digest', digest)
  redis.call('EXPIRE', card_key, ttl)
  return 1
end
local others = redis.call('HGET', card_key, 'others') or ''
if not string.find(' ' .. others .. ' ', ' ' .. ts .. ' ', 1, true) then
  if others == '' then others = ts else others = others .. ' ' .. ts end
end
redis.call('HSET', card_key, 'others', others, 'digest', '')
redis.call('EXPIRE', card_key, ttl)
return 0
