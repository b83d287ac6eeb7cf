"""The agent of ``tests/soak/test_soak.py`` (``AGENT=tests.soak.soak_agent:agent``).

The top agent (``soak``) has a sub-agent (``soak_helper``), and that one a sub-sub-agent
(``soak_deep``): each has the same gated and un-gated tools, and reaches the next level through
an un-gated tool (``helper``, ``deep``) or a gated one (``helper_gated``, ``deep_gated``). A call
of one of those runs the sub-agent as a child run whose first user message is the call's
``task`` (the soak scripts its fake model by that text).

Every tool appends ``start <tool> <op> <pid>`` before its side effect and ``end <tool> <op>
<pid>`` after it to the file named by ``SOAK_JOURNAL``. ``op`` is unique per scripted call, so
the soak can count how many times each call really ran, across processes that are SIGKILLed
at random moments (a line written before the kill is in the page cache and survives it).
"""

from __future__ import annotations

import asyncio
import os
import time

from agent_core import Agent, tool


def _journal(event: str, tool_name: str, op: str) -> None:
    path = os.environ.get("SOAK_JOURNAL")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{event} {tool_name} {op} {os.getpid()}\n")


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
    _journal("start", "slow_act", op)
    time.sleep(seconds)
    _journal("end", "slow_act", op)
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


TOOLS = [act, slow_act, resync, peek]

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
