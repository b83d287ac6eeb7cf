"""Processes the throughput and memory benchmarks start: the fake model and real workers.

Every process here is started by the benchmark and ended by its own PID (SIGTERM, then
SIGKILL after a grace period). CPU time and RSS come from ``/proc/<pid>``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from tests.bench.common import REPO

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_seconds() -> float:
    """CPU seconds all processes on the machine spent busy (not idle or waiting on I/O)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _TICK


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _Proc:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


class FakeModelProcess(_Proc):
    """``python -m tests.bench.fake_model`` (the fake model, off the driver's GIL)."""

    def __init__(self, sizes: Sequence[int] = ()) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.fake_model", *map(str, sizes)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        super().__init__(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"the fake model did not start: {line!r}")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}/v1"

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        super().stop(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class WorkerProcess(_Proc):
    """A real ``python -m agent_core.worker`` running the bench agent."""

    def __init__(self, redis_url: str, openai_url: str, log: Path, **extra: str) -> None:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/tmp"),
            "PYTHONPATH": str(REPO),
            "REDIS_URL": redis_url,
            "OPENAI_BASE_URL": openai_url,
            "OPENAI_API_KEY": "sk-bench-not-a-secret",
            "OPENAI_MODEL": "fake-model",
            "OPENAI_MAX_RETRIES": "0",
            "AGENT": "tests.bench.agent:agent",
            "KEY_PREFIX": "bench",
            "APPROVAL_TIMEOUT": "3600",
            "LOG_LEVEL": "WARNING",
            # The bench's own EVENT_LOOP (auto unless set), so one setting compares loops.
            "EVENT_LOOP": os.environ.get("EVENT_LOOP", "auto"),
            **extra,
        }
        self.log = log
        self._out = open(log, "ab")
        super().__init__(
            subprocess.Popen(
                [sys.executable, "-m", "agent_core.worker"],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._out,
                stderr=subprocess.STDOUT,
            )
        )

    def stop(self, timeout: float = 15.0) -> None:
        super().stop(timeout)
        self._out.close()


class Workers:
    """N worker processes, stopped together on exit."""

    def __init__(
        self, n: int, redis_url: str, openai_url: str, logdir: Path, **extra_env: str
    ) -> None:
        self.procs = [
            WorkerProcess(redis_url, openai_url, logdir / f"worker-{i}.log", **extra_env)
            for i in range(n)
        ]

    def __enter__(self) -> Workers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for p in self.procs:
            p.stop()

    def alive(self) -> bool:
        return all(p.proc.poll() is None for p in self.procs)


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")
