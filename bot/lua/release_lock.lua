-- RELEASE_LOCK: release a lock only if this process still holds it.
-- KEYS: lock_key
-- ARGV: token
-- Returns: 1 if released, else 0.
--!include lock_guard.lua
local lock_key = KEYS[1]
local token = ARGV[1]
return release_if_held(lock_key, token)
