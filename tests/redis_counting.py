"""A redis-py connection that records each command it sends (a script by its name): the
round trips of a piece of code, counted on a real Redis. A pipeline is one entry, its
commands joined by "+"."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from agent_core.script_loader import source

ROOT = Path(__file__).resolve().parent.parent


def script_shas(*packages: str) -> dict[str, str]:
    """Each script's SHA-1 (as EVALSHA sends it) → its name, for ``packages``' scripts."""
    return {
        hashlib.sha1(source(package, p.stem).encode()).hexdigest(): p.stem
        for package in packages
        for p in sorted((ROOT / package / "lua").glob("*.lua"))
    }


def recording(log: list[str], names: dict[str, str]) -> type[Connection]:
    """A connection class appending to ``log`` what each round trip sends."""

    class Recording(Connection):
        piped: list[str] | None = None

        def pack_command(self, *args: Any) -> Any:
            name = str(args[0]).upper()
            if name in ("EVALSHA", "EVAL"):
                sha = args[1] if name == "EVALSHA" else hashlib.sha1(str(args[1]).encode())
                name = names.get(sha if isinstance(sha, str) else sha.hexdigest(), name)
            (log if self.piped is None else self.piped).append(name)
            return super().pack_command(*args)

        def pack_commands(self, commands: Any) -> Any:
            self.piped = []
            try:
                return super().pack_commands(commands)
            finally:
                log.append("+".join(self.piped))
                self.piped = None

    return Recording


def record(redis: Redis, log: list[str], *packages: str) -> None:
    """Make ``redis`` (a single-node client) record its commands into ``log``."""
    redis.connection_pool.connection_class = recording(log, script_shas(*packages))
