"""The second worker process of the pause benchmark: ``python -m tests.bench.resumer URL BASE``.

Any worker may resume any run, so the pause benchmark also measures a resume taken by a
worker *process* that never saw the run: the worker of the benchmark's own process pauses it,
and this one, warm (it ran whole runs of its own first), takes the resume job.

It runs a real :class:`agent_core.worker.Worker` (:class:`tests.bench.pause.BenchWorker`, the
same settings as the benchmark's) whose job reader only issues its ``XREADGROUP`` when the
benchmark asks, so it takes exactly the jobs meant for it. It talks over its standard input
and output, one JSON object a line:

* ``{"arm": k}``: open its reader for ``k`` jobs, let its ``XREADGROUP`` reach Redis (3 ms),
  answer ``{"armed": true}``; once the k jobs are finished, answer with what it measured:
  ``ends`` (``time.perf_counter`` when each job finished: CLOCK_MONOTONIC, the benchmark's
  clock too), ``calls`` (its model calls, timed at its ``ModelEndpoint``), ``tool`` (the first
  tool start) and its Redis traffic from the read that delivered the first job
  (``round_trips``, ``bytes_out``: counted the same way as the benchmark's own clients);
* ``{"stop": true}`` or the end of its input: the worker stops, the process exits.

:class:`SecondWorker` is the benchmark's side: it starts the process and ends it by its PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

from openai import AsyncOpenAI

from agent_core import create_redis, event_loop
from agent_core.runtime import freeze_startup_heap, keep_large_buffers
from tests.bench import agent as bench_agent
from tests.bench.common import (
    REPO,
    ModelCall,
    ModelClock,
    Traffic,
    bench_event_loop,
    count_traffic,
)


@dataclass
class Report:
    """What the second worker measured over one ``arm``."""

    ends: list[float]
    calls: list[ModelCall]
    tool: float | None
    traffic: Traffic


class SecondWorker:
    """The second worker process, driven from the benchmark's event loop."""

    def __init__(self, url: str, base_url: str) -> None:
        self.url, self.base_url = url, base_url
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, timeout: float = 60.0) -> None:
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.bench.resumer",
            self.url,
            self.base_url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO,
            env=env,
        )
        ready = await self._line(timeout)
        assert "ready" in ready, ready

    async def _line(self, timeout: float = 120.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"the second worker process exited ({self.proc.returncode})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        await self.proc.stdin.drain()

    async def arm(self, jobs: int) -> None:
        """Its reader takes the next ``jobs`` jobs; returns once its read waits in Redis."""
        await self._send({"arm": jobs})
        reply = await self._line()
        assert reply.get("armed"), reply

    async def report(self) -> Report:
        """What it measured, once the jobs of the last ``arm`` are finished."""
        r = await self._line()
        return Report(
            r["ends"],
            [ModelCall(a, b, n) for a, b, n in r["calls"]],
            r["tool"],
            Traffic(r["round_trips"], r["bytes_out"]),
        )

    async def stop(self, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(OSError, ConnectionError):
            await self._send_to(proc, {"stop": True})
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()

    @staticmethod
    async def _send_to(proc: asyncio.subprocess.Process, msg: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        await proc.stdin.drain()
        proc.stdin.close()


# --------------------------------------------------------------------------- the process
def _say(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


async def serve(url: str, base_url: str) -> None:
    from tests.bench.pause import API_KEY, BenchWorker, ReadGate, ToolProbe, bench_settings

    traffic = Traffic()
    redis = count_traffic(create_redis(url), traffic)
    clock = ModelClock()
    client = AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
    jobs_done: asyncio.Queue[float] = asyncio.Queue()
    worker = BenchWorker(
        redis, bench_agent.agent, client, bench_settings(url, base_url), jobs_done=jobs_done
    )
    for runner in worker.runners.values():
        clock.wrap_endpoint(runner.endpoint)
    gate = ReadGate(is_open=False)
    gate.install(worker)
    tool = ToolProbe()
    bench_agent.on_tool_start = tool.mark
    # The process-level tuning of a worker process (agent_core.worker.serve).
    freeze_startup_heap()
    keep_large_buffers()
    task = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    _say({"ready": worker.name})
    try:
        while line := await stdin.readline():
            cmd = json.loads(line)
            if cmd.get("stop"):
                break
            jobs = int(cmd["arm"])
            tool.started = None
            calls0 = len(clock.calls)
            issued = gate.issued
            gate.open(jobs)
            while gate.issued == issued:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.003)  # the XREADGROUP is sent now, and waits in Redis
            # From here, as the benchmark's own worker is counted from its decision: the read
            # that delivers the job was sent before (+1 below); the read after the job waits
            # at the gate and is not sent.
            c0 = traffic.snapshot()
            _say({"armed": True})
            ends = [await asyncio.wait_for(jobs_done.get(), 120) for _ in range(jobs)]
            used = traffic - c0
            _say(
                {
                    "ends": ends,
                    "calls": [[c.start, c.end, c.body_bytes] for c in clock.calls[calls0:]],
                    "tool": tool.started,
                    "round_trips": used.round_trips + 1,
                    "bytes_out": used.bytes_out,
                }
            )
    finally:
        bench_agent.on_tool_start = None
        worker.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        await client.close()
        await redis.aclose()


def main() -> None:
    url, base_url = sys.argv[1:3]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    event_loop.run(serve(url, base_url), bench_event_loop())


if __name__ == "__main__":
    main()
