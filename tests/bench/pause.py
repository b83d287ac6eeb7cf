"""Item 1: the full pause/resume cycle versus history length, ours against the OpenAI Agents
SDK and LangGraph (with ``langgraph-checkpoint-redis``'s saver), in one process, on one Redis.

The scenario, the same for every system:

    stored history = the task (user) + N prior user+assistant pairs of ~200 characters
    model turn 1 → two calls of ``delete_user`` (each needs approval) → the run pauses, durably
    both calls are approved → both tools run → model turn 2 → "Done."

Windows of each repetition (``time.perf_counter``, CLOCK_MONOTONIC: the same clock in every
process of the machine):

* ``pause``: model turn 1's answer received → the pause is durable. Ours: the worker's job is
  finished (gates opened, run ``awaiting_approval``, job acknowledged, lease released). SDK:
  ``RunState.to_json()`` stored with ``SET``. LangGraph: ``ainvoke`` returned both interrupts
  (``durability="sync"``: the checkpoint and the interrupt writes are in Redis).
* ``resume``: the first decision is made → the final answer, minus model turn 2. It holds
  loading the history back from Redis for the model call, for everyone. Ours: two
  ``Gateway.decide`` (the bot's calls) and the worker's resume job (lease, both tools, the
  history read, the request body built, the answer recorded, the job finished). SDK:
  ``GET`` + ``RunState.from_json`` + two ``approve`` + ``Runner.run``. LangGraph:
  ``ainvoke(Command(resume={both interrupt ids: "approve"}))``.
* ``cycle`` = ``pause`` + ``resume``: the headline.
* ``model``: each model call, timed where the framework calls its model, never counted in
  anyone's windows. The peers' models are stubs receiving the message list in-process (no
  HTTP, no request body). Ours is whatever our worker does: its runner builds the request
  body from the stored history (inside our windows), then
  :class:`agent_core.model_http.ModelEndpoint` posts it (aiohttp) to
  :class:`agent_core.testing.FakeOpenAI` in a process of its own; that ``post`` is the model
  call (:meth:`tests.bench.common.ModelClock.wrap_endpoint`).
* ``prep`` (turn start → model call 1) and ``to_tool`` (first decision → first tool start)
  are shown for reference.

Ours runs twice in the rotation. ``ours``: the worker of this process pauses the run and
resumes it. ``ours, resumed elsewhere``: the same worker pauses it, and a second worker
*process* (:mod:`tests.bench.resumer`, warmed up with whole runs of its own, which never saw
this run) takes the resume job: any worker may resume any run.

The frameworks run interleaved (the order rotates on every repetition); ``gc.collect()`` runs
between repetitions, outside the windows. Ours runs a real :class:`agent_core.worker.Worker`
on this process's event loop, with the production Redis client (``create_redis``), and is
driven only through public APIs: ``Gateway.start_run`` starts each run (the worker holds the
delivered start job until the prior messages are appended to the run's history list, at
``Keys.history``), ``Gateway.pending_gates`` and ``Gateway.decide`` decide.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from openai import AsyncOpenAI

from agent_core import Decision, Gateway, RunStatus, Settings, create_redis
from agent_core.worker import Worker
from tests.bench import agent as bench_agent
from tests.bench.common import (
    ModelClock,
    ServerProbe,
    ServerStats,
    Traffic,
    count_traffic,
    median,
    prior_messages,
)
from tests.bench.fake_model import GATED_USERS, task_for
from tests.bench.procs import FakeModelProcess

if TYPE_CHECKING:
    from tests.bench.profile_cycle import CycleProfile
    from tests.bench.resumer import SecondWorker

API_KEY = "sk-bench-not-a-secret"
MODEL = "fake-model"
INSTRUCTIONS = "You are a benchmark agent."
OURS, SDK = "ours", "openai-agents"
OURS_ELSEWHERE = "ours, resumed elsewhere"  # paused here, resumed by a second worker process
LG_MESSAGES, LG_DICTS = "langgraph (messages)", "langgraph (dicts)"
STAND_IN = " [stand-in saver]"  # suffix of the LangGraph rows when Redis Stack cannot run
TARGET_RATIO = 20.0  # issue 21: ours ≤ 1/20 of the best peer's full cycle at 1,000 pairs
TARGET_RATIO_EMPTY = 4.0  # issue 21: ≤ 1/4 at 0 pairs


@dataclass
class Sample:
    framework: str
    n: int  # prior user+assistant pairs
    prep: float
    model: float  # both model calls
    pause: float
    resume: float
    to_tool: float
    body_bytes: int  # ours: size of model turn 2's request body (0 for the stubs)
    pause_traffic: Traffic  # client side, turn start → paused
    resume_traffic: Traffic  # client side, first decision → final answer
    pause_server: ServerStats  # INFO, turn start → paused
    resume_server: ServerStats  # INFO, first decision → final answer
    decisions: int = 0  # ours: round trips of the decisions themselves (one per gate)

    @property
    def cycle(self) -> float:
        """Pause + resume through to the final answer, model calls excluded."""
        return self.pause + self.resume


class ToolProbe:
    """Timestamps the start of the first gated tool of a repetition."""

    def __init__(self) -> None:
        self.started: float | None = None

    def mark(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def take(self) -> float:
        assert self.started is not None, "no tool started"
        started, self.started = self.started, None
        return started


class Framework:
    name: str
    probe: ServerProbe
    clock: ModelClock
    tool: ToolProbe

    async def setup(self) -> None: ...

    async def rep(self, n: int) -> Sample:
        raise NotImplementedError

    async def close(self) -> None: ...

    def _windows(
        self, t0: float, t1: float, t2: float, t4: float
    ) -> tuple[float, float, float, float, float]:
        """(prep, pause, resume, to_tool, model) from the four marks and the model calls."""
        first = self.clock.within(t0, t1)
        second = self.clock.within(t2, t4)
        assert len(first) == 1, f"{self.name}: {len(first)} model calls before the pause"
        assert len(second) == 1, f"{self.name}: {len(second)} model calls in the resume"
        t3 = self.tool.take()
        return (
            first[0].start - t0,
            t1 - first[0].end,
            t4 - t2 - second[0].seconds,
            t3 - t2,
            first[0].seconds + second[0].seconds,
        )


def history(n: int) -> list[dict[str, str]]:
    """The stored history of a run with ``n`` prior pairs: the task, then the pairs."""
    return [{"role": "user", "content": task_for(n)}, *prior_messages(2 * n)]


# =========================================================================== ours
def bench_settings(url: str, base_url: str) -> Settings:
    """The settings of ours' workers, in this process and in the second one."""
    return Settings.from_env(
        REDIS_URL=url,
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY=API_KEY,
        OPENAI_MODEL=MODEL,
        OPENAI_MAX_RETRIES=0,
        KEY_PREFIX="bench",
        APPROVAL_TIMEOUT=300,
        # Quiet background loops: no XAUTOCLAIM or sweep inside the measured windows.
        WORKER_LEASE=600,
        SWEEP_INTERVAL=60,
    )


