"""A real aiohttp server in a background daemon thread, for test doubles.

:class:`ThreadedServer` runs its own event loop in a daemon thread and listens on a free
port of 127.0.0.1 (or the ``host`` and ``port`` given), so in-process code and subprocesses
alike can reach it. :class:`~agent_core.testing.FakeOpenAI` and the tests' ``FakeSlack``
(``tests/slack_fake``) are built on it; a subclass gives its routes in
:meth:`ThreadedServer.make_app`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

from aiohttp import web

__all__ = ["ThreadedServer"]

_T = TypeVar("_T")


class ThreadedServer:
    """An aiohttp server serving :meth:`make_app` in a daemon thread with its own loop.

    Use it as a context manager or call :meth:`start` / :meth:`stop`. ``name`` (default: the
    class's) names the thread and the server in errors; ``reuse_address`` is passed to
    :class:`aiohttp.web.TCPSite`.
    """

    def __init__(
        self,
        *,
        name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        reuse_address: bool | None = None,
    ) -> None:
        self._label = name or type(self).__name__
        self._host = host
        self._requested_port = port
        self._reuse_address = reuse_address
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    def make_app(self) -> web.Application:
        """The application to serve (called in the server's loop at each start)."""
        raise NotImplementedError(f"{type(self).__name__} must define make_app()")

    async def _on_stop(self) -> None:
        """Clean up in the server's loop before the runner is; a subclass hook."""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        """Start serving in a background daemon thread; returns ``self``."""
        if self._thread is not None:
            raise RuntimeError(f"{self._label} is already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=serve, name=self._label, daemon=True)
        self._thread.start()
        if not ready.wait(timeout=10):
            raise RuntimeError(f"{self._label} did not start within 10 s")
        if failure:
            self._thread.join()
            self._thread = None
            self._loop = None
            raise RuntimeError(f"{self._label} failed to start: {failure[0]!r}") from failure[0]
        return self

    async def _start_site(self) -> None:
        runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(
            runner, self._host, self._requested_port, reuse_address=self._reuse_address
        )
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    def stop(self) -> None:
        """Stop the server and join its thread. Safe to call twice."""
        thread, loop, runner = self._thread, self._loop, self._runner
        if thread is None or loop is None:
            return
        if runner is not None:
            asyncio.run_coroutine_threadsafe(self._on_stop(), loop).result(timeout=10)
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._thread = None
        self._loop = None
        self._runner = None
        self._port = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The TCP port it listens on (only while started)."""
        if self._port is None:
            raise RuntimeError(f"{self._label} is not started")
        return self._port

    def _run_coroutine(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Schedule ``coro`` on the server's loop from any thread."""
        if self._loop is None:
            coro.close()
            raise RuntimeError(f"{self._label} is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)
