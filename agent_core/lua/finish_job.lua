-- FINISH_JOB: acknowledge a job, delete it from the stream (one group reads jobs, so an
-- acknowledged job is never needed again) and release the run's lease. Only the lease
-- holder may: a worker that lost the lease leaves the job to the new owner.
-- KEYS: jobs_key, run_key
-- ARGV: group, message id, fence
-- Returns: 1 when done (a retry, its lease released by the first run, too), 0 when the
--   lease was lost (nothing written).
local jobs_key, run_key = KEYS[1], KEYS[2]
local group, msg_id, fence = ARGV[1], ARGV[2], ARGV[3]
if redis.call('HGET', run_key, 'fence') ~= fence then return 0 end
redis.call('XACK', jobs_key, group, msg_id)
redis.call('XDEL', jobs_key, msg_id)
redis.call('HSET', run_key, 'lease_until', '0')
return 1
