-- READ_FOR_MODEL: what a model call needs, in one step: the lease as it stands (by the Redis
-- clock) and, with the LRANGE after it, the history. A worker paused before this point (and taken over) stops here
-- instead of paying for a model call on a stale history. Under a current lease, in phase
-- `model`, the messages queued in the run's inbox (Gateway.continue_run while it worked)
-- are first moved to the history, in order, with their authors: in one script, so none is
-- lost or given twice. Otherwise read-only. (A script, not MULTI with TIME: Redis Cluster
-- refuses a keyless command in a transaction.)
-- KEYS: run_key, history_key, authors_key, inbox_key
-- ARGV: fence
-- Returns: {fence, lease_until, turn, phase, now (seconds, as a string)}; the history is
--   read by an LRANGE the caller pipelines right after this script.
local run_key, history_key, authors_key, inbox_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local fence = ARGV[1]
--!include read_for_model.lua
return read_for_model(run_key, history_key, authors_key, inbox_key, fence)
