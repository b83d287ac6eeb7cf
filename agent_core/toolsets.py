"""Toolsets: tools an agent gets from somewhere else than Python functions (MCP servers).

A toolset is opened once per worker process (connections, a first tool listing), asked for
its current tools at every model turn, and closed when the worker stops. Its tools are
ordinary :class:`~agent_core.tools.Tool` objects (usually a subclass that overrides
``validate`` and ``call``), so gates, claims and results treat them like local tools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .tools import Tool


@runtime_checkable
class Toolset(Protocol):
    """What :class:`~agent_core.agent.Agent` needs of a source of tools."""

    name: str
    """Short and unique within an agent; prefixes its tools' names when two sources collide."""

    async def open(self) -> None:
        """Connect and list the tools. A failure must not raise: an unreachable source is
        listed with no tools (or its last known ones) and retried later."""

    async def close(self) -> None:
        """Release connections; the toolset may be opened again."""

    def tools(self) -> Sequence[Tool]:
        """The tools known now (no I/O)."""

    @property
    def version(self) -> int:
        """Bumped whenever :meth:`tools` would return something else."""
