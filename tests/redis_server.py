"""A private ``redis-server`` subprocess for tests (Redis is never faked).

:class:`RedisServer` runs ``redis-server`` on a free port of 127.0.0.1 in a temporary
directory. It can be stopped, killed (SIGKILL, for crash tests) and started again on the same
port and directory, so a test can check what survives a restart with the append-only file.
Only the PID it started itself is ever signalled.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

__all__ = ["ExternalRedis", "RedisServer", "free_port"]

_live: weakref.WeakSet[RedisServer] = weakref.WeakSet()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ping(port: int, timeout: float = 0.5) -> str | None:
    """The first reply line to PING, or None when nothing answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            data = b""
            while not data.endswith(b"\r\n"):
                chunk = sock.recv(256)
                if not chunk:
                    break
                data += chunk
            return data.decode(errors="replace").strip()
    except OSError:
        return None


@dataclass(frozen=True)
class ExternalRedis:
    """A Redis server that the tests did not start (``TEST_REDIS_URL``)."""

    url: str

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 6379


class RedisServer:
    """A ``redis-server`` subprocess on 127.0.0.1, in a directory of its own.

    ``appendonly=True`` turns on the append-only file with ``appendfsync always``, so every
    acknowledged write survives :meth:`kill`. RDB snapshots are off (``--save ""``).
    """

    def __init__(
        self,
        *,
        appendonly: bool = False,
        executable: str = "redis-server",
        startup_timeout: float = 5.0,
        directory: Path | None = None,
    ) -> None:
        self.appendonly = appendonly
        self.executable = executable
        self.startup_timeout = startup_timeout
        self._own_dir = directory is None
        self.dir = Path(tempfile.mkdtemp(prefix="redis-test-")) if directory is None else directory
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ properties
    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("RedisServer was never started")
        return self._port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def logfile(self) -> Path:
        return self.dir / "redis.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log file)"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING.

        The first start picks a free port; later starts reuse that port and directory.
        """
        if self.running:
            raise RuntimeError(f"redis-server already running (pid {self.pid})")
        if shutil.which(self.executable) is None:
            raise RuntimeError(
                f"{self.executable} is not installed: run `sudo apt-get install redis-server`"
                " (Debian/Ubuntu) or `brew install redis`"
            )
        if self._port is not None:
            self._spawn(self._port)
            return self
        # A free port can be taken between our probe and redis' bind: try a few.
        last_error: RuntimeError | None = None
        for _ in range(3):
            port = free_port()
            self.logfile.unlink(missing_ok=True)
            try:
                self._spawn(port)
            except RuntimeError as exc:
                last_error = exc
                if "Address already in use" not in self.log_tail():
                    raise
                continue
            self._port = port
            return self
        assert last_error is not None
        raise last_error

    def _spawn(self, port: int) -> None:
        args = [
            self.executable,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--protected-mode", "no",
            "--save", "",
            "--dir", str(self.dir),
            "--logfile", str(self.logfile),
            "--daemonize", "no",
            "--appendonly", "yes" if self.appendonly else "no",
        ]  # fmt: skip
        if self.appendonly:
            args += ["--appendfsync", "always"]
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
        )
        self._proc = proc
        _live.add(self)
        deadline = time.monotonic() + self.startup_timeout
        answer: str | None = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._proc = None
                raise RuntimeError(
                    f"redis-server on port {port} exited with code {proc.returncode} at "
                    f"start; log tail:\n{self.log_tail()}"
                )
            answer = _ping(port)
            if answer == "+PONG":
                return
            time.sleep(0.02)
        self._terminate(proc)
        self._proc = None
        raise RuntimeError(
            f"redis-server on port {port} did not answer PING within "
            f"{self.startup_timeout} s (last answer {answer!r}); log tail:\n{self.log_tail()}"
        )

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM its process and wait; SIGKILL after ``timeout`` seconds."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self._terminate(proc, timeout)

    def kill(self) -> None:
        """SIGKILL its process, as a crash would, and reap it."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop the server and remove its directory (when this object made it)."""
        self.stop()
        _live.discard(self)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisServer(port={self._port}, pid={self.pid}, appendonly={self.appendonly})"


@atexit.register
def _close_leftovers() -> None:
    """Last resort when a test run dies without fixture teardown: end our own servers."""
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.close()