class BenchWorker(Worker):
    """The real worker; it holds a delivered job while ``hold`` is clear and reports each
    finished job (``after_job`` is called first, when set: the profile stops there)."""

    def __init__(self, *args: Any, jobs_done: asyncio.Queue[float], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.jobs_done = jobs_done
        self.hold = asyncio.Event()
        self.hold.set()
        self.after_job: Callable[[], None] | None = None

    async def _handle(self, *args: Any, **kwargs: Any) -> None:
        await self.hold.wait()
        await super()._handle(*args, **kwargs)
        t = time.perf_counter()
        if self.after_job is not None:
            self.after_job()
        self.jobs_done.put_nowait(t)


class ReadGate:
    """Lets a worker's job readers issue their ``XREADGROUP`` only while open, so that one
    worker of two takes a given job. ``open(k)`` closes it again once k jobs were read
    (``None``: stays open). A read already waiting in Redis is not called back: close it by
    counting (the next read then waits here)."""

    def __init__(self, *, is_open: bool = True) -> None:
        self.event = asyncio.Event()
        self.left: int | None = None
        self.issued = 0  # reads let through
        if is_open:
            self.event.set()

    def open(self, jobs: int | None = None) -> None:
        self.left = jobs
        self.event.set()

    def install(self, worker: Worker) -> None:
        for reader in worker.readers:
            read: Callable[..., Awaitable[list[Any]]] = reader.read

            async def gated(
                *args: Any, _read: Callable[..., Awaitable[list[Any]]] = read, **kwargs: Any
            ) -> list[Any]:
                await self.event.wait()
                self.issued += 1
                msgs = await _read(*args, **kwargs)
                if msgs and self.left is not None:
                    self.left -= len(msgs)
                    if self.left <= 0:
                        self.event.clear()
                return msgs

            reader.read = gated  # type: ignore[method-assign]


class Ours(Framework):
    name = OURS

    def __init__(
        self, url: str, base_url: str, probe: ServerProbe, *, second_process: bool = False
    ) -> None:
        self.url, self.probe = url, probe
        self.settings = bench_settings(url, base_url)
        self.worker_traffic, self.bot_traffic = Traffic(), Traffic()
        self.worker_redis = count_traffic(create_redis(url), self.worker_traffic)
        self.bot_redis = count_traffic(create_redis(url), self.bot_traffic)
        self.setup_redis = create_redis(url)  # not counted: appending the prior messages
        self.clock = ModelClock()
        self.client = self.clock.wrap(
            AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
        )
        self.jobs_done: asyncio.Queue[float] = asyncio.Queue()
        self.tool = ToolProbe()
        self.worker = BenchWorker(
            self.worker_redis,
            bench_agent.agent,
            self.client,
            self.settings,
            jobs_done=self.jobs_done,
        )
        for runner in self.worker.runners.values():
            self.clock.wrap_endpoint(runner.endpoint)
        self.gate = ReadGate()
        self.gate.install(self.worker)
        self.keys = self.worker.keys  # the deployment's key layout, as the worker has it
        self.gateway = Gateway(self.bot_redis, self.keys, agent_name=bench_agent.agent.name)
        self._task: asyncio.Task[None] | None = None
        self.history_bytes: dict[int, int] = {}
        self.second: SecondWorker | None = None
        if second_process:
            from tests.bench.resumer import SecondWorker

            self.second = SecondWorker(url, base_url)

    def traffic(self) -> Traffic:
        return self.worker_traffic + self.bot_traffic

    async def setup(self, warm_sizes: tuple[int, ...] = (0,)) -> None:
        bench_agent.on_tool_start = self.tool.mark
        if self.second is not None:
            # Before this process's worker reads anything: the second process's own runs,
            # start to finish, warm it up (imports, scripts, connections, the code paths).
            await self.second.start()
            for n in warm_sizes:
                for _ in range(2):
                    await self._run_elsewhere(n)
        self._task = asyncio.create_task(self.worker.run())

    async def _run_elsewhere(self, n: int) -> None:
        """A whole run (start, pause, resume) in the second worker process."""
        assert self.second is not None
        run_id = await self._new_run(n, hold=False)
        await self.second.arm(1)
        await self.second.report()
        gates = await self.gateway.pending_gates(run_id)
        assert len(gates) == len(GATED_USERS), gates
        for gate in gates:
            assert (await self.gateway.decide(gate.gate_id, Decision.APPROVE, by="U-a")).applied
        await self.second.arm(1)
        await self.second.report()
        run = await self.gateway.get_run(run_id)
        assert run is not None and run.status is RunStatus.COMPLETED, run

    async def _job_done(self) -> float:
        t = await asyncio.wait_for(self.jobs_done.get(), 120)
        # Let the worker issue its next blocking XREADGROUP: it delivers the next job, so
        # each window holds exactly one.
        await asyncio.sleep(0.003)
        return t

    async def _new_run(self, n: int, *, hold: bool = True) -> str:
        """A run started by Gateway.start_run whose history holds the n prior pairs before
        the worker reads it (``hold``: this process's worker holds the start job until they
        are appended)."""
        stored = [json.dumps(m) for m in history(n)]
        self.history_bytes[n] = sum(len(h.encode()) for h in stored)
        if hold:
            self.worker.hold.clear()
        run = await self.gateway.start_run(task_for(n), requested_by="U-bench")
        if n:
            await self.setup_redis.rpush(self.keys.history(run.run_id), *stored[1:])
        first = await self.setup_redis.lrange(self.keys.history(run.run_id), 0, 0)
        assert first and json.loads(first[0]) == history(n)[0], first
        assert await self.setup_redis.llen(self.keys.history(run.run_id)) == len(stored)
        return run.run_id

    async def rep(self, n: int, *, elsewhere: bool = False) -> Sample:
        """One repetition; ``elsewhere``: the second worker process takes the resume job."""
        second = self.second if elsewhere else None
        assert not elsewhere or second is not None, "no second worker process"
        if second is not None:
            self.gate.left = 1  # this worker takes the start job, then stops reading
        run_id = await self._new_run(n)
        s0, c0 = await self.probe.snapshot(), self.traffic()
        t0 = time.perf_counter()
        self.worker.hold.set()
        t1 = await self._job_done()
        c1, s1 = self.traffic(), await self.probe.snapshot()

        gates = await self.gateway.pending_gates(run_id)
        assert len(gates) == len(GATED_USERS), f"expected two pending gates, got {gates}"
        if second is not None:
            await second.arm(1)  # its XREADGROUP is waiting in Redis, as ours here is
        s2, c2 = await self.probe.snapshot(), self.traffic()
        b2 = self.bot_traffic.snapshot()
        t2 = time.perf_counter()
        for gate in gates:
            res = await self.gateway.decide(gate, Decision.APPROVE, by="U-approver")
            assert res.applied, res
        decisions = (self.bot_traffic - b2).round_trips
        if second is None:
            t4 = await self._job_done()
            c4, s4 = self.traffic(), await self.probe.snapshot()
            prep, pause, resume, to_tool, model = self._windows(t0, t1, t2, t4)
            body = self.clock.within(t2, t4)[0].body_bytes
            resume_traffic = c4 - c2
        else:
            report = await second.report()
            c4, s4 = self.traffic(), await self.probe.snapshot()
            self.gate.open()
            await asyncio.sleep(0.003)  # this worker's XREADGROUP waits in Redis again
            t4 = report.ends[-1]
            first = self.clock.within(t0, t1)
            later = [c for c in report.calls if c.start >= t2 and c.end <= t4]
            assert len(first) == 1 and len(later) == 1, (first, later)
            assert report.tool is not None, "no tool started in the second process"
            prep, pause = first[0].start - t0, t1 - first[0].end
            resume, to_tool = t4 - t2 - later[0].seconds, report.tool - t2
            model, body = first[0].seconds + later[0].seconds, later[0].body_bytes
            # This worker is idle meanwhile: only the bot's traffic, and the second's.
            resume_traffic = c4 - c2 + report.traffic
        run = await self.gateway.get_run(run_id)
        assert run is not None and run.status is RunStatus.COMPLETED, run
        return Sample(
            OURS_ELSEWHERE if elsewhere else OURS,
            n,
            prep,
            model,
            pause,
            resume,
            to_tool,
            body,
            c1 - c0,
            resume_traffic,
            self.probe.delta(s0, s1),
            self.probe.delta(s2, s4),
            decisions,
        )

    async def close(self) -> None:
        bench_agent.on_tool_start = None
        self.worker.stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, 15)
        if self.second is not None:
            await self.second.stop()
        await self.client.close()
        for r in (self.worker_redis, self.bot_redis, self.setup_redis):
            await r.aclose()


