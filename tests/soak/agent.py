"""The soak's agent: one gated tool whose side effects are journaled with their op id."""

from __future__ import annotations

import os
import time

from agent_core import Agent, tool


def _journal(line: str) -> None:
    with open(os.environ["SOAK_JOURNAL"], "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@tool(requires_approval=True)
def act(op: str) -> str:
    """Perform an irreversible operation (gated)."""
    _journal(f"start {op}")
    time.sleep(float(os.environ.get("SOAK_TOOL_SECONDS", "0.05")))
    _journal(f"end {op}")
    return f"did {op}"


agent = Agent(name="soak", instructions="Soak test agent.", tools=[act])
