"""A TCP proxy in front of a real Redis that can lose a reply, as a failover or a dropped
connection does: the command reaches Redis and is applied, and its client never hears back.

:class:`LossyProxy` listens on a free port of 127.0.0.1 and forwards every connection to the
Redis behind it, byte for byte. :meth:`LossyProxy.lose_reply` arms it: the next request that
contains ``needle`` (a script's SHA, a key) is forwarded, then the connection is closed
before Redis's reply reaches the client. The client sees a connection error, and redis-py
retries the command on a new connection: what the retry is told is what the test checks.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class _Rule:
    needle: bytes
    times: int


@dataclass
class LossyProxy:
    """Forwards 127.0.0.1:<port> to ``host:port``; use ``async with`` to start and stop it."""

    target_host: str
    target_port: int
    lost: int = 0  # replies lost so far
    _rules: list[_Rule] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def lose_reply(self, needle: bytes, times: int = 1) -> None:
        """Lose the replies to the next ``times`` requests containing ``needle``."""
        self._rules.append(_Rule(needle, times))

    async def __aenter__(self) -> LossyProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        if self._tasks:  # connections their clients just closed end by themselves
            await asyncio.wait(set(self._tasks), timeout=1.0)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _armed(self, chunk: bytes) -> bool:
        for rule in self._rules:
            if rule.times > 0 and rule.needle in chunk:
                rule.times -= 1
                return True
        return False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_writer: asyncio.StreamWriter | None = None
        pumps: list[asyncio.Future[None]] = []
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
            cut = asyncio.Event()

            async def upstream() -> None:
                assert up_writer is not None
                while chunk := await reader.read(65536):
                    if self._armed(chunk):
                        cut.set()  # set before Redis can answer: its reply is dropped
                    up_writer.write(chunk)
                    await up_writer.drain()

            async def downstream() -> None:
                while chunk := await up_reader.read(65536):
                    if cut.is_set():
                        self.lost += 1
                        return  # the reply is dropped, and the connection closed
                    writer.write(chunk)
                    await writer.drain()

            pumps = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except (OSError, asyncio.CancelledError):
            pass  # the proxy is closing, or a side went away
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (writer, up_writer):
                if w is not None:
                    w.close()
                    with contextlib.suppress(OSError, asyncio.CancelledError):
                        await w.wait_closed()
            self._tasks.discard(task)
