"""Real MCP servers for the agent_mcp tests, and an in-process worker to run agents.

The items server (``items_server.py``) runs as a real process: spawned by the toolset over
stdio, or started here over streamable HTTP or SSE on a free port of 127.0.0.1. Every
process is ended by its PID at teardown.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import Agent
from agent_core.testing import FakeOpenAI
from agent_mcp import MCPServerStdio
from tests.core.conftest import core_settings
from tests.core.harness import Harness

ITEMS_SERVER = Path(__file__).with_name("items_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_journal(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def effects(path: Path) -> list[str]:
    """The journal without the ``start <pid>`` lines: the tools' side effects."""
    return [line for line in read_journal(path) if not line.startswith("start ")]


def server_pids(path: Path) -> list[int]:
    """The PIDs of every items server that wrote to this journal, in start order."""
    return [int(line.split()[1]) for line in read_journal(path) if line.startswith("start ")]


def is_items_server(pid: int) -> bool:
    try:
        return ITEMS_SERVER.name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def kill9(pid: int) -> None:
    """SIGKILL an items server and wait until it is gone (it may be another's child)."""
    os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        if not is_items_server(pid):  # a zombie has no command line
            return
        time.sleep(0.01)
    raise AssertionError(f"items server {pid} survived SIGKILL")


def stdio_items(name: str, journal: Path, *args: str, **options: Any) -> MCPServerStdio:
    """The items server over stdio, as a toolset (the toolset spawns it)."""
    return MCPServerStdio(
        name,
        sys.executable,
        [str(ITEMS_SERVER), "--journal", str(journal), "--name", name, *args],
        **options,
    )


class ItemsServer:
    """The items server over HTTP (``transport`` "http" or "sse") on a port of its own,
    which it keeps across :meth:`kill` and :meth:`start`."""

    def __init__(self, journal: Path, log: Path, transport: str, name: str) -> None:
        self.journal, self.log, self.transport, self.name = journal, log, transport, name
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        path = "/mcp" if self.transport == "http" else "/sse"
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> ItemsServer:
        args = ["--journal", str(self.journal), "--name", self.name]
        args += ["--transport", self.transport, "--port", str(self.port)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(ITEMS_SERVER), *args], stdout=out, stderr=out
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"items server exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                return self
            except OSError:
                time.sleep(0.02)
        raise AssertionError(f"items server not listening in 20 s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Path]:
    """The items servers' journal; every items server that wrote to it is ended at
    teardown (the toolsets stop theirs; this is the safety net)."""
    path = tmp_path / "journal.txt"
    yield path
    for pid in server_pids(path):
        if is_items_server(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def http_items(tmp_path: Path, journal: Path) -> Iterator[Callable[..., ItemsServer]]:
    """``http_items(transport="http", name="items")``: a started items server."""
    servers: list[ItemsServer] = []

    def make(transport: str = "http", name: str = "items") -> ItemsServer:
        server = ItemsServer(journal, tmp_path / f"server{len(servers)}.log", transport, name)
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.kill()


@pytest.fixture
async def run_agent(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI
) -> AsyncIterator[Callable[[Agent], Awaitable[Harness]]]:
    """``await run_agent(agent)``: a worker serving the agent in the test's event loop
    (it opens the agent's toolsets), and a gateway to start runs and decide gates."""
    made: list[Harness] = []

    async def make(agent: Agent) -> Harness:
        h = Harness(redis, core_settings(redis_url, fake_openai.base_url), agent)
        made.append(h)
        h.start_worker()
        return h

    yield make
    for h in made:
        await h.close()
