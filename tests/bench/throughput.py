"""Item 3: complete runs per second with 1, 2 and 4 worker processes, and where the time goes.

Processes (all on this machine): one private redis-server, the fake model in a process of
its own (``tests.bench.fake_model``), N real ``python -m agent_core.worker`` processes running
``tests.bench.agent:agent``, and this driver. The driver keeps ``concurrency`` runs in flight
(closed loop): it starts a run with ``Gateway.start_run``, reads the events stream, approves
each ``gate.opened`` with ``Gateway.decide`` as the bot would, and counts ``run.completed``.
A run is start → model turn (one gated call) → pause → approve → tool → model turn → done.

Each configuration starts on an empty Redis with fresh workers, runs a warm-up, then is
bounded by a run count and a time limit. CPU seconds per process come from /proc and are
divided by the completed runs. The profile is a separate run (so the sampler does not
perturb the figures): ``py-spy record`` on the single worker under the same load.

Where Redis is is a :class:`Target`: :class:`OneNode` here, a Redis Cluster in
``tests.bench.cluster_throughput`` (the same measurement, :func:`measure`, on both).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from redis.asyncio import Redis

from agent_core import Decision, Gateway, Keys, create_redis
from agent_core.connections import connect_redis
from agent_core.streams import stream_groups
from tests.bench.agent import TASK
from tests.bench.common import each_shard, kb, median, p99
from tests.bench.procs import FakeModelProcess, Workers, cpu_seconds, machine_busy_seconds
from tests.redis_server import RedisServer

KEYS = Keys("bench")


@dataclass
class DriveStats:
    completed: int
    failed: int
    seconds: float
    latencies: list[float]


class Driver:
    """Starts runs, approves their gates as they open, waits for them to finish."""

    def __init__(
        self, url: str, *, redis: Redis | None = None, reader: Redis | None = None
    ) -> None:
        self.redis = redis if redis is not None else create_redis(url)
        # Blocking XREAD on a connection of its own.
        self.reader = reader if reader is not None else create_redis(url)
        self.gateway = Gateway(self.redis, KEYS, agent_name="bench")
        self._decisions: set[asyncio.Task[object]] = set()

    @classmethod
    async def connect(cls, url: str) -> Driver:
        """Clients as the bot makes them (``connect_redis``): redis-py's cluster client when
        ``url`` is a Redis Cluster node, else :func:`create_redis`'s."""
        redis = await connect_redis(url)
        try:
            reader = await connect_redis(url)
        except BaseException:
            await redis.aclose()
            raise
        return cls(url, redis=redis, reader=reader)

    async def drive(
        self, total: int, concurrency: int, max_seconds: float, rate: float | None = None
    ) -> DriveStats:
        """``rate``: start runs at this many a second (open loop, still at most
        ``concurrency`` in flight) instead of as fast as runs finish."""
        last = await self._last_event_ids()
        started: dict[str, float] = {}
        latencies: list[float] = []
        failed = 0
        slots = asyncio.Semaphore(concurrency)
        t_start = time.perf_counter()
        deadline = t_start + max_seconds
        n_started = 0
        starting_done = asyncio.Event()

        # A gate may open before start_run has returned (a fast worker): its event is kept
        # until the run is known, else the run would wait for an approval that never comes.
        early: dict[str, list[str]] = {}

        def approve(gate_id: str, run_id: str) -> None:
            # The event names the gate's run: the decision is one round trip.
            task = asyncio.create_task(
                self.gateway.decide(gate_id, Decision.APPROVE, by="U-approver", run_id=run_id)
            )
            self._decisions.add(task)
            task.add_done_callback(self._decisions.discard)

        async def starter() -> None:
            nonlocal n_started
            try:
                while n_started < total and time.perf_counter() < deadline:
                    if rate is not None:
                        wait = t_start + n_started / rate - time.perf_counter()
                        if wait > 0:
                            await asyncio.sleep(wait)
                    await slots.acquire()
                    run = await self.gateway.start_run(
                        TASK, requested_by="U-bench", origin={"channel": "C-bench"}
                    )
                    started[run.run_id] = time.perf_counter()
                    n_started += 1
                    for gate_id in early.pop(run.run_id, []):
                        approve(gate_id, run.run_id)
            finally:
                starting_done.set()

        # One XREAD of every shard's events on one node; on Redis Cluster (a read cannot span
        # slots) one reader task per shard, feeding a queue.
        groups = stream_groups(self.reader, list(last))
        queue: asyncio.Queue[list[Any]] = asyncio.Queue()
        reading = asyncio.Event()
        reading.set()
        readers = (
            [
                asyncio.create_task(self._read_into(queue, {s: last[s] for s in group}, reading))
                for group in groups
            ]
            if len(groups) > 1
            else []
        )

        async def next_events() -> list[Any]:
            if not readers:
                return list(await self.reader.xread(last, count=1000, block=100) or [])
            for reader in readers:
                if reader.done():
                    reader.result()  # a reader failed: raise its error
                    raise RuntimeError("an events reader stopped")
            try:
                batch = await asyncio.wait_for(queue.get(), 0.1)
            except TimeoutError:
                return []
            while not queue.empty():
                batch += queue.get_nowait()
            return batch

        start_task = asyncio.create_task(starter())
        hard_end = deadline + 60
        t_last = t_start
        try:
            while not (starting_done.is_set() and len(latencies) + failed >= n_started):
                if time.perf_counter() > hard_end:
                    raise TimeoutError(
                        f"{n_started - len(latencies) - failed} runs unfinished after {max_seconds + 60} s"
                    )
                for stream, entries in await next_events():
                    for msg_id, fields in entries:
                        last[stream] = msg_id
                        kind, run_id = fields.get("type"), fields.get("run_id", "")
                        if run_id not in started:
                            if kind == "gate.opened":
                                gate_id = json.loads(fields["data"])["gate_id"]
                                early.setdefault(run_id, []).append(gate_id)
                            continue
                        if kind == "gate.opened":
                            approve(json.loads(fields["data"])["gate_id"], run_id)
                        elif kind in ("run.completed", "run.failed"):
                            t_last = time.perf_counter()
                            if kind == "run.completed":
                                latencies.append(t_last - started.pop(run_id))
                            else:
                                failed += 1
                                started.pop(run_id)
                            slots.release()
        finally:
            start_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await start_task
            await _stop_readers(readers, reading)
        return DriveStats(len(latencies), failed, t_last - t_start, latencies)

    async def _read_into(
        self, queue: asyncio.Queue[list[Any]], last: dict[str, str], reading: asyncio.Event
    ) -> None:
        """Read the streams of ``last`` (one shard's on Redis Cluster) into ``queue`` while
        ``reading`` is set."""
        while reading.is_set():
            reply = await self.reader.xread(last, count=1000, block=100)
            for stream, entries in reply or []:
                if entries:
                    last[stream] = entries[-1][0]
                    queue.put_nowait([(stream, entries)])

    async def _last_event_ids(self) -> dict[str, str]:
        """The last entry of every events stream (one per shard)."""
        last: dict[str, str] = {}
        for stream in each_shard(KEYS, "events"):
            entries = await self.redis.xrevrange(stream, count=1)
            last[stream] = entries[0][0] if entries else "0-0"
        return last

    async def wait_consumers(self, n: int, timeout: float = 60) -> None:
        """Until n workers wait on the jobs stream (a connection blocked in XREADGROUP each)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            clients = await self.redis.client_list()
            if sum(1 for c in clients if c.get("cmd") == "xreadgroup") >= n:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{n} workers did not join the jobs group in {timeout} s")

    async def aclose(self) -> None:
        await self.redis.aclose()
        await self.reader.aclose()


async def _stop_readers(readers: list[asyncio.Task[None]], reading: asyncio.Event) -> None:
    """End the reader tasks: each returns after its current read (at most 100 ms of BLOCK).

    Not by cancelling them: redis-py's asyncio cluster client (8.1.0) now and then swallows a
    CancelledError raised inside a blocked XREAD (7 of 300 cancels in a loopback repro, none
    with the single-node client), and the task then reads on forever. Cancelled after 15 s,
    and not waited for, if one is still there."""
    if not readers:
        return
    reading.clear()
    _, pending = await asyncio.wait(readers, timeout=15)
    for task in pending:
        task.cancel()
    for task in readers:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved (a failure during the drive was raised there)


@dataclass
class ThroughputResult:
    workers: int
    whatif: bool  # openai-python's parameter transform skipped (the proposed fix)
    stats: DriveStats
    cpu: dict[str, float]  # CPU seconds per component over the measured window
    machine_cpu: float  # CPU seconds of every process on the machine over the window
    redis_bytes: int  # used_memory growth over the window (completed runs are kept)
    # CPU seconds of each redis-server process (cpu["redis-server"] is their sum)
    redis_cpu: dict[str, float] = field(default_factory=dict)
    key_spread: dict[int, int] = field(default_factory=dict)  # master port → DBSIZE at the end

    @property
    def runs_per_s(self) -> float:
        return self.stats.completed / self.stats.seconds if self.stats.seconds else 0.0


@dataclass
class Profile:
    samples: int
    by_area: list[tuple[str, float]]
    top_self: list[tuple[str, float]]
    inclusive: list[tuple[str, float]]
    error: str | None = None


@dataclass
class ThroughputResults:
    concurrency: int
    results: list[ThroughputResult] = field(default_factory=list)
    profile: Profile | None = None


class Target(Protocol):
    """Where the Redis of a measurement is (one node, or a Redis Cluster)."""

    @property
    def url(self) -> str:
        """What the workers get in REDIS_URL and the driver connects to."""
        ...

    @property
    def readers_per_worker(self) -> int:
        """The blocked XREADGROUP connections of one idle worker."""
        ...

    def redis_pids(self) -> dict[str, int]:
        """Every redis-server process, by a label starting with "redis-server"."""
        ...

    async def flush(self) -> None: ...

    async def blocked_readers(self) -> int:
        """Connections blocked in XREADGROUP, over every node."""
        ...

    async def used_memory(self) -> int:
        """``used_memory`` of the data (every master's, summed)."""
        ...

    async def key_spread(self) -> dict[int, int]:
        """DBSIZE of each master by port (empty on one node: nothing to spread)."""
        ...


class OneNode:
    """One redis-server."""

    readers_per_worker = 1

    def __init__(self, server: RedisServer) -> None:
        self.server = server

    @property
    def url(self) -> str:
        return self.server.url

    def redis_pids(self) -> dict[str, int]:
        return {"redis-server": self.server.pid or 0}

    async def flush(self) -> None:
        client = Redis.from_url(self.url)
        try:
            await client.flushall()
        finally:
            await client.aclose()

    async def blocked_readers(self) -> int:
        client = Redis.from_url(self.url, decode_responses=True)
        try:
            return sum(1 for c in await client.client_list() if c.get("cmd") == "xreadgroup")
        finally:
            await client.aclose()

    async def used_memory(self) -> int:
        client = Redis.from_url(self.url, decode_responses=True)
        try:
            return int((await client.info("memory"))["used_memory"])
        finally:
            await client.aclose()

    async def key_spread(self) -> dict[int, int]:
        return {}


async def wait_readers(target: Target, n_workers: int, timeout: float = 60) -> None:
    """Until n workers wait on the jobs streams (``readers_per_worker`` blocked XREADGROUP
    connections each: one on one node, one per shard on Redis Cluster)."""
    want = n_workers * target.readers_per_worker
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await target.blocked_readers() >= want:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{n_workers} workers did not join the jobs group in {timeout} s")


async def measure(
    target: Target,
    fake: FakeModelProcess,
    n_workers: int,
    *,
    total: int,
    seconds: float,
    concurrency: int,
    logdir: Path,
    whatif: bool = False,
    on_load: Callable[[Workers], None] | None = None,
    rate: float | None = None,
) -> ThroughputResult:
    """One configuration on an emptied ``target``: fresh workers, a warm-up, the window."""
    await target.flush()
    driver = await Driver.connect(target.url)
    try:
        extra = {"BENCH_OPENAI_NO_TRANSFORM": "1"} if whatif else {}
        with Workers(n_workers, target.url, fake.base_url, logdir, **extra) as workers:
            await wait_readers(target, n_workers)
            await driver.drive(total=30 * n_workers, concurrency=concurrency, max_seconds=30)
            pids = {f"worker {i + 1}": p.pid for i, p in enumerate(workers.procs)}
            pids |= {**target.redis_pids(), "fake model": fake.pid}
            before = {k: cpu_seconds(v) for k, v in pids.items()}
            driver_before = sum(os.times()[:2])
            machine_before = machine_busy_seconds()
            mem_before = await target.used_memory()
            if on_load is not None:
                on_load(workers)
            stats = await driver.drive(
                total=total, concurrency=concurrency, max_seconds=seconds, rate=rate
            )
            cpu = {k: cpu_seconds(v) - before[k] for k, v in pids.items()}
            cpu["driver (bot side)"] = sum(os.times()[:2]) - driver_before
            machine_cpu = machine_busy_seconds() - machine_before
            mem = await target.used_memory() - mem_before
            spread = await target.key_spread()
            if not workers.alive():
                raise RuntimeError(f"a worker died; see {logdir}")
    finally:
        await driver.aclose()
    redis_cpu = {k: cpu.pop(k) for k in list(cpu) if k.startswith("redis-server")}
    cpu["redis-server"] = sum(redis_cpu.values())
    return ThroughputResult(
        n_workers, whatif, stats, cpu, machine_cpu, mem, redis_cpu=redis_cpu, key_spread=spread
    )


# Owner of a sample: the first library frame from the root (work done on its behalf, down
# to the socket calls); else agent_core's own code; else the event loop itself.
_LIBS = [
    ("redis-py (Redis client: packing, parsing, socket I/O)", ("redis/",)),
    (
        "OpenAI SDK + HTTP client (request transform, httpx, parsing)",
        ("openai/", "httpx", "httpcore", "anyio/", "h11/"),
    ),
    ("aiohttp (the model's HTTP client)", ("aiohttp/", "yarl/", "multidict/")),
    ("pydantic", ("pydantic",)),
    ("json", ("json/",)),
    ("logging", ("logging/",)),
]
_IDLE_LEAVES = ("concurrent/futures/thread.py", "selectors.py", "threading.py")


def _frame_file(frame: str) -> str:
    return frame.rsplit("(", 1)[-1].rstrip(")").rsplit(":", 1)[0] if "(" in frame else frame


def _frame_name(frame: str) -> str:
    return frame.rsplit(" (", 1)[0]


def _frame_func(frame: str) -> str:
    return f"{_frame_name(frame)} ({_frame_file(frame)})"


def _owner(frames: list[str]) -> str:
    loop_seen = False
    own = False
    for f in frames:
        path = _frame_file(f)
        for area, prefixes in _LIBS:
            if path.startswith(prefixes):
                return area
        if _frame_name(f) == "Handle._run":
            loop_seen = True
        elif loop_seen and path.startswith("agent_core/"):
            own = True
    return "agent_core code" if own else "event loop (callbacks, scheduling)"


def parse_profile(raw: str) -> Profile:
    """Owners of the worker's CPU samples, hottest functions, inclusive agent_core steps."""
    total = 0
    areas: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    watch = {
        "Worker._handle": "job handling (Worker._handle)",
        "ModelTurn._model_turn": "  model turn (ModelTurn._model_turn)",
        "ModelEndpoint.post": "    of which the model's HTTP request (ModelEndpoint.post)",
        "ToolsTurn._tools_turn": "  tools turn (ToolsTurn._tools_turn)",
        "ToolCalls._open_gates": "    of which opening gates",
        "ToolsTurn._run_batch": "    of which the batch: tool + result",
        "StreamConsumer.read": "reading jobs (XREADGROUP, XAUTOCLAIM)",
        "Worker._sweep_forever": "expiry sweeper",
    }
    for line in raw.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack.strip() or not count_s.isdigit():
            continue
        frames = stack.split(";")
        if _frame_file(frames[-1]).startswith(_IDLE_LEAVES):
            continue  # a thread or the selector waiting: idle, not work
        n = int(count_s)
        total += n
        areas[_owner(frames)] += n
        leaves[_frame_func(frames[-1])] += n
        names = {_frame_name(f) for f in frames}
        for key, label in watch.items():
            if key in names:
                incl[label] += n
    if not total:
        return Profile(0, [], [], [], error="py-spy collected no samples")

    def share(c: Counter[str], k: int | None = None) -> list[tuple[str, float]]:
        return [(name, v / total) for name, v in c.most_common(k)]

    order = list(watch.values())
    return Profile(
        total,
        share(areas),
        share(leaves, 12),
        sorted(share(incl), key=lambda kv: order.index(kv[0])),
    )


def _profile_worker(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | str:
    exe = str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        return "py-spy is not installed (`make bench` installs it)"
    return subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "200",
            "--format",
            "raw",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def run_throughput_bench(
    workers: list[int],
    *,
    whatif_workers: list[int],
    total: int,
    seconds: float,
    concurrency: int,
    profile_seconds: float,
    log: Callable[[str], None],
) -> ThroughputResults:
    out = ThroughputResults(concurrency)
    logdir = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    with RedisServer() as server:
        fake = FakeModelProcess()
        try:
            configs = [(n, False) for n in workers] + [(n, True) for n in whatif_workers]
            for n, whatif in configs:
                r = await measure(
                    OneNode(server),
                    fake,
                    n,
                    total=total,
                    seconds=seconds,
                    concurrency=concurrency,
                    logdir=logdir,
                    whatif=whatif,
                )
                out.results.append(r)
                log(
                    f"  {n} worker(s){' (what-if)' if whatif else ''}: {r.stats.completed} runs "
                    f"in {r.stats.seconds:.1f} s = {r.runs_per_s:.0f} runs/s"
                )
            if profile_seconds > 0:
                out.profile = await _profile(server, fake, profile_seconds, concurrency, logdir)
        finally:
            fake.stop()
    shutil.rmtree(logdir, ignore_errors=True)
    return out


async def _profile(
    server: RedisServer, fake: FakeModelProcess, seconds: float, concurrency: int, logdir: Path
) -> Profile:
    raw_file = logdir / "py-spy.txt"
    spy: list[subprocess.Popen[bytes] | str] = []

    def start(workers: Workers) -> None:
        spy.append(_profile_worker(workers.procs[0].pid, seconds, raw_file))

    await measure(
        OneNode(server),
        fake,
        1,
        total=10**9,
        seconds=seconds + 1,
        concurrency=concurrency,
        logdir=logdir,
        on_load=start,
    )
    proc = spy[0]
    if isinstance(proc, str):
        return Profile(0, [], [], [], error=proc)
    _, err = proc.communicate(timeout=60)
    if proc.returncode != 0 or not raw_file.exists():
        msg = err.decode(errors="replace").strip().splitlines()
        return Profile(0, [], [], [], error=f"py-spy failed: {msg[0] if msg else proc.returncode}")
    keep = os.environ.get("BENCH_KEEP_PROFILE")  # a path: the raw py-spy samples, kept
    if keep:
        shutil.copyfile(raw_file, keep)
    return parse_profile(raw_file.read_text())


RUN_HEADER = [
    "workers",
    "runs/s",
    "vs 1 worker",
    "runs",
    "failed",
    "seconds",
    "run latency ms p50 / p99 (queueing included)",
    "Redis memory per finished run",
]


def run_row(r: ThroughputResult, base: float, label: str | None = None) -> list[str]:
    """A row of the throughput table (``base``: the 1-worker runs/s)."""
    lat = r.stats.latencies
    n = max(r.stats.completed, 1)
    return [
        label or str(r.workers),
        f"{r.runs_per_s:.0f}",
        f"{r.runs_per_s / base:.2f}x" if base else "n/a",
        f"{r.stats.completed:,}",
        str(r.stats.failed),
        f"{r.stats.seconds:.1f}",
        f"{median(lat) * 1000:.0f} / {p99(lat) * 1000:.0f}",
        kb(r.redis_bytes / n),
    ]


def cpu_row(
    r: ThroughputResult, components: list[str], label: str | None = None, *, replicas: bool = False
) -> list[str]:
    """A row of the CPU table: ms per completed run of all workers, then each other
    component (``replicas``: the replicas' part of redis-server after it), then how busy the
    benchmark's processes and the machine's other processes kept the cores."""
    n = max(r.stats.completed, 1)
    cores = os.cpu_count() or 1
    worker_cpu = sum(v for k, v in r.cpu.items() if k.startswith("worker"))
    total_cpu = sum(r.cpu.values())
    cells = [label or str(r.workers), f"{worker_cpu / n * 1000:.2f}"]
    for c in components:
        if c.startswith("worker"):
            continue
        cells.append(f"{r.cpu.get(c, 0.0) / n * 1000:.2f}")
        if replicas and c == "redis-server":
            rep = sum(v for k, v in r.redis_cpu.items() if "replica" in k)
            cells.append(f"{rep / n * 1000:.2f}")
    return [
        *cells,
        f"{total_cpu / r.stats.seconds / cores * 100:.0f}%" if r.stats.seconds else "n/a",
        f"{max(r.machine_cpu - total_cpu, 0.0) / r.stats.seconds / cores * 100:.0f}%"
        if r.stats.seconds
        else "n/a",
    ]


def cpu_components(results: list[ThroughputResult]) -> list[str]:
    return sorted({k for r in results for k in r.cpu}, key=_component_order)


def throughput_tables(res: ThroughputResults) -> list[tuple[str, list[str], list[list[str]]]]:
    base = res.results[0].runs_per_s if res.results else 0.0
    components = cpu_components(res.results)
    rows = []
    cpu_rows = []
    for r in res.results:
        label = f"{r.workers} (what-if: no openai transform)" if r.whatif else str(r.workers)
        rows.append(run_row(r, base, label))
        cpu_rows.append(cpu_row(r, components, label))
    tables = [
        (
            f"Throughput: complete runs (start → gate → approve → tool → done), {res.concurrency} runs in flight",
            RUN_HEADER,
            rows,
        ),
        (
            "CPU per completed run (ms), all processes on the same 2 cores",
            [
                "workers",
                "all workers",
                *(c for c in components if not c.startswith("worker")),
                "cores busy: benchmark",
                "cores busy: other processes",
            ],
            cpu_rows,
        ),
    ]
    p = res.profile
    if p is not None and not p.error:
        tables.append(
            (
                f"Where one worker's CPU goes (py-spy, {p.samples:,} samples, innermost frame)",
                ["area", "share of worker CPU"],
                [[a, f"{s * 100:.0f}%"] for a, s in p.by_area],
            )
        )
        tables.append(
            (
                "Worker CPU by step (inclusive)",
                ["step", "share of worker CPU"],
                [[a, f"{s * 100:.0f}%"] for a, s in p.inclusive],
            )
        )
        tables.append(
            (
                "Hottest functions (self time)",
                ["function", "share of worker CPU"],
                [[a, f"{s * 100:.1f}%"] for a, s in p.top_self],
            )
        )
    return tables


def _component_order(name: str) -> tuple[int, str]:
    order = ["worker", "redis-server", "fake model", "driver"]
    for i, prefix in enumerate(order):
        if name.startswith(prefix):
            return (i, name)
    return (len(order), name)
