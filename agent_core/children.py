"""Sub-agents: a call to an agent used as a tool runs as a child run in Redis.

The child lives in its parent's shard (its keys share the parent's hash tag), so its scripts
(SPAWN_CHILD, WAIT_CHILDREN, ``lua/include/report_child.lua``) touch one slot. The child
has its own history, turns and gates; its gates are shown on the parent's thread (the child's origin
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

from .models import requesters_of
from .script_replies import SpawnOutcome
from .scripts import Scripts

log = logging.getLogger(__name__)

DEFAULT_MAX_DEPTH = 5


def child_origin(run: dict[str, str], parent_agent: str, child_agent: str) -> dict[str, Any]:
    """The child's origin: the parent's (so its gates show on the parent's thread), with
    the parent run and the path of agents from the top."""
    origin: dict[str, Any] = json.loads(run.get("origin") or "{}")
    path = origin.get("path")
    if not isinstance(path, list) or not path:
        path = [parent_agent]
    return {**origin, "parent_run": run["run_id"], "path": [*path, child_agent]}


async def spawn(
    scripts: Scripts,
    run: dict[str, str],
    turn: int,
    call: dict[str, Any],
    parent_agent: str,
    child_agent: str,
    depth: int,
    now: str,
    fence: str,
    note: str = "",
) -> SpawnOutcome:
    """Start the child run of a parent's call with SPAWN_CHILD (under the parent's lease,
    ``fence``); the script's answer. ``note`` follows the child's answer in what the
    parent's model reads (an edited approval's)."""
    run_id = run["run_id"]
    child_id = scripts.keys.new_run_id(scripts.keys.shard_of(run_id))
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
    if call.get("gate_id"):  # its approval's gate: the child's end is audited there
        fields["parent_gate"] = str(call["gate_id"])
    if note:  # appended to its answer in the parent's call result (agent_core.editing)
        fields["parent_note"] = note
    res = await scripts.spawn_child(
        run_id,
        turn,
        fence,
        call_id=call["id"],
        child_id=child_id,
        first_message=json.dumps({"role": "user", "content": task}),
        now=now,
        fields=fields,
    )
    if res is SpawnOutcome.SPAWNED:
        log.info("run %s: sub-agent %s started as run %s", run_id, child_agent, child_id)
    return res
