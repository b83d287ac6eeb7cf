"""The agent the benchmarks run (``AGENT=tests.bench.agent:agent`` for worker processes).

``delete_user`` is always gated. When it starts it calls :data:`on_tool_start` (set by the
in-process pause benchmark to timestamp "decision → tool starting"); in worker subprocesses
nothing is set and the tool just returns.

``BENCH_OPENAI_NO_TRANSFORM=1`` (a what-if of the throughput benchmark, never the default)
makes ``AsyncCompletions.create`` post its parameters as they are, skipping openai-python's
parameter transform: it measures what the fix proposed in RESULTS.md would gain.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from agent_core import Agent, tool

TASK = "bench: delete user 42"

on_tool_start: Callable[[], None] | None = None


@tool(requires_approval=True)
async def delete_user(user_id: str) -> str:
    """Permanently delete a user."""
    if on_tool_start is not None:
        on_tool_start()
    return f"user {user_id} deleted"


agent = Agent(
    name="bench",
    instructions="You are a benchmark agent.",
    tools=[delete_user],
)


def _skip_openai_transform() -> None:
    from openai.resources.chat.completions import AsyncCompletions
    from openai.types.chat import ChatCompletion

    async def create(self: AsyncCompletions, **params: Any) -> ChatCompletion:
        assert not params.get("stream"), "the what-if client does not stream"
        return await self._post("/chat/completions", body=params, cast_to=ChatCompletion)

    AsyncCompletions.create = create  # type: ignore[assignment, method-assign]


if os.environ.get("BENCH_OPENAI_NO_TRANSFORM") == "1":
    _skip_openai_transform()
