"""The benchmark's processes: the workspace it plays (secret, users, channel), the
``web``, ``worker`` and fakes subprocesses it starts and stops by their own PIDs, and what it
measures of them (ERROR lines, CPU time, py-spy profiles).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from tests.bench.procs import cpu_seconds, machine_busy_seconds

REPO = Path(__file__).resolve().parents[2]


HERE = Path(__file__).resolve().parent


SECRET = "slack-bench-signing-secret"


PREFIX = "sbench"


REQUESTER = "U0BENCHREQ"


APPROVER_A = "U0BENCHA"


APPROVER_B = "U0BENCHB"


CHANNEL = "C0BENCH"


DOUBLE_SHARE = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A subprocess this benchmark started; stopped by its own PID only."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._out = open(log, "ab")
        self.proc = subprocess.Popen(
            args,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

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
        self._out.close()


class Fakes:
    """``python -m tests.bench.slack_fakes`` (FakeSlack + FakeOpenAI) and its stdin/stdout."""

    def __init__(self, gates: int, commands: int, log: Path) -> None:
        self._err = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.slack_fakes", str(gates), str(commands)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "READY":
            self.stop()
            raise RuntimeError(f"the fake servers did not start; see {log}")
        self.slack_api, self.openai_url = line[1], line[2]
        self.slack_url = self.slack_api.removesuffix("/api/")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        out: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


# Settings an experiment may set for the web and worker processes (passed on when set).
PASSED_ON = ("NOTIFIER_CONCURRENCY", "EVENT_LOOP")


def base_env(redis_url: str, fakes: Fakes, journal: Path) -> dict[str, str]:
    """The processes' environment: the bench's settings, and those of :data:`PASSED_ON`
    that this process has."""
    passed = {k: os.environ[k] for k in PASSED_ON if k in os.environ}
    return passed | {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(REPO),
        "REDIS_URL": redis_url,
        "KEY_PREFIX": PREFIX,
        "AGENT": "tests.bench.slack_agent:agent",
        "LOG_LEVEL": "WARNING",
        "OPENAI_API_KEY": "sk-bench-not-a-secret",
        "OPENAI_BASE_URL": fakes.openai_url,
        "OPENAI_MODEL": "fake-model",
        "APPROVAL_TIMEOUT": "3600",
        "SLACK_BENCH_JOURNAL": str(journal),
        "SLACK_BENCH_TASK_DUMP": str(journal.parent / "tasks.txt"),
    }


async def wait_healthy(url: str, web: Proc, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            if web.proc.poll() is not None:
                raise RuntimeError(f"web exited: {web.log.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(url + "/healthz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise TimeoutError("web did not become healthy")


def errors_logged(procs: Sequence[Proc], since: dict[str, int] | None = None) -> dict[str, int]:
    """ERROR lines in each process's log (minus ``since``)."""
    out: dict[str, int] = {}
    for p in procs:
        n = sum(1 for line in p.log.read_text(errors="replace").splitlines() if " ERROR " in line)
        out[p.name] = n - (since or {}).get(p.name, 0)
    return out


class CpuMeter:
    """CPU time of each process from the meter's creation on; "other" is everything else
    on the machine (anything not started by this benchmark disturbs its figures)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.t0 = time.monotonic()
        self.c0 = {n: cpu_seconds(p) for n, p in pids.items()}
        self.m0 = machine_busy_seconds()

    def _used(self) -> dict[str, float]:
        used = {n: cpu_seconds(p) - self.c0[n] for n, p in self.pids.items()}
        used["other"] = max(0.0, machine_busy_seconds() - self.m0 - sum(used.values()))
        return used

    def lap(self) -> dict[str, float]:
        """CPU-seconds per wall second of each process so far."""
        wall = time.monotonic() - self.t0
        return {n: v / wall for n, v in self._used().items()}

    def per(self, n: int) -> dict[str, float]:
        """CPU milliseconds of each process so far, per request."""
        return {name: 1000 * v / n for name, v in self._used().items()}


class Profiler:
    """py-spy sampling the web and worker processes (raw collapsed stacks)."""

    def __init__(self, targets: dict[str, int], duration: float, outdir: Path) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.files: dict[str, Path] = {}
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        for name, pid in targets.items():
            out = outdir / f"{name}.txt"
            self.files[name] = out
            cmd = [exe, "record", "--pid", str(pid), "--rate", "200", "--format", "raw"]
            cmd += ["--duration", str(int(duration) + 1), "--output", str(out)]
            self.procs[name] = subprocess.Popen(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def wait(self) -> dict[str, Path]:
        for p in self.procs.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
        return {n: f for n, f in self.files.items() if f.exists()}


def summarize_profile(path: Path, top: int = 14) -> str:
    """Share of samples by innermost frame of our code / library, and by inclusive frame."""
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f.split(" (")[0] + " (" + _short(f) + ")" for f in stack.split(";")]
        if any("select" in f or "epoll" in f for f in frames[-2:]):
            self_time["(idle: waiting in the event loop's poll)"] += n
            total += n
            continue
        total += n
        self_time[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    lines = [f"samples: {total}", "", "self (innermost frame):"]
    lines += [f"  {100 * c / total:5.1f}%  {f}" for f, c in self_time.most_common(top)]
    lines += ["", "inclusive (frame anywhere on the stack):"]
    interesting = [
        (f, c)
        for f, c in inclusive.most_common(400)
        if any(
            k in f
            for k in (
                "bot/",
                "agent_core/",
                "slack_bolt",
                "slack_sdk",
                "aiohttp",
                "redis",
                "openai",
                "pydantic",
                "httpx",
                "json",
            )
        )
    ]
    lines += [f"  {100 * c / total:5.1f}%  {f}" for f, c in interesting[: top * 2]]
    return "\n".join(lines)


def _short(frame: str) -> str:
    inside = frame.split(" (", 1)[1].rstrip(")") if " (" in frame else ""
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in inside:
            return inside.split(marker, 1)[1]
    return inside
