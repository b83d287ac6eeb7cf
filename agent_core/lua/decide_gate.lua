-- DECIDE_GATE: move a gate out of `pending`, exactly once. Gateway.decide_many calls it once
-- per gate: each gate is decided atomically, and only the last pending gate's decision
-- resumes the run. A person's decision that arrives after the deadline becomes `expired`:
-- the card said so. A retry of the attempt that decided (its reply lost) is told `applied`
-- again, not that it was decided already (by itself), and writes the attempt again (a WAIT
-- after it covers it).
-- KEYS: gate_key, run_key, deadlines_key, jobs_key, events_key, nudges_key (its pending
--   reminder and escalation are removed with the deadline), audit_key, audit_head_key (the
--   shard's audit trail: a decision, and each approval only counted, is recorded)
-- ARGV: gate_id, status (approved|denied|expired), by, reason, attempt (the decider's
--   attempt id, '' for none: made once, kept across retries), run_id (must match the
--   gate's), seen_hash (the arguments hash the decider saw; '' when not given: the gate's
--   own), mine (JSON list of the gate's quorum groups the decider is in, '' for none),
--   self_ok ('1': a requester may approve; else an approval by a requester is refused),
--   edited (the edited arguments' canonical JSON, '' for none), edited_hash (their hash;
--   see include/edits.lua: the gate records both, and decided_hash is the edited hash)
-- Returns: {outcome, gate hash as a flat list[, why]}; outcome is applied | decided (someone
--   else was first) | counted (an approval recorded towards the gate's quorum, which needs
--   more: still pending) | refused (an approval not recorded; why: requester | again |
--   group | not_member, see include/quorum.lua; edit | not_editable | quorum: an edit the
--   gate does not allow, see include/edits.lua) | missing | not_due (expiry asked too early)
--   | mismatch (seen_hash is not the gate's: nothing decided); the last three carry no hash.
local gate_key, run_key, deadlines_key, jobs_key, events_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local nudges_key, audit_key, audit_head_key = KEYS[6], KEYS[7], KEYS[8]
local gate_id, wanted, decider, why, attempt, run_id, seen_hash, mine, self_ok =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8] or '', ARGV[9] or '1'
local edited_json, edited_hash = ARGV[10] or '', ARGV[11] or ''
--!include decide.lua
return decide()
