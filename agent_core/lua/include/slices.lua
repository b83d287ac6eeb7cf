-- HSET/RPUSH of argv[first..] in slices: unpack() of thousands of values overflows Lua's C
-- stack.
local function hset_from(key, argv, first)
  local i = first
  while i <= #argv do
    local last = math.min(i + 399, #argv)
    redis.call('HSET', key, unpack(argv, i, last))
    i = last + 1
  end
end
local function rpush_from(key, argv, first)
  local i = first
  while i <= #argv do
    local last = math.min(i + 399, #argv)
    redis.call('RPUSH', key, unpack(argv, i, last))
    i = last + 1
  end
end