class OursElsewhere(Framework):
    """Ours, resumed by the second worker process (the run is paused by :class:`Ours`)."""

    name = OURS_ELSEWHERE

    def __init__(self, ours: Ours) -> None:
        self.ours, self.probe, self.clock, self.tool = ours, ours.probe, ours.clock, ours.tool

    async def rep(self, n: int) -> Sample:
        return await self.ours.rep(n, elsewhere=True)


# =========================================================================== driver
@dataclass
class PauseResults:
    sizes: list[int]
    reps: dict[int, int]
    frameworks: list[str]
    server: str = ""  # the Redis every framework used
    stand_in: str = ""  # why LangGraph ran on the stand-in saver ("" when it did not)
    history_bytes: dict[int, int] = field(default_factory=dict)  # ours, stored JSON
    others_busy: float = float("nan")  # cores other processes kept busy meanwhile
    samples: list[Sample] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    profile: CycleProfile | None = None  # where ours' cycle time goes (one size)

    def of(self, framework: str, n: int) -> list[Sample]:
        return [s for s in self.samples if s.framework == framework and s.n == n]

    @property
    def peers(self) -> list[str]:
        return [f for f in self.frameworks if f not in (OURS, OURS_ELSEWHERE)]

    def best_peer(self, n: int) -> str | None:
        """The peer with the smallest median full cycle at ``n``."""
        have = [(median([s.cycle for s in self.of(f, n)]), f) for f in self.peers if self.of(f, n)]
        return min(have)[1] if have else None


