"""A TCP proxy on 127.0.0.1 that can lose a reply, for tests of a lost answer.

Between a client and a server (a ``redis-server``), :class:`TcpProxy` forwards bytes both
ways. Armed with :meth:`TcpProxy.lose_reply`, it forwards the next request that contains
every given byte string, waits for the server's answer, drops it and closes both
connections: the server applied the request, the client never hears of it, as after a
failover or a network cut. The client's own retry (redis-py reconnects and sends the
command again) then goes through. Real sockets; no client is patched.

It suits clients that wait for each answer before the next request (redis-py outside
pipelines): the first bytes the server sends after the matching request are its answer.
The proxy runs its own event loop in a thread, so it works under blocking test code too.

    with TcpProxy(server.port) as proxy:
        client = create_redis(proxy.url_for(redis_url))
        proxy.lose_reply(b"EVALSHA", sha.encode())
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpProxy"]

_WINDOW = 1 << 16  # bytes of a request kept for matching across reads


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``target``; can lose the answer to one request."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.lost = 0  # answers dropped so far
        self._lock = threading.Lock()
        self._needles: tuple[bytes, ...] = ()
        self._armed = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # --- control (any thread) ---------------------------------------------------------
    def start(self) -> TcpProxy:
        """Listen on a free port of 127.0.0.1 (``self.port``)."""
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._serve, "127.0.0.1", 0)
                )
                self.port = int(self._server.sockets[0].getsockname()[1])
            except BaseException as exc:  # reported to start()
                failed.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="tcp-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failed:
            raise failed[0]
        return self

    def url_for(self, url: str) -> str:
        """``url`` (a redis:// URL of the target) with the proxy's address instead."""
        parts = urlsplit(url)
        return urlunsplit(parts._replace(netloc=f"127.0.0.1:{self.port}"))

    def lose_reply(self, *needles: bytes, times: int = 1) -> None:
        """Lose the answer to each of the next ``times`` requests containing every needle."""
        if not needles:
            raise ValueError("give at least one byte string to recognise the request by")
        with self._lock:
            self._needles = needles
            self._armed = times

    @property
    def armed(self) -> int:
        """How many answers are still to be lost."""
        with self._lock:
            return self._armed

    def close(self) -> None:
        """Stop listening and close every connection."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- the proxy's own loop ---------------------------------------------------------
    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        # A connection accepted just before has a task that has not started yet: let it
        # start, then end every task of this loop, so that no socket outlives the loop
        # (a ResourceWarning later, in whichever test the garbage collector runs).
        await asyncio.sleep(0)
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _matches(self, window: bytes) -> bool:
        with self._lock:
            if self._armed <= 0 or not all(n in window for n in self._needles):
                return False
            self._armed -= 1
            return True

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        s_writer: asyncio.StreamWriter | None = None
        try:
            s_reader, s_writer = await asyncio.open_connection(*self.target)
            lose_next = asyncio.Event()

            async def upstream() -> None:
                assert s_writer is not None
                window = b""
                while data := await c_reader.read(65536):
                    window = (window + data)[-_WINDOW:]
                    if self._matches(window):
                        window = b""
                        lose_next.set()
                    s_writer.write(data)
                    await s_writer.drain()

            async def downstream() -> None:
                while data := await s_reader.read(65536):
                    if lose_next.is_set():  # the matching request's answer: never delivered
                        with self._lock:
                            self.lost += 1
                        return
                    c_writer.write(data)
                    await c_writer.drain()

            up = asyncio.ensure_future(upstream())
            down = asyncio.ensure_future(downstream())
            try:
                await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (up, down):
                    t.cancel()
                    with contextlib.suppress(BaseException):
                        await t
        except OSError:
            pass  # the target refused or a side reset: the client sees its connection close
        except asyncio.CancelledError:
            pass  # close(): this task is the proxy's own, nobody awaits it
        finally:
            # Both closed before either is awaited: close() cancels this task wherever it
            # is, a wait below included, and a writer still open then would outlive the
            # loop (a ResourceWarning in a later test, when the garbage collector runs).
            writers = [w for w in (c_writer, s_writer) if w is not None]
            for w in writers:
                w.close()
            for w in writers:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await w.wait_closed()
            self._tasks.discard(task)
