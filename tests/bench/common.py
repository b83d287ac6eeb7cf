"""Shared pieces of the benchmarks: Redis traffic counters, model timing, statistics, machine.

Measuring rules used everywhere:

* **Round trips and bytes written** are counted on the client side by a redis-py connection
  class that wraps ``send_packed_command``: one call is one round trip (a pipeline or a
  MULTI/EXEC block is one), and its byte length is what Redis reads from that client. The
  server-side ``INFO`` deltas (``total_net_input_bytes``, ``total_net_output_bytes``, the sum
  of ``INFO commandstats`` calls) are taken around the same windows as a cross-check and for
  bytes *read*, with the cost of the ``INFO`` call itself calibrated and subtracted.
* **The model call** is timed where each framework calls its model (ours: ``post`` of the
  worker's :class:`agent_core.model_http.ModelEndpoint`, an aiohttp POST of the request body
  our runner has already built: HTTP to the fake, the fake's own work, reading and decoding
  the answer; a peer: its stub model). It is reported separately and subtracted from the
  timings. Building our request body happens before ``post``, inside our windows.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import platform
import random
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, cast, get_args

from openai import AsyncOpenAI
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from agent_core.event_loop import EventLoopChoice
from tests.redis_counting import request_commands

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- statistics
def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p99(xs: Sequence[float]) -> float:
    """Nearest-rank 99th percentile (the maximum for fewer than 100 samples)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-99 * len(s) // 100) - 1))
    return s[k]


def ms(x: float) -> str:
    if x != x:  # NaN
        return "n/a"
    v = x * 1000
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def kb(x: float) -> str:
    if x != x:
        return "n/a"
    return f"{x:.0f} B" if x < 1024 else f"{x / 1024:.1f} KiB"


def ratio(a: float, b: float) -> str:
    if b <= 0 or a != a or b != b:
        return "n/a"
    return f"{a / b:.1f}x"


# --------------------------------------------------------------------------- Redis traffic
@dataclass
class Traffic:
    """What one role's clients sent to Redis: round trips and bytes (= Redis input bytes)."""

    round_trips: int = 0
    bytes_out: int = 0
    # When a Counter: the name of every command sent (a pipeline's each), lower case. Off by
    # default: parsing what is sent costs time inside the windows (the profile turns it on).
    names: Counter[str] | None = field(default=None, compare=False)

    def snapshot(self) -> Traffic:
        return Traffic(self.round_trips, self.bytes_out)

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(self.round_trips - other.round_trips, self.bytes_out - other.bytes_out)

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.round_trips + other.round_trips, self.bytes_out + other.bytes_out)


class _CountingConnection(Connection):
    traffic: Traffic  # set on the per-client subclass

    async def send_packed_command(
        self, command: bytes | str | Any, check_health: bool = True
    ) -> None:
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        command = list(command)
        self.traffic.round_trips += 1
        self.traffic.bytes_out += sum(len(c) for c in command)
        if self.traffic.names is not None:
            self.traffic.names.update(command_names(b"".join(command)))
        await super().send_packed_command(command, check_health)


def command_names(packed: bytes) -> list[str]:
    """The command names in a packed (RESP) request: one per command of a pipeline."""
    return [args[0].decode().lower() for args in request_commands(packed)]


def count_traffic(client: Redis, traffic: Traffic) -> Redis:
    """Make every connection of ``client`` (not yet connected) count into ``traffic``."""
    pool = client.connection_pool
    if pool.connection_class is not Connection:
        raise TypeError(f"cannot count traffic over {pool.connection_class.__name__}")
    pool.connection_class = type("CountingConnection", (_CountingConnection,), {"traffic": traffic})
    return client


