"""Item 1: pause and resume versus history length, ours against the OpenAI Agents SDK and LangGraph.

One scenario for every framework, on the same redis-server and the same fake model
(:class:`agent_core.testing.FakeOpenAI` in a process of its own, ``tests.bench.fake_model``):

    history = task (user) + N prior messages (~200 characters, assistant/user alternating)
    model turn 1 → one call of ``delete_user`` (needs approval) → the run pauses, durably
    a person approves → the tool starts → model turn 2 → "Done."

Windows timed on each repetition (``time.perf_counter``):

* ``prep``: turn start → the model request is made. Ours: the start job is put on the jobs
  stream, a worker takes it, reads the run and its history. SDK: ``Runner.run`` converts
  its input. LangGraph: ``ainvoke`` loads the checkpoint.
* ``model``: the model round trip (inside ``chat.completions.create``): reported, never
  counted as anyone's overhead.
* ``pause``: the model's answer → the pause is durable. Ours: the worker's job is finished
  (gate opened, run ``awaiting_approval``, job acknowledged, lease released). SDK:
  ``RunState.to_json()`` is stored with ``SET``. LangGraph: ``ainvoke`` returned the
  interrupt with ``durability="sync"``.
* ``resume``: the decision is made → the approved tool starts. Ours: ``Gateway.decide`` (the
  bot's side) + a worker's resume job. SDK: ``GET`` + ``RunState.from_json`` + ``approve`` +
  ``Runner.run``. LangGraph: ``ainvoke(Command(resume="approve"))``.
* ``finish``: tool start → run finished, minus the second model round trip.

The frameworks run interleaved (the order rotates on every repetition) in one process;
``gc.collect()`` runs between repetitions, outside the windows. Ours runs a real
:class:`agent_core.worker.Worker` on the event loop of this process (the job path of
production: jobs stream, consumer group, lease), with the production Redis client settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI
from redis.asyncio import Redis

from agent_core import Decision, Gateway, Keys, RunStatus, Settings, create_redis
from agent_core.gateway import new_run_id
from agent_core.streams import StreamMessage
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
    p99,
    prior_messages,
    ratio,
)
from tests.bench.fake_model import task_for
from tests.bench.procs import FakeModelProcess

API_KEY = "sk-bench-not-a-secret"
MODEL = "fake-model"
INSTRUCTIONS = "You are a benchmark agent."
OURS, SDK, LANGGRAPH = "ours", "openai-agents", "langgraph*"


@dataclass
class Sample:
    framework: str
    n: int
    prep: float
    model: float
    pause: float
    resume: float
    finish: float
    pause_traffic: Traffic
    resume_traffic: Traffic  # decision → tool start
    cycle_traffic: Traffic  # decision → run finished
    pause_server: ServerStats
    resume_server: ServerStats  # decision → run finished

    @property
    def overhead(self) -> float:
        """Pause + resume: the gateway's cost around one human decision."""
        return self.pause + self.resume

    @property
    def total(self) -> float:
        """Everything but the two model round trips."""
        return self.prep + self.pause + self.resume + self.finish


class ToolProbe:
    """Timestamps the start of the gated tool, with the Redis traffic counters at that moment."""

    def __init__(self, traffic: Callable[[], Traffic]) -> None:
        self.traffic = traffic
        self.started: tuple[float, Traffic] | None = None

    def mark(self) -> None:
        self.started = (time.perf_counter(), self.traffic())

    def take(self) -> tuple[float, Traffic]:
        assert self.started is not None, "the tool did not start"
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

    def _split_model(self, t0: float, t1: float) -> tuple[float, float, float]:
        calls = self.clock.within(t0, t1)
        assert len(calls) == 1, f"{self.name}: {len(calls)} model calls in the pause window"
        start, end = calls[0]
        return start - t0, end - start, t1 - end


