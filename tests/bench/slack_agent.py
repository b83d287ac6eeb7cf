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


def _dump_tasks_on_sigusr1(path: str) -> None:
    """SLACK_BENCH_TASK_DUMP=FILE: ``kill -USR1`` a web or worker process of the benchmark to
    write the stack of every pending asyncio task to FILE (for a process that stalls)."""
    import asyncio
    import gc
    import io
    import signal

    def dump(signum: int, frame: object) -> None:
        out = io.StringIO()
        for obj in gc.get_objects():
            if isinstance(obj, asyncio.Task) and not obj.done():
                out.write(f"=== {obj.get_name()} {obj.get_coro()!r}\n")
                obj.print_stack(limit=40, file=out)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"--- pid {os.getpid()} at {time.time():.3f}\n" + out.getvalue())

    signal.signal(signal.SIGUSR1, dump)


if os.environ.get("SLACK_BENCH_TASK_DUMP"):
    _dump_tasks_on_sigusr1(os.environ["SLACK_BENCH_TASK_DUMP"])