@dataclass
class ServerStats:
    """A snapshot (or a difference) of the server's traffic counters."""

    net_in: int
    net_out: int
    by_cmd: dict[str, int]  # INFO commandstats calls, INFO itself left out
    usec: dict[str, int] = field(default_factory=dict)  # INFO commandstats usec, the same way

    @property
    def calls(self) -> int:
        """Commands executed, including those a Lua script ran (redis.call)."""
        return sum(self.by_cmd.values())

    def __sub__(self, other: ServerStats) -> ServerStats:
        cmds = {
            k: v - other.by_cmd.get(k, 0)
            for k, v in self.by_cmd.items()
            if v - other.by_cmd.get(k, 0)
        }
        usec = {
            k: v - other.usec.get(k, 0) for k, v in self.usec.items() if v - other.usec.get(k, 0)
        }
        return ServerStats(self.net_in - other.net_in, self.net_out - other.net_out, cmds, usec)

    def __add__(self, other: ServerStats) -> ServerStats:
        def add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
            return {k: a.get(k, 0) + b.get(k, 0) for k in {*a, *b}}

        return ServerStats(
            self.net_in + other.net_in,
            self.net_out + other.net_out,
            add(self.by_cmd, other.by_cmd),
            add(self.usec, other.usec),
        )


class ServerProbe:
    """Reads ``INFO stats commandstats`` on a client of its own; subtracts its own cost."""

    def __init__(self, url: str) -> None:
        self.redis = Redis.from_url(url, decode_responses=True)
        self.overhead = ServerStats(0, 0, {})

    async def snapshot(self) -> ServerStats:
        info = await self.redis.info("stats", "commandstats")
        stats = {
            k.removeprefix("cmdstat_"): v
            for k, v in info.items()
            if k.startswith("cmdstat_") and k != "cmdstat_info" and isinstance(v, dict)
        }
        return ServerStats(
            int(info["total_net_input_bytes"]),
            int(info["total_net_output_bytes"]),
            {k: int(v["calls"]) for k, v in stats.items()},
            {k: int(v["usec"]) for k, v in stats.items()},
        )

    async def calibrate(self, n: int = 9) -> None:
        """The counters' growth between two back-to-back snapshots (the INFO call itself)."""
        deltas = []
        for _ in range(n):
            a = await self.snapshot()
            b = await self.snapshot()
            deltas.append(b - a)
        self.overhead = ServerStats(
            int(median([d.net_in for d in deltas])), int(median([d.net_out for d in deltas])), {}
        )

    def delta(self, before: ServerStats, after: ServerStats) -> ServerStats:
        d = after - before
        return ServerStats(
            d.net_in - self.overhead.net_in, d.net_out - self.overhead.net_out, d.by_cmd, d.usec
        )

    async def aclose(self) -> None:
        await self.redis.aclose()


# --------------------------------------------------------------------------- model timing
@dataclass
class ModelCall:
    """One model call as its caller saw it: ``start`` → ``end``; ``body_bytes`` the size of
    the request body posted (ours; 0 for a stub model, which gets its list as it is)."""

    start: float
    end: float = 0.0
    body_bytes: int = 0

    @property
    def seconds(self) -> float:
        return self.end - self.start


Hook = Callable[[], Awaitable[None]]