# =========================================================================== ours
class _BenchWorker(Worker):
    """The real worker, telling the benchmark when each job is finished."""

    def __init__(self, *args: Any, jobs_done: asyncio.Queue[tuple[str, float]], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.jobs_done = jobs_done

    async def _handle(self, msg: StreamMessage) -> None:
        await super()._handle(msg)
        self.jobs_done.put_nowait((msg.fields.get("type", ""), time.perf_counter()))


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
        self.keys = Keys("bench")
        self.worker_traffic, self.bot_traffic = Traffic(), Traffic()
        self.worker_redis = count_traffic(create_redis(url), self.worker_traffic)
        self.bot_redis = count_traffic(create_redis(url), self.bot_traffic)
        self.setup_redis = create_redis(url)  # not counted: preloading histories
        self.gateway = Gateway(self.bot_redis, self.keys, agent_name=bench_agent.agent.name)
        self.clock = ModelClock()
        self.client = self.clock.wrap(
            AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
        )
        self.jobs_done: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
        self.tool = ToolProbe(self.traffic)
        self.worker = _BenchWorker(
            self.worker_redis,
            bench_agent.agent,
            self.client,
            self.settings,
            jobs_done=self.jobs_done,
        )
        self._task: asyncio.Task[None] | None = None

    def traffic(self) -> Traffic:
        return self.worker_traffic + self.bot_traffic

    async def setup(self) -> None:
        bench_agent.on_tool_start = self.tool.mark
        self._task = asyncio.create_task(self.worker.run())
        # The preloaded run must look exactly like one made by Gateway.start_run.
        real = await self.gateway.start_run(task_for(0), requested_by="U-bench")
        await self._job_done()
        mine = await self._create_run(0)
        # The lease fields are the worker's (written when it takes a run), not start_run's.
        lease = {"fence", "lease_until", "lease_owner"}
        real_fields = set(await self.setup_redis.hkeys(self.keys.run(real.run_id))) - lease
        my_fields = set(await self.setup_redis.hkeys(self.keys.run(mine))) - lease
        assert my_fields == real_fields, f"run shape drifted: {my_fields ^ real_fields}"
        await self.setup_redis.xadd(self.keys.jobs(), {"type": "start", "run_id": mine})
        await self._job_done()

    async def _job_done(self) -> float:
        _kind, t = await asyncio.wait_for(self.jobs_done.get(), 120)
        # Let the worker issue its next blocking XREADGROUP: it delivers the next job, so
        # each window holds exactly one.
        await asyncio.sleep(0.003)
        return t

    async def _create_run(self, n: int) -> str:
        """Gateway.start_run's writes, with n prior messages, without the start job."""
        run_id = new_run_id()
        now = time.time()
        task = task_for(n)
        k = self.keys
        fields = {
            "run_id": run_id,
            "agent": bench_agent.agent.name,
            "task": task,
            "requested_by": "U-bench",
            "origin": json.dumps({"channel": "C-bench"}),
            "status": "queued",
            "phase": "model",
            "turn": 0,
            "pending": 0,
            "created_at": f"{now:.6f}",
            "updated_at": f"{now:.6f}",
        }
        history = [json.dumps({"role": "user", "content": task})]
        history += [json.dumps(m) for m in prior_messages(n)]
        async with self.setup_redis.pipeline(transaction=True) as pipe:
            pipe.hset(k.run(run_id), mapping=fields)
            pipe.rpush(k.history(run_id), *history)
            pipe.zadd(k.user_runs("U-bench"), {run_id: now})
            pipe.zadd(k.active(), {run_id: now})
            await pipe.execute()
        return run_id

    async def rep(self, n: int) -> Sample:
        run_id = await self._create_run(n)
        s0, c0 = await self.probe.snapshot(), self.traffic()
        t0 = time.perf_counter()
        await self.bot_redis.xadd(self.keys.jobs(), {"type": "start", "run_id": run_id})
        t1 = await self._job_done()
        c1, s1 = self.traffic(), await self.probe.snapshot()
        prep, model, pause = self._split_model(t0, t1)

        gates = await self.gateway.pending_gates(run_id)
        assert len(gates) == 1, f"expected one pending gate, got {gates}"
        s2, c2 = await self.probe.snapshot(), self.traffic()
        t2 = time.perf_counter()
        res = await self.gateway.decide(gates[0].gate_id, Decision.APPROVE, by="U-approver")
        assert res.applied
        t4 = await self._job_done()
        c4, s4 = self.traffic(), await self.probe.snapshot()
        t3, c3 = self.tool.take()
        run = await self.gateway.get_run(run_id)
        assert run is not None and run.status is RunStatus.COMPLETED, run
        return Sample(
            OURS,
            n,
            prep,
            model,
            pause,
            t3 - t2,
            t4 - t3 - self.clock.time_within(t3, t4),
            c1 - c0,
            c3 - c2,
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


# =========================================================================== OpenAI Agents SDK
class AgentsSdk(Framework):
    """``needs_approval=True``; the paused ``RunState.to_json()`` is SET in Redis, GET to resume."""

    name = SDK

    def __init__(self, url: str, base_url: str, probe: ServerProbe) -> None:
        from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled

        set_tracing_disabled(True)
        self.probe = probe
        self.traffic_ = Traffic()
        self.redis = count_traffic(create_redis(url), self.traffic_)
        self.clock = ModelClock()
        self.client = self.clock.wrap(
            AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
        )
        self.tool = ToolProbe(self.traffic_.snapshot)
        probe_tool = self.tool

        @function_tool(needs_approval=True)
        async def delete_user(user_id: str) -> str:
            """Permanently delete a user."""
            probe_tool.mark()
            return f"user {user_id} deleted"

        self.agent = Agent(
            name="bench",
            instructions=INSTRUCTIONS,
            tools=[delete_user],
            model=OpenAIChatCompletionsModel(model=MODEL, openai_client=self.client),
        )

    @staticmethod
    def _input(n: int) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = [{"role": "user", "content": task_for(n)}]
        for i, m in enumerate(prior_messages(n)):
            if m["role"] == "assistant":  # as the SDK itself records assistant output
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "id": f"msg_{i}",
                        "status": "completed",
                        "content": [
                            {"type": "output_text", "text": m["content"], "annotations": []}
                        ],
                    }
                )
            else:
                items.append({"role": "user", "content": m["content"]})
        return items

    async def rep(self, n: int) -> Sample:
        from agents import Runner, RunState

        items = self._input(n)
        key = f"sdk:run:{uuid.uuid4().hex}"
        s0, c0 = await self.probe.snapshot(), self.traffic_.snapshot()
        t0 = time.perf_counter()
        result = await Runner.run(self.agent, items)  # type: ignore[arg-type]
        assert result.interruptions, "the SDK did not pause"
        await self.redis.set(key, json.dumps(result.to_state().to_json(), separators=(",", ":")))
        t1 = time.perf_counter()
        c1, s1 = self.traffic_.snapshot(), await self.probe.snapshot()
        prep, model, pause = self._split_model(t0, t1)

        s2, c2 = await self.probe.snapshot(), self.traffic_.snapshot()
        t2 = time.perf_counter()
        raw = await self.redis.get(key)
        state = await RunState.from_json(self.agent, json.loads(raw))
        for item in state.get_interruptions():
            state.approve(item)
        result = await Runner.run(self.agent, state)
        t4 = time.perf_counter()
        c4, s4 = self.traffic_.snapshot(), await self.probe.snapshot()
        t3, c3 = self.tool.take()
        assert result.final_output == "Done.", result.final_output
        return Sample(
            SDK,
            n,
            prep,
            model,
            pause,
            t3 - t2,
            t4 - t3 - self.clock.time_within(t3, t4),
            c1 - c0,
            c3 - c2,
            c4 - c2,
            self.probe.delta(s0, s1),
            self.probe.delta(s2, s4),
        )

    async def close(self) -> None:
        await self.client.close()
        await self.redis.aclose()


