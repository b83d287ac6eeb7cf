"""The agent of ``tests/soak/test_soak.py`` (``AGENT=tests.soak.soak_agent:agent``).

The top agent (``soak``) has a sub-agent (``soak_helper``), and that one a sub-sub-agent
(``soak_deep``): each has the same gated and un-gated tools, and reaches the next level through
an un-gated tool (``helper``, ``deep``) or a gated one (``helper_gated``, ``deep_gated``). A call
of one of those runs the sub-agent as a child run whose first user message is the call's
``task`` (the soak scripts its fake model by that text).

Three more gated tools exercise the routes, reminders, escalation and quorums: ``pay`` (its
cards in the approval channel ``FIN_CHANNEL``, decided by the ``FIN_GROUP`` user group only,
reminded after 1 s and escalated to ``ESCALATE_TO`` after 2 s), ``wire`` (two approvals, its
cards in the approval channel too, reminded) and ``vote`` (two approvals in the task's
thread, escalated). ``adjust`` may be edited before it is approved (its ``amount`` and
``note``), and ``ship`` allowed for the rest of its thread for ``GRANT_SECONDS`` (a grant,
which decides the thread's later ``ship`` calls). :data:`POLICIES` says the same for the
verdict.

Every tool appends ``start <tool> <op> <pid> <args hash>`` before its side effect and ``end
<tool> <op> <pid> <args hash>`` after it to the file named by ``SOAK_JOURNAL`` (the hash of the
arguments the tool received, as :func:`agent_core.gating.args_hash` computes it: the verdict
compares it with the gate's ``decided_hash``). ``op`` is unique per scripted call, so the soak
can count how many times each call really ran, across processes that are SIGKILLed at random
moments (a line written before the kill is in the page cache and survives it).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

from agent_core import Agent, tool
from agent_core.gating import args_hash
from tests.soak.config import (
    ESCALATE_AFTER,
    ESCALATE_TO,
    FIN_CHANNEL,
    FIN_GROUP,
    GRANT_SECONDS,
    REMIND_AFTER,
)


def _journal(event: str, tool_name: str, op: str, **args: Any) -> None:
    path = os.environ.get("SOAK_JOURNAL")
    if not path:
        return
    digest = args_hash({"op": op, **args})
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{event} {tool_name} {op} {os.getpid()} {digest}\n")


@tool(requires_approval=True)
async def act(op: str) -> str:
    """An irreversible operation (gated)."""
    _journal("start", "act", op)
    await asyncio.sleep(0.02)
    _journal("end", "act", op)
    return f"did {op}"


@tool(requires_approval=True)
def slow_act(op: str, seconds: float) -> str:
    """A slow irreversible operation (gated); a worker killed meanwhile leaves it in doubt."""
    _journal("start", "slow_act", op, seconds=seconds)
    time.sleep(seconds)
    _journal("end", "slow_act", op, seconds=seconds)
    return f"did {op}"


@tool(requires_approval=True, idempotent=True)
async def resync(op: str) -> str:
    """A gated operation that is safe to run again (idempotent)."""
    _journal("start", "resync", op)
    await asyncio.sleep(0.3)
    _journal("end", "resync", op)
    return f"did {op}"


@tool
def peek(op: str) -> str:
    """A read that needs no approval (still at most once: it is claimed like the others)."""
    _journal("start", "peek", op)
    _journal("end", "peek", op)
    return f"did {op}"


@tool(
    requires_approval=True,
    approvers=FIN_GROUP,
    approval_channel=FIN_CHANNEL,
    remind_after=REMIND_AFTER,
    escalate_after=ESCALATE_AFTER,
    escalate_to=ESCALATE_TO,
)
async def pay(op: str) -> str:
    """A payment: decided in the approval channel by the finance group (or, once escalated,
    by whom it was escalated to)."""
    _journal("start", "pay", op)
    await asyncio.sleep(0.02)
    _journal("end", "pay", op)
    return f"did {op}"


@tool(requires_approval=True, approvals=2, approval_channel=FIN_CHANNEL, remind_after=REMIND_AFTER)
async def wire(op: str) -> str:
    """A transfer that needs two approvers, decided in the approval channel."""
    _journal("start", "wire", op)
    await asyncio.sleep(0.02)
    _journal("end", "wire", op)
    return f"did {op}"


@tool(requires_approval=True, approvals=2, escalate_after=ESCALATE_AFTER, escalate_to=ESCALATE_TO)
async def vote(op: str) -> str:
    """A change that needs two approvers, in the task's thread; escalated after 2 s."""
    _journal("start", "vote", op)
    await asyncio.sleep(0.02)
    _journal("end", "vote", op)
    return f"did {op}"


