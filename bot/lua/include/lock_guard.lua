-- release_if_held(lock_key, token): delete the lock if this token holds it; 1 if deleted.
local function release_if_held(lock_key, token)
  if redis.call('GET', lock_key) == token then return redis.call('DEL', lock_key) end
  return 0
end