# =========================================================================== LangGraph
class LangGraph(Framework):
    """``interrupt()`` in the tool + ``Command(resume=...)``, ``durability="sync"``.

    The checkpointer is :class:`tests.bench.lg_saver.PlainRedisSaver` (plain Redis), not
    ``langgraph-checkpoint-redis``, which needs Redis Stack modules this machine cannot run.
    """

    name = LANGGRAPH

    def __init__(self, url: str, base_url: str, probe: ServerProbe) -> None:
        from langchain_core.messages import SystemMessage
        from langchain_core.tools import tool as lc_tool
        from langchain_openai import ChatOpenAI
        from langgraph.graph import START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition
        from langgraph.types import interrupt

        from tests.bench.lg_saver import PlainRedisSaver

        self.probe = probe
        self.traffic_ = Traffic()
        self.redis = count_traffic(Redis.from_url(url), self.traffic_)
        self.clock = ModelClock()
        self.client = self.clock.wrap(
            AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
        )
        self.tool = ToolProbe(self.traffic_.snapshot)
        probe_tool = self.tool

        @lc_tool
        async def delete_user(user_id: str) -> str:
            """Permanently delete a user."""
            decision = interrupt({"tool": "delete_user", "args": {"user_id": user_id}})
            if decision != "approve":
                return "declined"
            probe_tool.mark()
            return f"user {user_id} deleted"

        llm = ChatOpenAI(
            model=MODEL,
            api_key=API_KEY,  # type: ignore[arg-type]
            base_url=base_url,
            async_client=self.client.chat.completions,
            max_retries=0,
        ).bind_tools([delete_user])

        async def agent_node(state: MessagesState) -> dict[str, Any]:
            reply_ = await llm.ainvoke([SystemMessage(INSTRUCTIONS), *state["messages"]])
            return {"messages": [reply_]}

        g = StateGraph(MessagesState)
        g.add_node("agent", agent_node)
        g.add_node("tools", ToolNode([delete_user]))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
        self.start = START
        self.graph = g.compile(checkpointer=PlainRedisSaver(self.redis))

    @staticmethod
    def _messages(n: int) -> list[Any]:
        from langchain_core.messages import AIMessage, HumanMessage

        out: list[Any] = [HumanMessage(task_for(n))]
        for m in prior_messages(n):
            out.append(
                AIMessage(m["content"]) if m["role"] == "assistant" else HumanMessage(m["content"])
            )
        return out

    async def rep(self, n: int) -> Sample:
        from langgraph.types import Command

        cfg: Any = {"configurable": {"thread_id": uuid.uuid4().hex}}
        # Not measured: the history is already persisted in the thread's checkpoint.
        await self.graph.aupdate_state(cfg, {"messages": self._messages(n)}, as_node=self.start)
        s0, c0 = await self.probe.snapshot(), self.traffic_.snapshot()
        t0 = time.perf_counter()
        out = await self.graph.ainvoke(None, cfg, durability="sync")
        t1 = time.perf_counter()
        c1, s1 = self.traffic_.snapshot(), await self.probe.snapshot()
        assert out.get("__interrupt__"), "LangGraph did not pause"
        prep, model, pause = self._split_model(t0, t1)

        s2, c2 = await self.probe.snapshot(), self.traffic_.snapshot()
        t2 = time.perf_counter()
        out = await self.graph.ainvoke(Command(resume="approve"), cfg, durability="sync")
        t4 = time.perf_counter()
        c4, s4 = self.traffic_.snapshot(), await self.probe.snapshot()
        t3, c3 = self.tool.take()
        assert out["messages"][-1].content == "Done.", out["messages"][-1]
        return Sample(
            LANGGRAPH,
            n,
            prep,
            model,
            pause,
            t3 - t2,
            t4 - t3 - self.clock.time_within(t3, t4),
            c1 - c0,
            c3 - c2,
            c4 - c2,
            self.probe.delta(s0, s1),
            self.probe.delta(s2, s4),
        )

    async def close(self) -> None:
        await self.client.close()
        await self.redis.aclose()


