-- Edit, then approve (agent_core.editing). The including script sets the locals
-- edited_json (the edited arguments' canonical JSON; '' for no edit: DECIDE_GATE's ARGV[10])
-- and edited_hash (their hash: its ARGV[11]); GRANT_GATE sets both ''. An edit is refused
-- unless the decision is an approval of a gate whose `editable` field lists fields, and
-- never on a quorum gate (`quorum` set). A recorded edit keeps the original `args` and
-- `args_hash`, adds `edited_args`, `edited_hash` and `edited_by`, and its hash becomes the
-- gate's `decided_hash`: the worker runs only arguments that hash to it.

-- Why an edit cannot be recorded on this gate (nil: no edit, or it can be).
local function edit_refused(gate_key, wanted)
  if edited_json == '' then return nil end
  if wanted ~= 'approved' or edited_hash == '' then return 'edit' end
  local editable = redis.call('HGET', gate_key, 'editable') or ''
  if editable == '' or editable == '[]' then return 'not_editable' end
  if (redis.call('HGET', gate_key, 'quorum') or '') ~= '' then return 'quorum' end
  return nil
end

-- Record the edit of an approval; the hash decided and the decision event's extra JSON.
local function record_edit(gate_key, status, by, seen)
  if edited_json == '' or status ~= 'approved' then return seen, '' end
  redis.call('HSET', gate_key, 'edited_args', edited_json, 'edited_hash', edited_hash,
    'edited_by', by)
  return edited_hash, ',"edited":true,"args_hash":' .. cjson.encode(seen)
    .. ',"edited_hash":' .. cjson.encode(edited_hash)
end
