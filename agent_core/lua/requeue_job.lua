-- REQUEUE_JOB: put a job back at the end of the stream as a new entry (its run was busy):
-- the old entry is acknowledged and deleted, so waiting for a busy run never counts as a
-- failed delivery.
-- KEYS: jobs_key
-- ARGV: group, message id, then the job's field/value pairs
-- Returns: the new entry's id, or false when the entry is no longer pending (done
--   elsewhere).
local jobs_key = KEYS[1]
local group, msg_id = ARGV[1], ARGV[2]
if #ARGV < 4 or (#ARGV - 2) % 2 ~= 0 then return redis.error_reply('bad job fields') end
local p = redis.call('XPENDING', jobs_key, group, msg_id, msg_id, 1)
if #p == 0 then return false end
local id = redis.call('XADD', jobs_key, '*', unpack(ARGV, 3))
redis.call('XACK', jobs_key, group, msg_id)
redis.call('XDEL', jobs_key, msg_id)
return id