def _quiet_third_parties() -> None:
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    for var in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
        os.environ.pop(var, None)


async def run_pause_bench(
    url: str,
    sizes: list[int],
    reps: dict[int, int],
    log: Callable[[str], None],
    *,
    peers: bool = True,
    second_process: bool = True,
    profile_reps: int = 0,
    stand_in: str = "",
    server: str = "",
) -> PauseResults:
    """``stand_in``: why the real LangGraph saver cannot run (then the stand-in runs);
    ``second_process``: ours is also resumed by a second worker process (``ours, resumed
    elsewhere``); ``profile_reps``: that many cycles of ours profiled at 1,000 pairs (or the
    largest size below) after the measured ones."""
    _quiet_third_parties()
    probe = ServerProbe(url)
    await probe.calibrate()
    results = PauseResults(sizes, reps, [], server=server, stand_in=stand_in)
    fake = FakeModelProcess(sorted({0, *sizes}))
    try:
        makers: list[tuple[str, Callable[[], Framework]]] = [
            (OURS, lambda: Ours(url, fake.base_url, probe, second_process=second_process))
        ]
        if peers:
            lg = bool(stand_in)
            from tests.bench.peers import AgentsSdk, LangGraph

            makers += [
                (SDK, lambda: AgentsSdk(url, probe)),
                (LG_MESSAGES, lambda: LangGraph(url, probe, dicts=False, stand_in=lg)),
                (LG_DICTS, lambda: LangGraph(url, probe, dicts=True, stand_in=lg)),
            ]
        frameworks: list[Framework] = []
        for name, make in makers:
            try:
                fw = make()
                if isinstance(fw, Ours):
                    await fw.setup(warm_sizes=(0, min([n for n in sizes if n] or [0])))
                else:
                    await fw.setup()
            except ImportError as exc:
                results.skipped[name] = f"not installed ({exc.name}): `make bench` installs it"
                continue
            frameworks.append(fw)
            results.frameworks.append(fw.name)
            if isinstance(fw, Ours) and fw.second is not None:
                frameworks.append(OursElsewhere(fw))
                results.frameworks.append(OURS_ELSEWHERE)
        try:
            for n in sizes:
                t = time.perf_counter()
                for fw in frameworks:  # warm-up: imports, scripts loaded, connections open
                    await fw.rep(n)
                for i in range(reps[n]):
                    order = frameworks[i % len(frameworks) :] + frameworks[: i % len(frameworks)]
                    for fw in order:
                        gc.collect()
                        results.samples.append(await fw.rep(n))
                log(
                    f"  history {n:,} pairs: {reps[n]} reps x {len(frameworks)} in "
                    f"{time.perf_counter() - t:.1f} s"
                )
            ours = next((f for f in frameworks if isinstance(f, Ours)), None)
            if ours is not None:
                results.history_bytes = dict(ours.history_bytes)
                at = max([n for n in sizes if n <= 1000] or sizes)
                if profile_reps:
                    from tests.bench.profile_cycle import profile_cycle

                    t = time.perf_counter()
                    results.profile = await profile_cycle(ours, at, profile_reps)
                    log(
                        f"  profile of ours' cycle at {at:,} pairs: {profile_reps} reps in "
                        f"{time.perf_counter() - t:.1f} s"
                    )
        finally:
            for fw in frameworks:
                await fw.close()
            await probe.aclose()
    finally:
        fake.stop()
    return results