@dataclass
class ModelClock:
    """Every model call of one framework, timed where the framework calls its model.

    ``before`` and ``after``, when set, are awaited just before and just after each timed
    call of a wrapped endpoint, inside the call's time (which no window counts): the profile
    of one cycle (:mod:`tests.bench.profile_cycle`) pauses its profiler and reads the
    server's counters there.
    """

    calls: list[ModelCall] = field(default_factory=list)
    before: Hook | None = None
    after: Hook | None = None

    @contextlib.contextmanager
    def timing(self) -> Iterator[ModelCall]:
        """Time a block as one model call (a stub model's body, a node's model call)."""
        call = ModelCall(time.perf_counter())
        try:
            yield call
        finally:
            call.end = time.perf_counter()
            self.calls.append(call)

    def wrap(self, client: AsyncOpenAI) -> AsyncOpenAI:
        """Time ``chat.completions.create`` and ``post("/chat/completions")`` of an OpenAI
        client (a call inside the other is counted once). Our worker posts through its
        :class:`~agent_core.model_http.ModelEndpoint` (:meth:`wrap_endpoint`); it falls back to
        the client's ``post`` only for providers that need openai-python's authentication."""
        completions = client.chat.completions
        create: Callable[..., Awaitable[Any]] = completions.create
        post: Callable[..., Awaitable[Any]] = client.post
        current: contextvars.ContextVar[bool] = contextvars.ContextVar("current", default=False)

        async def timed(call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
            if current.get():
                return await call(*args, **kwargs)
            with self.timing():
                token = current.set(True)
                try:
                    return await call(*args, **kwargs)
                finally:
                    current.reset(token)

        async def timed_create(*args: Any, **kwargs: Any) -> Any:
            return await timed(create, *args, **kwargs)

        async def timed_post(path: str, *args: Any, **kwargs: Any) -> Any:
            if path != "/chat/completions":
                return await post(path, *args, **kwargs)
            return await timed(post, path, *args, **kwargs)

        completions.create = timed_create  # type: ignore[method-assign]
        client.post = timed_post  # type: ignore[method-assign]
        return client

    def wrap_endpoint(self, endpoint: Any) -> None:
        """Time a worker's :class:`agent_core.model_http.ModelEndpoint` calls: the aiohttp
        POST, the fake's work, reading and decoding the answer. The body was built by the
        runner before ``post`` is called: that counts in the caller's own windows."""
        post: Callable[[bytes], Awaitable[Any]] = endpoint.post

        async def timed_post(body: bytes) -> Any:
            with self.timing() as record:
                record.body_bytes = len(body)
                if self.before is not None:
                    await self.before()
                try:
                    return await post(body)
                finally:
                    if self.after is not None:
                        await self.after()

        endpoint.post = timed_post

    def within(self, a: float, b: float) -> list[ModelCall]:
        return [c for c in self.calls if c.start >= a and c.end <= b]

    def time_within(self, a: float, b: float) -> float:
        return sum(c.seconds for c in self.within(a, b))


# --------------------------------------------------------------------------- keys
def each_shard(keys: Any, name: str, *args: Any) -> list[str]:
    """Every shard's key of a per-shard stream or index (``keys.events(shard)``,
    ``keys.user_runs(user, shard)``…), or the one key of a layout without shards."""
    method = getattr(keys, name)
    shards = getattr(keys, "all_shards", None)
    if shards is None:
        return [method(*args)]
    return [method(*args, shard) for shard in shards()]


# --------------------------------------------------------------------------- workload
_WORDS = (
    "the deploy of service alpha failed on node seven because the disk quota was exceeded "
    "please check the logs rotate them and retry the rollout after the backup completes "
    "user reported latency spikes in region west between noon and two while the cache warmed"
).split()


def prior_messages(n: int, seed: int = 7) -> list[dict[str, str]]:
    """``n`` prior chat messages of ~200 characters, alternating assistant / user (fresh
    dicts on every call).

    They follow the run's first user message (the task), so with an even ``n`` the history
    ends with a user message and the model request is valid.
    """
    return [{"role": role, "content": text} for role, text in _prior_texts(n, seed)]


@functools.lru_cache(maxsize=16)
def _prior_texts(n: int, seed: int) -> tuple[tuple[str, str], ...]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words: list[str] = []
        length = 0
        while length < 200:
            words.append(rng.choice(_WORDS))
            length += len(words[-1]) + 1
        out.append(("assistant" if i % 2 == 0 else "user", " ".join(words)[:200]))
    return tuple(out)


# --------------------------------------------------------------------------- machine
def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def bench_event_loop() -> EventLoopChoice:
    """The loop the bench's processes run on: ``EVENT_LOOP`` as the gateway reads it."""
    choice = os.environ.get("EVENT_LOOP", "auto")
    if choice not in get_args(EventLoopChoice):
        raise SystemExit(f"EVENT_LOOP={choice!r}: auto, uvloop or asyncio")
    return cast(EventLoopChoice, choice)


def machine() -> dict[str, str]:
    """The machine and software the figures come from."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    return {
        "cpus": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "os": platform.platform(),
        "python": platform.python_version(),
        "redis": _run(["redis-server", "--version"]).replace("Redis server ", ""),
        "redis-py": _version("redis"),
        "openai": _version("openai"),
        "openai-agents": _version("openai-agents"),
        "langgraph": _version("langgraph"),
        "langchain-core": _version("langchain-core"),
        "langgraph-checkpoint-redis": _version("langgraph-checkpoint-redis"),
        "redisvl": _version("redisvl"),
        "uvloop": _version("uvloop"),
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
