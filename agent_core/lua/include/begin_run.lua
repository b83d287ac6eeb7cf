-- begin_run: BEGIN_RUN's step (the caller holds the lease), shared with ACQUIRE_LEASE,
-- which may take it in the same call. Returns {status} or {status, run hash as a flat list}.
local function begin_run(run_key, events_key, agent, nowstr)
  local st = redis.call('HGET', run_key, 'status')
  if st == 'queued' then
    redis.call('HSET', run_key, 'status', 'running', 'updated_at', nowstr)
    local r = redis.call('HMGET', run_key, 'run_id', 'task', 'requested_by', 'origin', 'agent')
    local data = '{"run_id":' .. cjson.encode(r[1]) .. ',"agent":' .. cjson.encode(r[5] or agent)
      .. ',"task":' .. cjson.encode(r[2]) .. ',"requested_by":' .. cjson.encode(r[3])
      .. ',"origin":' .. (r[4] or '{}') .. '}'
    redis.call('XADD', events_key, '*', 'type', 'run.started', 'run_id', r[1], 'data', data)
    st = 'running'
  elseif st == 'awaiting_approval' then
    if tonumber(redis.call('HGET', run_key, 'pending') or '0') > 0
      or tonumber(redis.call('HGET', run_key, 'children_pending') or '0') > 0 then
      return {st}
    end
    redis.call('HSET', run_key, 'status', 'running', 'updated_at', nowstr)
    st = 'running'
  end
  return {st, redis.call('HGETALL', run_key)}
end