# =========================================================================== driver
@dataclass
class PauseResults:
    sizes: list[int]
    reps: dict[int, int]
    frameworks: list[str]
    samples: list[Sample] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def of(self, framework: str, n: int) -> list[Sample]:
        return [s for s in self.samples if s.framework == framework and s.n == n]


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
) -> PauseResults:
    _quiet_third_parties()
    probe = ServerProbe(url)
    await probe.calibrate()
    results = PauseResults(sizes, reps, [])
    fake = FakeModelProcess(sorted({0, *sizes}))
    try:
        makers: list[tuple[str, Callable[[], Framework]]] = [
            (OURS, lambda: Ours(url, fake.base_url, probe))
        ]
        if peers:
            makers += [
                (SDK, lambda: AgentsSdk(url, fake.base_url, probe)),
                (LANGGRAPH, lambda: LangGraph(url, fake.base_url, probe)),
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
            results.frameworks.append(name)
        try:
            for n in sizes:
                for fw in frameworks:  # warm-up: imports, scripts loaded, connections open
                    await fw.rep(n)
                t = time.perf_counter()
                for i in range(reps[n]):
                    order = frameworks[i % len(frameworks) :] + frameworks[: i % len(frameworks)]
                    for fw in order:
                        gc.collect()
                        results.samples.append(await fw.rep(n))
                log(
                    f"  history {n}: {reps[n]} reps x {len(frameworks)} in {time.perf_counter() - t:.1f} s"
                )
        finally:
            for fw in frameworks:
                await fw.close()
            await probe.aclose()
    finally:
        fake.stop()
    return results


# =========================================================================== tables
def _p(xs: list[float]) -> str:
    return f"{ms(median(xs))} / {ms(p99(xs))}"


def pause_tables(res: PauseResults) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the item-1 tables."""
    timing: list[list[str]] = []
    traffic: list[list[str]] = []
    for n in res.sizes:
        for fw in res.frameworks:
            ss = res.of(fw, n)
            if not ss:
                continue
            timing.append(
                [
                    f"{n:,}",
                    fw,
                    _p([s.pause for s in ss]),
                    _p([s.resume for s in ss]),
                    _p([s.overhead for s in ss]),
                    _p([s.prep for s in ss]),
                    _p([s.finish for s in ss]),
                    ms(median([s.model for s in ss])),
                ]
            )
            traffic.append(
                [
                    f"{n:,}",
                    fw,
                    kb(median([s.pause_traffic.bytes_out for s in ss])),
                    kb(median([s.pause_server.net_in for s in ss])),
                    f"{median([s.pause_traffic.round_trips for s in ss]):.0f}",
                    f"{median([s.pause_server.calls for s in ss]):.0f}",
                    f"{median([s.resume_traffic.round_trips for s in ss]):.0f}",
                    f"{median([s.cycle_traffic.round_trips for s in ss]):.0f}",
                    kb(median([s.resume_traffic.bytes_out for s in ss])),
                    kb(median([s.resume_server.net_out for s in ss])),
                ]
            )
    ratios: list[list[str]] = []
    peers = [f for f in res.frameworks if f != OURS]
    for n in res.sizes:
        ours = res.of(OURS, n)
        if not ours:
            continue
        for fw in peers:
            ss = res.of(fw, n)
            if not ss:
                continue
            ratios.append(
                [
                    f"{n:,}",
                    f"{fw} / ours",
                    ratio(median([s.pause for s in ss]), median([s.pause for s in ours])),
                    ratio(median([s.resume for s in ss]), median([s.resume for s in ours])),
                    ratio(median([s.overhead for s in ss]), median([s.overhead for s in ours])),
                    ratio(median([s.total for s in ss]), median([s.total for s in ours])),
                    ratio(
                        median([s.pause_traffic.bytes_out for s in ss]),
                        median([s.pause_traffic.bytes_out for s in ours]),
                    ),
                ]
            )
    return [
        (
            "Pause and resume versus history length: time (ms, median / p99)",
            [
                "history",
                "framework",
                "pause",
                "decision → tool start",
                "pause + resume",
                "prep (turn start → model request)",
                "finish (tool → done, ex-model)",
                "model round trip (excluded)",
            ],
            timing,
        ),
        (
            "Pause and resume versus history length: Redis traffic (medians)",
            [
                "history",
                "framework",
                "bytes written / pause (client)",
                "Redis net input / pause (INFO)",
                "round trips / pause",
                "commands / pause (INFO)",
                "round trips decision → tool",
                "round trips decision → done",
                "bytes written decision → tool",
                "bytes read decision → done (INFO)",
            ],
            traffic,
        ),
        (
            "Peer / ours (medians; > 1x means we are cheaper)",
            [
                "history",
                "ratio",
                "pause",
                "decision → tool start",
                "pause + resume",
                "all gateway time ex-model",
                "bytes written / pause",
            ],
            ratios,
        ),
    ]


def commands_table(
    res: PauseResults, framework: str = OURS
) -> tuple[str, list[str], list[list[str]]]:
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
        f"Redis commands of {framework}: one pause, one resume (INFO commandstats, history "
        f"{n:,}, medians; commands run inside Lua scripts are counted too)",
        ["command", "pause", "decision → done"],
        rows,
    )