@tool(requires_approval=True, editable=["amount", "note"])
async def adjust(op: str, amount: int, note: str) -> str:
    """An adjustment an approver may edit (its ``amount`` and ``note``, not its ``op``)."""
    _journal("start", "adjust", op, amount=amount, note=note)
    await asyncio.sleep(0.02)
    _journal("end", "adjust", op, amount=amount, note=note)
    return f"did {op}"


@tool(requires_approval=True, allow_for=GRANT_SECONDS)
async def ship(op: str, env: str) -> str:
    """A deploy an approver may allow for the rest of the thread (for ``GRANT_SECONDS``)."""
    _journal("start", "ship", op, env=env)
    await asyncio.sleep(0.02)
    _journal("end", "ship", op, env=env)
    return f"did {op}"


TOOLS = [act, slow_act, resync, peek, pay, wire, vote, adjust, ship]


@dataclass(frozen=True)
class Policy:
    """What the verdict expects of a tool's gates (the tool's options above)."""

    approvers: tuple[str, ...] = ()  # () : the APPROVERS setting
    channel: str = ""  # "": the task's thread
    approvals: int = 1
    remind: bool = False
    escalate_to: tuple[str, ...] = ()
    editable: tuple[str, ...] = ()  # the fields Edit & approve may change
    allow_for: float = 0.0  # > 0: Approve & allow (a grant for the thread)


POLICIES = {
    "pay": Policy((FIN_GROUP,), FIN_CHANNEL, 1, True, (ESCALATE_TO,)),
    "wire": Policy((), FIN_CHANNEL, 2, True),
    "vote": Policy((), "", 2, False, (ESCALATE_TO,)),
    "adjust": Policy(editable=("amount", "note")),
    "ship": Policy(allow_for=GRANT_SECONDS),
}
ROUTED = frozenset(t for t, p in POLICIES.items() if p.channel)
EDITABLE = frozenset(t for t, p in POLICIES.items() if p.editable)
GRANTABLE = frozenset(t for t, p in POLICIES.items() if p.allow_for)
QUORUM = frozenset(t for t, p in POLICIES.items() if p.approvals > 1)

deep_agent = Agent(
    name="soak_deep",
    instructions="You are the soak test's sub-sub-agent.",
    description="The soak's sub-sub-agent (depth 2).",
    tools=TOOLS,
)

helper_agent = Agent(
    name="soak_helper",
    instructions="You are the soak test's sub-agent.",
    description="The soak's sub-agent (depth 1).",
    tools=[
        *TOOLS,
        deep_agent.as_tool(name="deep"),
        deep_agent.as_tool(name="deep_gated", requires_approval=True),
    ],
)

agent = Agent(
    name="soak",
    instructions="You are the soak test's agent.",
    tools=[
        *TOOLS,
        helper_agent.as_tool(name="helper"),
        helper_agent.as_tool(name="helper_gated", requires_approval=True),
    ],
)

IDEMPOTENT = frozenset({"resync"})
# Sub-agent tools by the depth of the run that calls them: (un-gated, gated).
SUB_AGENT_TOOLS = {0: ("helper", "helper_gated"), 1: ("deep", "deep_gated")}
SUB_AGENTS = frozenset(t for pair in SUB_AGENT_TOOLS.values() for t in pair)
GATED_SUB_AGENTS = frozenset(gated for _, gated in SUB_AGENT_TOOLS.values())
MAX_DEPTH = len(SUB_AGENT_TOOLS)  # the deepest child run the soak starts
