"""More than one approver: a call that needs ``approvals=2`` (any two distinct people) or one
approver from each of several Slack user groups (``approvals=["S0SRE", "S0SECURITY"]``).

The quorum is set on a tool (``@tool(approvals=...)``) or on the agent (``Agent(approvals=
...)``; the tool's wins) and written into the gate when it opens (its ``quorum`` field).
Each approval is recorded in the gate's ``approvals`` list by DECIDE_GATE, atomically; the
approval that completes the quorum decides the gate ``approved``. Nobody counts twice, a
requester never counts (unless self-approval is allowed), a single denial ends the gate, and
an approver rule adds at most one approval: it never satisfies a quorum alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from .agent import Agent
    from .tools import Tool

ApprovalsOption = int | Sequence[str] | None
MAX_APPROVALS = 10
_GROUP = re.compile(r"^S[A-Z0-9]{2,20}$")


class Quorum(BaseModel):
    """How many approvals a gate needs: ``count`` distinct people, or one member of each of
    ``groups`` (then ``count`` is the number of groups)."""

    count: int
    groups: list[str] = Field(default_factory=list)

    def to_field(self) -> str:
        """The gate hash's ``quorum`` field."""
        return json.dumps({"count": self.count, "groups": self.groups})

    @classmethod
    def from_field(cls, raw: str | None) -> Quorum | None:
        """The quorum a gate hash's ``quorum`` field holds; None when absent or unreadable."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return cls(count=int(data["count"]), groups=[str(g) for g in data.get("groups") or []])
        except (ValueError, KeyError, TypeError):
            return None


class Approval(BaseModel):
    """One approval counted towards a gate's quorum: who (a user id, or ``rule:<name>``),
    when (Redis clock), the arguments hash they saw, and the group it filled ('' if none)."""

    by: str
    at: float = 0.0
    hash: str = ""
    group: str = ""
    reason: str = ""


def approvals_of(raw: str | None) -> list[Approval]:
    """The gate hash's ``approvals`` field (a JSON list), as records."""
    try:
        items = json.loads(raw or "[]")
    except ValueError:
        return []
    if not isinstance(items, list):  # Lua's cjson writes an empty list as {}
        return []
    out: list[Approval] = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("by"), str):
            out.append(
                Approval(
                    by=item["by"],
                    at=float(item.get("at") or 0),
                    hash=str(item.get("hash") or ""),
                    group=str(item.get("group") or ""),
                    reason=str(item.get("reason") or ""),
                )
            )
    return out


def check_approvals(value: object, where: str) -> ApprovalsOption:
    """``value`` as a valid ``approvals=`` option (an int, or a tuple of user-group ids), or
    ValueError with one line naming ``where`` (``tool refund``, ``agent ops``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | list | tuple):
        raise ValueError(
            f"{where}: approvals must be a number of approvers (2 to {MAX_APPROVALS}) or a "
            f"list of Slack user-group IDs, not {value!r}"
        )
    if isinstance(value, int):
        if not 1 <= value <= MAX_APPROVALS:
            raise ValueError(
                f"{where}: approvals must be between 1 and {MAX_APPROVALS}, not {value}"
            )
        return value
    groups = tuple(value)
    if not 1 <= len(groups) <= MAX_APPROVALS:
        raise ValueError(f"{where}: approvals lists 1 to {MAX_APPROVALS} user groups")
    bad = [g for g in groups if not (isinstance(g, str) and _GROUP.match(g))]
    if bad:
        raise ValueError(
            f"{where}: approvals lists user-group IDs (S followed by capitals and digits, as "
            f"S0SRE); {bad[0]!r} is not one"
        )
    if len(set(groups)) != len(groups):
        raise ValueError(f"{where}: approvals names a user group twice")
    return groups


def quorum_of(option: ApprovalsOption) -> Quorum | None:
    """The quorum an ``approvals=`` option asks for; None for a single approval."""
    if option is None or isinstance(option, int):
        return Quorum(count=option) if option and option > 1 else None
    return Quorum(count=len(option), groups=list(option))


def quorum_for(agent: Agent, tool: Tool) -> Quorum | None:
    """The quorum of a call of ``tool`` by ``agent``: the tool's ``approvals``, else the
    agent's; None when one approval is enough."""
    option = tool.approvals if tool.approvals is not None else agent.approvals
    return quorum_of(option)


def needed(quorum: Quorum | None) -> int:
    return quorum.count if quorum is not None else 1


def counted(quorum: Quorum | None, approvals: list[Approval]) -> int:
    """How many of the needed approvals are in (a group quorum counts filled groups)."""
    if quorum is None:
        return 0
    if quorum.groups:
        return len({a.group for a in approvals if a.group in quorum.groups})
    return len(approvals)


def unfilled_groups(quorum: Quorum | None, approvals: list[Approval]) -> list[str]:
    """A group quorum's groups that still need an approver, in order."""
    if quorum is None:
        return []
    filled = {a.group for a in approvals}
    return [g for g in quorum.groups if g not in filled]


def rule_approval(name: str, digest: str, at: float, reason: str) -> dict[str, Any]:
    """The approval an approver rule adds to a gate that needs several (it opens pending)."""
    return {"by": f"rule:{name}", "at": f"{at:.6f}", "hash": digest, "group": "", "reason": reason}


def approvers_told(
    decided_by: str | None, reason: str | None, approvals: list[Approval]
) -> list[tuple[str, str | None]]:
    """Who approved, with their reasons, for what the model is told: every counted approval
    of a quorum, or the one decider."""
    if approvals:
        return [(a.by, a.reason or None) for a in approvals]
    return [(decided_by or "", reason)]
