"""Sub-agents: a call to an agent used as a tool runs as a child run in Redis.

The child lives in its parent's shard (its keys share the parent's hash tag), so the scripts
below, and :func:`~agent_core.scripts` ``report_child``, touch one slot. The child has its
own history, turns and gates; its gates are shown on the parent's thread (the child's origin
is the parent's, plus ``parent_run`` and the agent ``path``). Its outcome becomes the
parent call's result atomically with the child finishing (RECORD_TURN, and FAIL_RUN or
CANCEL_RUN of :mod:`agent_core.stopping`), and the parent is resumed once nothing else of
its turn is pending.

Run fields: a child has ``parent``, ``parent_call``, ``parent_turn`` and ``depth``; a parent
counts its unfinished children in ``children_pending`` (beside ``pending``, its open gates).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from redis.commands.core import AsyncScript

from .keys import Keys
from .models import requesters_of
from .scripts import _HELPERS

log = logging.getLogger(__name__)

DEFAULT_MAX_DEPTH = 5

# Start a child run for a parent's call, once: the call moves to `child` and the child run,
# its first message and its start job are written together. Running it again finds the call
# in `child` and writes nothing.
# KEYS[1] parent run hash, KEYS[2] parent turn hash, KEYS[3] child run hash, KEYS[4] child
# history list, KEYS[5] child authors hash, KEYS[6] active-runs zset, KEYS[7] jobs stream,
# KEYS[8] parent's children set
# ARGV[1] fence, ARGV[2] turn (guard), ARGV[3] call id, ARGV[4] child run id, ARGV[5] first
# message JSON, ARGV[6] now, ARGV[7..] child run hash field/value pairs
# Returns 'spawned' | 'lost' | 'stopped' (the parent is not running at that turn) | 'stale'
# (the call is neither ready nor approved) as status replies.
SPAWN_CHILD = (
    _HELPERS
    + """
if (#ARGV - 6) % 2 ~= 0 then return redis.error_reply('SPAWN_CHILD: bad arguments') end
if not holds(KEYS[1], ARGV[1]) then return {ok = 'lost'} end
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'turn') ~= ARGV[2] then
  return {ok = 'stopped'}
end
local field = 'state:' .. ARGV[3]
local s = redis.call('HGET', KEYS[2], field)
if s == 'child' then return {ok = 'spawned'} end
if s ~= 'ready' and s ~= 'gated' then return {ok = 'stale'} end
redis.call('HSET', KEYS[2], field, 'child', 'child:' .. ARGV[3], ARGV[4])
local i = 7
while i <= #ARGV do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('RPUSH', KEYS[4], ARGV[5])
redis.call('HSET', KEYS[5], '0', redis.call('HGET', KEYS[3], 'requested_by') or '')
redis.call('ZADD', KEYS[6], ARGV[6], ARGV[4])
redis.call('SADD', KEYS[8], ARGV[4])
redis.call('HINCRBY', KEYS[1], 'children_pending', 1)
redis.call('XADD', KEYS[7], '*', 'type', 'start', 'run_id', ARGV[4])
return {ok = 'spawned'}
"""
)

# Pause a parent whose turn waits for child runs; or tell it to go on when they all
# reported meanwhile (each report settled its call in the turn hash). The turn's calls still
# in `child` are what it waits for: with none, it goes on (and a stale count is reset);
# with some but none counted pending, they are orphans of a failure whose cancel cascade a
# crash cut short before the run was continued (FAIL_RUN counts none pending): the caller
# cancels their child runs (Stopper.cancel_orphans), which settles the calls.
# KEYS[1] parent run hash, KEYS[2] the turn's hash
# ARGV[1] fence, ARGV[2] turn (guard), ARGV[3] now
# Returns 'waiting' | 'go' | 'orphaned' | 'lost' | 'stopped' as status replies.
WAIT_CHILDREN = (
    _HELPERS
    + """
if not holds(KEYS[1], ARGV[1]) then return {ok = 'lost'} end
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
  or redis.call('HGET', KEYS[1], 'turn') ~= ARGV[2] then
  return {ok = 'stopped'}
end
local open = 0
for _, cid in ipairs(cjson.decode(redis.call('HGET', KEYS[2], 'order') or '[]')) do
  if redis.call('HGET', KEYS[2], 'state:' .. cid) == 'child' then open = open + 1 end
end
local counted = tonumber(redis.call('HGET', KEYS[1], 'children_pending') or '0')
if open == 0 then
  if counted ~= 0 then redis.call('HSET', KEYS[1], 'children_pending', 0) end
  return {ok = 'go'}
end
if counted <= 0 then return {ok = 'orphaned'} end
redis.call('HSET', KEYS[1], 'status', 'awaiting_approval', 'updated_at', ARGV[3])
return {ok = 'waiting'}
"""
)


def parent_keys(keys: Keys, run_id: str, run: dict[str, str]) -> list[str]:
    """KEYS for a script that may report to the run's parent: the parent's hash, the
    parent's turn hash and the shard's jobs stream; for a run without parent, its own hash
    twice (never written as a parent: the report is skipped) and the jobs stream."""
    shard = keys.shard_of(run_id)
    parent = run.get("parent")
    if not parent:
        return [keys.run(run_id), keys.run(run_id), keys.jobs(shard)]
    return [keys.run(parent), keys.turn(parent, int(run.get("parent_turn") or 0)), keys.jobs(shard)]


def child_origin(run: dict[str, str], parent_agent: str, child_agent: str) -> dict[str, Any]:
    """The child's origin: the parent's (so its gates show on the parent's thread), with
    the parent run and the path of agents from the top."""
    origin: dict[str, Any] = json.loads(run.get("origin") or "{}")
    path = origin.get("path")
    if not isinstance(path, list) or not path:
        path = [parent_agent]
    return {**origin, "parent_run": run["run_id"], "path": [*path, child_agent]}


async def spawn(
    script: AsyncScript,
    keys: Keys,
    run: dict[str, str],
    turn: int,
    call: dict[str, Any],
    parent_agent: str,
    child_agent: str,
    depth: int,
    now: str,
    fence: str,
) -> str:
    """Start the child run of a parent's call with SPAWN_CHILD (under the parent's lease,
    ``fence``); the script's answer."""
    run_id = run["run_id"]
    shard = keys.shard_of(run_id)
    child_id = keys.new_run_id(shard)
    task = str(call["args"].get("task", ""))
    fields = {
        "run_id": child_id,
        "agent": child_agent,
        "task": task,
        # The top run's starter and everyone the parent's model had read: the self-approval
        # rule applies to each of them at every depth.
        "requested_by": run.get("requested_by", ""),
        "requesters": json.dumps(requesters_of(run)),
        "origin": json.dumps(child_origin(run, parent_agent, child_agent)),
        "status": "queued",
        "phase": "model",
        "turn": "0",
        "pending": "0",
        "created_at": now,
        "updated_at": now,
        "parent": run_id,
        "parent_call": call["id"],
        "parent_turn": str(turn),
        "depth": str(depth),
    }
    res = str(
        await script(
            keys=[
                keys.run(run_id),
                keys.turn(run_id, turn),
                keys.run(child_id),
                keys.history(child_id),
                keys.authors(child_id),
                keys.active(shard),
                keys.jobs(shard),
                keys.children(run_id),
            ],
            args=[
                fence,
                turn,
                call["id"],
                child_id,
                json.dumps({"role": "user", "content": task}),
                now,
                *(x for kv in fields.items() for x in kv),
            ],
        )
    )
    if res == "spawned":
        log.info("run %s: sub-agent %s started as run %s", run_id, child_agent, child_id)
    return res
