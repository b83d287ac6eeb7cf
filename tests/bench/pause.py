"""Item 1: the full pause/resume cycle versus history length, ours against the OpenAI Agents
SDK and LangGraph (with ``langgraph-checkpoint-redis``'s saver), in one process, on one Redis.

The scenario, the same for every system:

    stored history = the task (user) + N prior user+assistant pairs of ~200 characters
    model turn 1 → two calls of ``delete_user`` (each needs approval) → the run pauses, durably
    both calls are approved → both tools run → model turn 2 → "Done."

Windows of each repetition (``time.perf_counter``):

* ``pause``: model turn 1's answer received → the pause is durable. Ours: the worker's job is
  finished (gates opened, run ``awaiting_approval``, job acknowledged, lease released). SDK:
  ``RunState.to_json()`` stored with ``SET``. LangGraph: ``ainvoke`` returned both interrupts
  (``durability="sync"``: the checkpoint and the interrupt writes are in Redis).
* ``resume``: the first decision is made → the final answer, minus model turn 2. It holds
  loading the history back from Redis for the model call, for everyone. Ours: two
  ``Gateway.decide`` (the bot's calls) and the worker's resume job (lease, both tools, the
  history read and decoded, the request built, the answer recorded, the job finished). SDK:
  ``GET`` + ``RunState.from_json`` + two ``approve`` + ``Runner.run``. LangGraph:
  ``ainvoke(Command(resume={both interrupt ids: "approve"}))``.
* ``cycle`` = ``pause`` + ``resume``: the headline.
* ``model``: each model call, timed where the framework calls its model, never counted in
  anyone's windows. The peers' models are stubs receiving the message list in-process (no
  HTTP, no request body). Ours is whatever our worker does: ``AsyncOpenAI.post`` to
  :class:`agent_core.testing.FakeOpenAI` in a process of its own. Building that request
  (openai-python copies the options and JSON-encodes the body) is work the peers never do
  here: it is measured on its own (``encode``) and shown beside the headline, not in it.
* ``prep`` (turn start → model call 1) and ``to_tool`` (first decision → first tool start)
  are shown for reference.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    kb,
    median,
    ms,
    prior_messages,
)
from tests.bench.fake_model import GATED_USERS, task_for
from tests.bench.procs import FakeModelProcess

API_KEY = "sk-bench-not-a-secret"
MODEL = "fake-model"
INSTRUCTIONS = "You are a benchmark agent."
OURS, SDK = "ours", "openai-agents"
LG_MESSAGES, LG_DICTS = "langgraph (messages)", "langgraph (dicts)"
STAND_IN = " [stand-in saver]"  # suffix of the LangGraph rows when Redis Stack cannot run
TARGET_RATIO = 20.0  # issue 9: ours ≤ 1/20 of the best peer's full cycle


@dataclass
class Sample:
    framework: str
    n: int  # prior user+assistant pairs
    prep: float
    model: float  # both model calls
    pause: float
    resume: float
    to_tool: float
    encode: float  # ours: building the request body of model turn 2 (0 for the stubs)
    body_bytes: int  # ours: size of that request body
    pause_traffic: Traffic  # client side, turn start → paused
    resume_traffic: Traffic  # client side, first decision → final answer
    pause_server: ServerStats  # INFO, turn start → paused
    resume_server: ServerStats  # INFO, first decision → final answer

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
class _BenchWorker(Worker):
    """The real worker; it holds a delivered job while ``hold`` is clear and reports each
    finished job."""

    def __init__(self, *args: Any, jobs_done: asyncio.Queue[float], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.jobs_done = jobs_done
        self.hold = asyncio.Event()
        self.hold.set()

    async def _handle(self, *args: Any, **kwargs: Any) -> None:
        await self.hold.wait()
        await super()._handle(*args, **kwargs)
        self.jobs_done.put_nowait(time.perf_counter())


class Ours(Framework):
    name = OURS

    def __init__(self, url: str, base_url: str, probe: ServerProbe) -> None:
        self.url, self.probe = url, probe
        self.settings = Settings.from_env(
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
        self.worker = _BenchWorker(
            self.worker_redis,
            bench_agent.agent,
            self.client,
            self.settings,
            jobs_done=self.jobs_done,
        )
        for runner in self.worker.runners.values():
            self.clock.wrap_endpoint(runner.endpoint)
        self.keys = self.worker.keys  # the deployment's key layout, as the worker has it
        self.gateway = Gateway(self.bot_redis, self.keys, agent_name=bench_agent.agent.name)
        self._task: asyncio.Task[None] | None = None
        self.history_bytes: dict[int, int] = {}

    def traffic(self) -> Traffic:
        return self.worker_traffic + self.bot_traffic

    async def setup(self) -> None:
        bench_agent.on_tool_start = self.tool.mark
        self._task = asyncio.create_task(self.worker.run())

    async def _job_done(self) -> float:
        t = await asyncio.wait_for(self.jobs_done.get(), 120)
        # Let the worker issue its next blocking XREADGROUP: it delivers the next job, so
        # each window holds exactly one.
        await asyncio.sleep(0.003)
        return t

    async def _new_run(self, n: int) -> str:
        """A run started by Gateway.start_run whose history holds the n prior pairs before
        the worker reads it (the worker holds the start job until they are appended)."""
        stored = [json.dumps(m) for m in history(n)]
        self.history_bytes[n] = sum(len(h.encode()) for h in stored)
        self.worker.hold.clear()
        run = await self.gateway.start_run(task_for(n), requested_by="U-bench")
        if n:
            await self.setup_redis.rpush(self.keys.history(run.run_id), *stored[1:])
        first = await self.setup_redis.lrange(self.keys.history(run.run_id), 0, 0)
        assert first and json.loads(first[0]) == history(n)[0], first
        assert await self.setup_redis.llen(self.keys.history(run.run_id)) == len(stored)
        return run.run_id

    async def rep(self, n: int) -> Sample:
        run_id = await self._new_run(n)
        s0, c0 = await self.probe.snapshot(), self.traffic()
        t0 = time.perf_counter()
        self.worker.hold.set()
        t1 = await self._job_done()
        c1, s1 = self.traffic(), await self.probe.snapshot()

        gates = await self.gateway.pending_gates(run_id)
        assert len(gates) == len(GATED_USERS), f"expected two pending gates, got {gates}"
        s2, c2 = await self.probe.snapshot(), self.traffic()
        t2 = time.perf_counter()
        for gate in gates:
            res = await self.gateway.decide(gate, Decision.APPROVE, by="U-approver")
            assert res.applied, res
        t4 = await self._job_done()
        c4, s4 = self.traffic(), await self.probe.snapshot()
        prep, pause, resume, to_tool, model = self._windows(t0, t1, t2, t4)
        second = self.clock.within(t2, t4)[0]
        run = await self.gateway.get_run(run_id)
        assert run is not None and run.status is RunStatus.COMPLETED, run
        return Sample(
            OURS,
            n,
            prep,
            model,
            pause,
            resume,
            to_tool,
            second.encode,
            second.body_bytes,
            c1 - c0,
            c4 - c2,
            self.probe.delta(s0, s1),
            self.probe.delta(s2, s4),
        )

    async def close(self) -> None:
        bench_agent.on_tool_start = None
        self.worker.stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, 15)
        await self.client.close()
        for r in (self.worker_redis, self.bot_redis, self.setup_redis):
            await r.aclose()


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

    def of(self, framework: str, n: int) -> list[Sample]:
        return [s for s in self.samples if s.framework == framework and s.n == n]

    @property
    def peers(self) -> list[str]:
        return [f for f in self.frameworks if f != OURS]

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
    stand_in: str = "",
    server: str = "",
) -> PauseResults:
    """``stand_in``: why the real LangGraph saver cannot run (then the stand-in runs)."""
    _quiet_third_parties()
    probe = ServerProbe(url)
    await probe.calibrate()
    results = PauseResults(sizes, reps, [], server=server, stand_in=stand_in)
    fake = FakeModelProcess(sorted({0, *sizes}))
    try:
        makers: list[tuple[str, Callable[[], Framework]]] = [
            (OURS, lambda: Ours(url, fake.base_url, probe))
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
                await fw.setup()
            except ImportError as exc:
                results.skipped[name] = f"not installed ({exc.name}): `make bench` installs it"
                continue
            frameworks.append(fw)
            results.frameworks.append(fw.name)
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
        finally:
            for fw in frameworks:
                await fw.close()
            await probe.aclose()
    finally:
        fake.stop()
    return results


# =========================================================================== tables
Table = tuple[str, list[str], list[list[str]]]


def spread(xs: list[float]) -> str:
    """Median [min-max], in ms."""
    if not xs:
        return "n/a"
    return f"{ms(median(xs))} [{ms(min(xs))}-{ms(max(xs))}]"


def _ratio(peer: float, ours: float) -> str:
    if ours <= 0 or peer != peer or ours != ours:
        return "n/a"
    r = peer / ours
    return f"{r:.1f}x" if r < 100 else f"{r:.0f}x"


def headline_table(res: PauseResults) -> Table:
    """Full cycle per N per system, and ours against the best peer."""
    rows = []
    for n in res.sizes:
        ours = res.of(OURS, n)
        if not ours:
            continue
        cyc = median([s.cycle for s in ours])
        enc = median([s.encode for s in ours])
        row = [f"{n:,}", spread([s.cycle for s in ours])]
        row.append(f"{ms(enc)} → {ms(cyc + enc)}")
        for fw in res.peers:
            row.append(spread([s.cycle for s in res.of(fw, n)]))
        best = res.best_peer(n)
        if best is None:
            row += ["n/a", "n/a"]
        else:
            b = median([s.cycle for s in res.of(best, n)])
            row.append(f"{_ratio(b, cyc)} ({best})")
            row.append(_ratio(b, cyc + enc))
        rows.append(row)
    return (
        "Full cycle: pause + resume to the final answer, history read included, model calls "
        "excluded (ms, median [min-max])",
        [
            "history (pairs)",
            "ours",
            "ours: + building the request body (encode → total)",
            *res.peers,
            "best peer / ours",
            "best peer / (ours + encode)",
        ],
        rows,
    )


def detail_table(res: PauseResults) -> Table:
    rows = []
    for n in res.sizes:
        for fw in res.frameworks:
            ss = res.of(fw, n)
            if not ss:
                continue
            rows.append(
                [
                    f"{n:,}",
                    fw,
                    spread([s.pause for s in ss]),
                    spread([s.resume for s in ss]),
                    spread([s.to_tool for s in ss]),
                    spread([s.prep for s in ss]),
                    ms(median([s.model for s in ss])),
                ]
            )
    return (
        "Pause and resume apart (ms, median [min-max])",
        [
            "history (pairs)",
            "system",
            "pause (model answer → durable)",
            "resume (decision → final answer, ex-model)",
            "decision → first tool start",
            "prep (turn start → model call; not in the cycle)",
            "both model calls (excluded)",
        ],
        rows,
    )


def traffic_table(res: PauseResults) -> Table:
    rows = []
    for n in res.sizes:
        floor = res.history_bytes.get(n)
        for fw in res.frameworks:
            ss = res.of(fw, n)
            if not ss:
                continue
            read = median([s.resume_server.net_out for s in ss])
            rows.append(
                [
                    f"{n:,}",
                    fw,
                    kb(median([s.pause_traffic.bytes_out for s in ss])),
                    kb(median([s.pause_server.net_in for s in ss])),
                    f"{median([s.pause_traffic.round_trips for s in ss]):.0f}",
                    kb(read),
                    f"{read / floor:.2f}x" if floor and n else "n/a",
                    kb(median([s.resume_traffic.bytes_out for s in ss])),
                    f"{median([s.resume_traffic.round_trips for s in ss]):.0f}",
                ]
            )
    return (
        "Redis traffic per repetition (medians)",
        [
            "history (pairs)",
            "system",
            "bytes written, turn start → paused (client)",
            "same, Redis net input (INFO)",
            "round trips → paused",
            "bytes read, decision → final answer (INFO net output)",
            "bytes read / ours' stored history (the floor: one read per model call)",
            "bytes written, decision → final answer (client)",
            "round trips, decision → final answer",
        ],
        rows,
    )


def encode_table(res: PauseResults) -> Table:
    rows = []
    for n in res.sizes:
        ss = res.of(OURS, n)
        if not ss:
            continue
        rows.append(
            [
                f"{n:,}",
                kb(res.history_bytes.get(n, float("nan"))),
                kb(median([s.body_bytes for s in ss])),
                spread([s.encode for s in ss]),
                spread([s.cycle + s.encode for s in ss]),
            ]
        )
    return (
        "Ours: the request body of model turn 2 (built by openai-python's `post`: options "
        "copy + JSON encoding; the peers' stub models get their lists as they are)",
        [
            "history (pairs)",
            "stored history (JSON)",
            "request body",
            "building it (ms, median [min-max])",
            "full cycle + building it (ms)",
        ],
        rows,
    )


def pause_tables(res: PauseResults) -> list[Table]:
    return [
        headline_table(res),
        detail_table(res),
        traffic_table(res),
        encode_table(res),
    ]


def commands_table(res: PauseResults, framework: str = OURS) -> Table:
    """Redis commands in one pause and one resume (medians), at the largest history."""
    n = max(res.sizes)
    ss = res.of(framework, n)
    names = sorted({c for s in ss for c in (*s.pause_server.by_cmd, *s.resume_server.by_cmd)})
    rows = []
    for c in names:
        pause = median([s.pause_server.by_cmd.get(c, 0) for s in ss])
        resume = median([s.resume_server.by_cmd.get(c, 0) for s in ss])
        if pause or resume:
            rows.append([c.upper(), f"{pause:.0f}", f"{resume:.0f}"])
    return (
        f"Redis commands of {framework}: turn start → paused, decision → final answer (INFO "
        f"commandstats, history {n:,} pairs, medians; commands run inside Lua scripts count)",
        ["command", "turn start → paused", "decision → final answer"],
        rows,
    )


def target_lines(res: PauseResults) -> list[str]:
    """Issue 9's targets, checked on these figures."""
    lines: list[str] = []
    sizes = [n for n in res.sizes if res.of(OURS, n)]
    if not sizes:
        return lines
    for n in sizes:
        best = res.best_peer(n)
        if best is None:
            continue
        ours = median([s.cycle for s in res.of(OURS, n)])
        enc = median([s.encode for s in res.of(OURS, n)])
        b = median([s.cycle for s in res.of(best, n)])
        r = b / ours
        lines.append(
            f"- {n:,} pairs: full cycle {ms(ours)} ms, best peer ({best}) {ms(b)} ms: "
            f"**{r:.1f}x** (target ≥ {TARGET_RATIO:.0f}x, i.e. ≤ {ms(b / TARGET_RATIO)} ms: "
            + ("met" if r >= TARGET_RATIO else "**not met**")
            + f"); with the request body built, {b / (ours + enc):.1f}x."
        )
    lo, hi = min(sizes), max(sizes)
    if hi > lo:

        def med(attr: str, n: int) -> float:
            return median([getattr(s, attr) for s in res.of(OURS, n)])

        grew = med("resume", hi) - med("resume", lo)
        read = med("prep", hi) - med("prep", lo)
        lines.append(
            f"- Where ours' time goes: from {lo:,} to {hi:,} pairs our resume grows by "
            f"{ms(grew)} ms ({ms(med('resume', lo))} → {ms(med('resume', hi))}); reading and "
            f"splicing the history once (one `LRANGE` in a script; the stored JSON joined "
            f"into the request body, never decoded: what grows in the prep window, which is "
            f"not in the cycle) grows by {ms(read)} ms. The rest of the cycle "
            f"({ms(med('cycle', lo))} ms at {lo:,} pairs) is fixed: round trips and Lua "
            "scripts (the commands table above)."
        )
    wrote = [median([s.pause_traffic.bytes_out for s in res.of(OURS, n)]) for n in sizes]
    lines.append(
        "- Bytes written per pause (ours): "
        + ", ".join(f"{x:,.0f} B" for x in wrote)
        + f" at {', '.join(f'{n:,}' for n in sizes)} pairs: "
        + ("**O(new messages)**, flat." if max(wrote) - min(wrote) <= 256 else "**not flat**.")
    )
    for n in sizes:
        floor = res.history_bytes.get(n)
        if floor and n == max(sizes):
            read = median([s.resume_server.net_out for s in res.of(OURS, n)])
            lrange = median([s.resume_server.by_cmd.get("lrange", 0) for s in res.of(OURS, n)])
            lines.append(
                f"- Bytes read per resume (ours, {n:,} pairs): {kb(read)} for a stored history "
                f"of {kb(floor)} ({read / floor:.2f}x the floor of one read per model call; "
                f"LRANGE calls: {lrange:.0f})."
            )
    return lines
