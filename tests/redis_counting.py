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


def request_commands(packed: bytes) -> list[list[bytes]]:
    """The first two arguments (at most) of each command in a RESP request: one per command
    of a pipeline."""
    out: list[list[bytes]] = []
    i = 0
    while i < len(packed):
        end = packed.index(b"\r\n", i)
        argc, i = int(packed[i + 1 : end]), end + 2
        args: list[bytes] = []
        for _ in range(argc):
            end = packed.index(b"\r\n", i)
            length, i = int(packed[i + 1 : end]), end + 2
            if len(args) < 2:
                args.append(packed[i : i + length])
            i += length + 2
        out.append(args)
    return out


def recording(log: list[str], names: dict[str, str]) -> type[Connection]:
    """A connection class appending to ``log`` what each round trip sends (what one write
    carries: every path to the socket, redis-py's and :mod:`agent_core.direct`'s)."""

    class Recording(Connection):
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            packed = (
                command
                if isinstance(command, bytes)
                else b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in command)
            )
            sent = []
            for args in request_commands(packed):
                name = args[0].decode().upper()
                if name in ("EVALSHA", "EVAL"):
                    sha = (
                        args[1].decode() if name == "EVALSHA" else hashlib.sha1(args[1]).hexdigest()
                    )
                    name = names.get(sha, name)
                sent.append(name)
            log.append("+".join(sent))
            await super().send_packed_command(command, check_health)

    return Recording


def record(redis: Redis, log: list[str], *packages: str) -> None:
    """Make ``redis`` (a single-node client) record its commands into ``log``."""
    redis.connection_pool.connection_class = recording(log, script_shas(*packages))
