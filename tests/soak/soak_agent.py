"""The agent of ``tests/soak/test_soak.py`` (``AGENT=tests.soak.soak_agent:agent``).

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


agent = Agent(
    name="soak",
    instructions="You are the soak test's agent.",
    tools=[act, slow_act, resync, peek],
)

IDEMPOTENT = frozenset({"resync"})
