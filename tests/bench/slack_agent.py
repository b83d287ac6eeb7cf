"""The agent of the Slack latency benchmark (``AGENT=tests.bench.slack_agent:agent``).

``delete_user`` is always gated. The first thing it does is append ``<user_id> <t>`` to the
file named by ``SLACK_BENCH_JOURNAL``, where ``t`` is ``time.monotonic()`` (CLOCK_MONOTONIC,
one clock for every process of the machine), so the benchmark can compute click → tool start
across processes.
"""

from __future__ import annotations

import os
import time
from typing import TextIO

from agent_core import Agent, tool

_journal: TextIO | None = None


def _write(line: str) -> None:
    global _journal
    path = os.environ.get("SLACK_BENCH_JOURNAL")
    if not path:
        return
    if _journal is None:
        _journal = open(path, "a", encoding="utf-8")
    _journal.write(line)
    _journal.flush()


@tool(requires_approval=True)
async def delete_user(user_id: str) -> str:
    """Permanently delete a user."""
    _write(f"{user_id} {time.monotonic():.6f}\n")
    return f"user {user_id} deleted"


agent = Agent(
    name="slack-bench",
    instructions="You are the Slack latency benchmark agent.",
    tools=[delete_user],
)
