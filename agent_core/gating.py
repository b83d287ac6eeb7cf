"""Opening a turn's gates: one per call that needs approval, after the approver rules.

Every gate of a turn is opened by one script (OPEN_GATES), all or nothing. A call an
approver rule decided (:mod:`agent_core.approvers`) gets a gate too, opened already decided
by ``rule:<name>``: the card and the audit trail show who decided, as for a person.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import editing
from .agent import Agent
from .approvers import RULE_PREFIX, ApprovalRequest, consult
from .completions import clean_text
from .grants import allow_for_of, thread_of
from .models import requesters_of
from .nudges import Nudges
from .quorum import quorum_for, rule_approval
from .routes import ApprovalRoute, route_for
from .script_replies import GateToOpen, OpenOutcome
from .scripts import Scripts

log = logging.getLogger(__name__)


def args_hash(args: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the arguments (what the approver saw)."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class GatePlan:
    """A turn's gates, ready for OPEN_GATES (or RECORD_TURN, which opens them as it records
    the turn): the thread's top run (whose grants may decide a gate), how many the approver
    rules decided and the gates a grant may approve as they open (for the metrics)."""

    gates: list[GateToOpen]
    top_run: str
    by_rule: int = 0
    grantable: list[str] = field(default_factory=list)

    async def count(self, scripts: Scripts, res: OpenOutcome | None) -> None:
        """The metrics of gates opened (``res``: the script's answer)."""
        if res in (OpenOutcome.OK, OpenOutcome.DECIDED):
            from . import metrics  # on first use: `import agent_core` loads no prometheus_client

            metrics.GATES_OPENED.inc(len(self.gates) - self.by_rule)
            await metrics.count_granted(scripts.redis, scripts.keys, self.grantable)


async def open_gates(
    scripts: Scripts,
    agent: Agent,
    run: dict[str, str],
    turn: int,
    calls: list[dict[str, Any]],
    fence: str,
    indexes: list[int] | None = None,
    *,
    timeout: float,
    nudges: Nudges = Nudges(),
    routes: Mapping[str, ApprovalRoute] | None = None,
) -> OpenOutcome:
    """Open one gate per call; the script's answer (``ok``: the run paused, ``decided``: the
    rules decided every call, ``lost``, ``stopped``, ``stale``). See :func:`plan_gates`."""
    plan = await plan_gates(
        scripts, agent, run, turn, calls, indexes, timeout=timeout, nudges=nudges, routes=routes
    )
    res = await scripts.open_gates(run["run_id"], turn, fence, plan.gates, top_run=plan.top_run)
    await plan.count(scripts, res)
    if res is OpenOutcome.STALE:
        log.warning(
            "run %s: turn %s changed under this worker; gates not reopened", run["run_id"], turn
        )
    return res


async def plan_gates(
    scripts: Scripts,
    agent: Agent,
    run: dict[str, str],
    turn: int,
    calls: list[dict[str, Any]],
    indexes: list[int] | None = None,
    *,
    timeout: float,
    nudges: Nudges = Nudges(),
    routes: Mapping[str, ApprovalRoute] | None = None,
) -> GatePlan:
    """One gate per call of turn ``turn``, the approver rules consulted. ``indexes``: each
    call's position among the turn's calls (default: its position in ``calls``), by which
    gates are listed in call order. ``nudges``: the settings' reminder and escalation, for
    calls whose tool and agent set none. ``routes``: APPROVAL_ROUTES (see
    :mod:`agent_core.routes`), whose result each gate records: who may decide it and where
    its card goes."""
    run_id = run["run_id"]
    origin = json.loads(run.get("origin") or "{}")
    # Whoever spoke to the agent is a requester: everyone whose message the model had read
    # (the run's starter first), inherited from the top run by sub-agents.
    requesters = requesters_of(run)
    requested_by = run.get("requested_by") or (requesters[0] if requesters else "")
    nested = bool(run.get("parent"))
    path = origin.get("path") if nested else None
    if not isinstance(path, list):
        path = [agent.name]
    gates: list[GateToOpen] = []
    by_rule = 0
    grantable: list[str] = []  # gates a thread's grant may approve as they open
    for index, call in zip(indexes or range(len(calls)), calls, strict=True):
        t = agent.get_tool(call["name"])
        assert t is not None
        gid = call["gate_id"]
        digest = args_hash(call["args"])
        route = route_for(agent, t, routes)
        fields = {  # created_at and deadline are added by the script (Redis clock)
            "gate_id": gid,
            "run_id": run_id,
            "call_id": call["id"],
            "turn": str(turn),
            "index": str(index),
            "turn_gates": str(len(calls)),
            "tool": t.name,
            "description": t.description,
            "args": json.dumps(call["args"], ensure_ascii=False),
            "args_hash": digest,
            "status": "pending",
            "agent": agent.name,
            "requested_by": requested_by,
            "requesters": json.dumps(requesters),
            "origin": run.get("origin") or "{}",
            "timeout": str(timeout),
            "nested": "1" if nested else "0",
            "path": json.dumps(path),
            **t.nudges.over(agent.nudges).over(nudges).gate_fields(),
            "approvers": json.dumps(list(route.approvers)),
            "approval_channel": route.channel,
            **editing.gate_fields(t),  # editable and args_schema, for an editable tool
        }
        event = {
            "gate_id": gid,
            "run_id": run_id,
            "call_id": call["id"],
            "turn": turn,
            "index": index,
            "turn_gates": len(calls),
            "tool": t.name,
            "description": t.description,
            "args": call["args"],
            "args_hash": digest,
            "agent": agent.name,
            "requested_by": requested_by,
            "requesters": requesters,
            "origin": origin,
            "timeout": timeout,
            "nested": nested,
            "path": path,
            "approvers": list(route.approvers),
            "approval_channel": route.channel,
        }
        quorum = quorum_for(agent, t)
        if quorum is not None:  # more than one approver: counted by DECIDE_GATE
            fields.update(quorum=quorum.to_field(), approvals="[]")
            event["quorum"] = quorum.model_dump()
        elif grant_for := allow_for_of(agent, t):  # an approval may allow it in the thread
            fields["allow_for"] = event["allow_for"] = f"{grant_for:g}"
        decided = ""
        verdict = None
        if agent.approvers:
            request = ApprovalRequest(
                tool=t.name,
                args=dict(call["args"]),
                agent=agent.name,
                run_id=run_id,
                requested_by=requested_by,
                path=list(path),
                requesters=list(requesters),
                origin=dict(origin),
            )
            verdict = await consult(agent.approvers, request)  # type: ignore[arg-type]
        if verdict is not None and quorum is not None and verdict[0].decision == "approve":
            # A rule adds one approval to a quorum, never all of them: the gate stays open.
            v, name = verdict
            mark = rule_approval(name, digest, time.time(), clean_text(v.reason or "")[:2000])
            fields["approvals"] = json.dumps([mark])
            event["approvals"] = [mark]
            log.info(
                "run %s: %s approved by approver rule %s (1 of %s)",
                run_id,
                t.name,
                name,
                quorum.count,
            )
            verdict = None
        if verdict is not None:
            v, name = verdict
            status = "approved" if v.decision == "approve" else "denied"
            by, reason = RULE_PREFIX + name, clean_text(v.reason or "")[:2000]
            fields.update(status=status, decided_by=by, reason=reason, decided_hash=digest)
            event["decided_by"] = by
            decided = json.dumps(
                {
                    "gate_id": gid,
                    "run_id": run_id,
                    "call_id": call["id"],
                    "tool": t.name,
                    "status": status,
                    "by": by,
                    "reason": reason,
                    "rule": name,
                    "origin": origin,
                }
            )[:-1]
            by_rule += 1
            log.info("run %s: %s %s by approver rule %s", run_id, t.name, status, name)
        elif "allow_for" in fields:
            grantable.append(gid)
        # The script appends created_at and deadline and closes the object.
        gates.append(
            GateToOpen(gid, str(timeout), json.dumps(fields), json.dumps(event)[:-1], decided)
        )
    top = await thread_of(scripts.redis, scripts.keys, run)  # its grants may decide a gate
    return GatePlan(gates, top, by_rule, grantable)
