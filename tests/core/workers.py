"""Real worker processes for crash tests (``python -m agent_core.worker``)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.agents import read_journal

REPO = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """A worker subprocess; ``kill()`` is a SIGKILL of its own PID."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_core.worker"],
            cwd=REPO,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def pause(self) -> None:
        """SIGSTOP: the process freezes (as in a long GC or VM pause) until :meth:`resume`."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._out.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            self._out.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def worker_env(redis_url: str, openai_url: str, journal: Path, **extra: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "REDIS_URL": redis_url,
        "OPENAI_BASE_URL": openai_url,
        "OPENAI_API_KEY": "sk-test-not-a-secret",
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": "1",
        "AGENT": "tests.agents:ops",
        "KEY_PREFIX": "t",
        "WORKER_LEASE": "1",
        "SWEEP_INTERVAL": "0.1",
        "APPROVAL_TIMEOUT": "60",
        "TEST_JOURNAL": str(journal),
        "PYTHONPATH": str(REPO),
    }
    env.update(extra)
    return env


async def wait_journal(path: Path, line: str, timeout: float = 10) -> None:
    """Wait until ``line`` is in the journal file."""
    for _ in range(int(timeout / 0.02)):
        if line in read_journal(str(path)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{line!r} never appeared in the journal: {read_journal(str(path))}")
