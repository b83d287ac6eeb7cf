"""Approval routes: who may decide a tool's calls, and the Slack channel its cards go to.

A route is set on a tool (``@tool(approvers=..., approval_channel=...)``), on an agent
(``Agent(approver_ids=..., approval_channel=...)``) or by the APPROVAL_ROUTES setting (a map
tool → route, which covers MCP tools too). Each part is taken from the first of these that
sets it: APPROVAL_ROUTES, then the tool, then the agent; approvers set nowhere mean the
global APPROVERS setting, a channel set nowhere means the task's own thread.

The route is written into the gate when it opens (its ``approvers`` and
``approval_channel`` fields), so every process that judges a click reads the same list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .agent import Agent
    from .tools import Tool

# A user (U…, W…), a user group (S…) or "*"; a channel (C… public, G… private, D… a DM).
_APPROVER_ID = re.compile(r"^(\*|[UWS][A-Z0-9]{2,20})$")
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{2,20}$")

ApproverIds = str | Sequence[str] | None


@dataclass(frozen=True)
class ApprovalRoute:
    """Who may decide (Slack IDs; empty: the global APPROVERS) and where the card goes
    (a channel ID; empty: the task's thread)."""

    approvers: tuple[str, ...] = ()
    channel: str = ""


def approver_ids(value: ApproverIds, what: str) -> tuple[str, ...]:
    """``"S0FIN"``, ``"U1, U2"`` or ``["U1", "S0FIN"]`` → a tuple of IDs; ValueError (naming
    ``what``) for anything that is not a user, user group or ``*``."""
    if value is None:
        return ()
    if isinstance(value, str):
        items = [s.strip() for s in value.split(",")]
    elif isinstance(value, Sequence) and all(isinstance(s, str) for s in value):
        items = [s.strip() for s in value]
    else:
        raise ValueError(f"{what} must be a Slack ID or a list of them")
    items = [s for s in items if s]
    for i, s in enumerate(items, 1):
        if not _APPROVER_ID.match(s):
            raise ValueError(f"{what}: entry {i} is not a user (U…/W…), a user group (S…) or *")
    return tuple(dict.fromkeys(items))


def channel_id(value: str | None, what: str) -> str:
    """A channel ID (``C…``, ``G…``, ``D…``), or ``""`` for none; ValueError otherwise."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not _CHANNEL_ID.match(value.strip()):
        raise ValueError(f"{what} must be a channel ID like C0123ABCD (not a #name)")
    return value.strip()


def parse_routes(spec: str) -> dict[str, ApprovalRoute]:
    """APPROVAL_ROUTES: a JSON object, tool name → ``{"channel": "C…", "approvers": "S…"}``
    (``approvers`` a string or a list). ValueError, one line naming the entry, otherwise."""
    try:
        raw = json.loads(spec)
    except ValueError:
        raise ValueError(
            "is not JSON (a JSON object of tool name → {channel, approvers})"
        ) from None
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object of tool name → {channel, approvers}")
    routes: dict[str, ApprovalRoute] = {}
    for name, entry in raw.items():
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise ValueError(f"{name[:64]!r} is not a tool name")
        if not isinstance(entry, dict):
            raise ValueError(f"{name}: must be an object with channel and/or approvers")
        unknown = sorted(set(entry) - {"channel", "approvers"})
        if unknown:
            raise ValueError(f"{name}: unknown key {unknown[0][:40]!r} (channel, approvers)")
        channel = entry.get("channel")
        if channel is not None and not isinstance(channel, str):
            raise ValueError(f"{name}.channel must be a channel ID like C0123ABCD")
        routes[name] = ApprovalRoute(
            approver_ids(entry.get("approvers"), f"{name}.approvers"),
            channel_id(channel, f"{name}.channel"),
        )
    return routes


def route_for(
    agent: Agent, tool: Tool, routes: Mapping[str, ApprovalRoute] | None = None
) -> ApprovalRoute:
    """The route of ``tool``'s calls in ``agent``: each part from APPROVAL_ROUTES (``routes``,
    by the name the model sees), else the tool, else the agent."""
    setting = (routes or {}).get(tool.name, ApprovalRoute())
    return ApprovalRoute(
        setting.approvers or tool.approvers or approver_ids(agent.approver_ids, agent.name),
        setting.channel or tool.approval_channel or agent.approval_channel,
    )
