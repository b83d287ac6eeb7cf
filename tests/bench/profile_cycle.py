"""Where ours' pause + resume time goes: many cycles at one history size, taken apart.

After the measured repetitions, the pause benchmark runs ``2 x reps`` more cycles of ours
(this process's worker pauses and resumes; nothing else runs), alternately plain and under
:mod:`cProfile`. Both kinds are measured *only inside the two windows*: from model turn 1's
answer to the durable pause, and from the first decision to the final answer with model
turn 2 cut out. The switch points are the worker's job end
(:attr:`tests.bench.pause.BenchWorker.after_job`), the decision, and the model call
(:attr:`tests.bench.common.ModelClock.before` / ``after``, which also read the server's
``INFO commandstats`` there, so the server's figures cover the same windows).

* The plain cycles give the split that the profiler cannot distort: the windows' wall clock,
  this process's CPU in them (``time.process_time``), and the rest, waiting: for Redis'
  replies (the server's part from ``INFO commandstats`` ``usec``: Lua scripts, ``EVALSHA``,
  and the commands sent directly, their ``usec`` per call times the calls the clients sent,
  counted client-side), for the other side's wake-up, for a CPU when the machine is busy.
* The profiled cycles split this process's CPU: every function's own time (cProfile's
  ``tottime``) is charged to one area, a built-in (``str.join``, a socket ``send``…) to the
  area of the Python function that called it: the socket calls of the round trips, redis-py
  (packing commands, parsing replies with hiredis), JSON (the ``json`` module), the request
  body build (``Runner.request_body``), asyncio (event loop, tasks, streams: the hand-offs
  between coroutines), agent_core's own Python, the rest. Their shares of the profiled CPU
  (the event loop idle in ``epoll`` left out) are applied to the plain cycles' CPU: cProfile's
  per-call cost inflates Python calls more than C built-ins, so read them as estimates.
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agent_core import Decision, RunStatus
from tests.bench.common import ServerStats, median, ms
from tests.bench.fake_model import GATED_USERS
from tests.bench.pause import OURS, Ours, PauseResults

WAIT = "waiting for Redis (event loop idle in epoll)"
SOCKET = "socket send/recv (loopback: the kernel wakes the reader; a busy machine switches here)"
JSON = "JSON encode/decode (json module)"
BODY = "request body build (Runner.request_body)"
REDIS_PY = "redis-py client (packing commands, parsing replies: hiredis)"
ASYNCIO = "asyncio: event loop, tasks, futures, streams (the hand-offs between coroutines)"
OURS_PY = "agent_core's own Python (worker, runner, gateway, typed replies)"
OTHER = "other (stdlib, the bench's counters)"
AREAS = (WAIT, SOCKET, JSON, BODY, REDIS_PY, ASYNCIO, OURS_PY, OTHER)

Func = tuple[str, int, str]


@dataclass
class Tally:
    """One kind of cycles (plain or profiled), summed over its repetitions."""

    reps: int = 0
    windows: float = 0.0  # wall clock of the windows
    cpu: float = 0.0  # this process's CPU in the windows
    server: ServerStats = field(default_factory=lambda: ServerStats(0, 0, {}))
    sent: Counter[str] = field(default_factory=Counter)  # commands the clients sent
    round_trips: int = 0

    @property
    def lua_usec(self) -> int:
        return self.server.usec.get("evalsha", 0) + self.server.usec.get("eval", 0)

    @property
    def direct_usec(self) -> float:
        """Server time of the commands the clients sent themselves (not from a script)."""
        total = 0.0
        for name, sent in self.sent.items():
            calls = self.server.by_cmd.get(name, 0)
            if name in ("evalsha", "eval") or not calls:
                continue
            total += self.server.usec.get(name, 0) * min(sent, calls) / calls
        return total


@dataclass
class CycleProfile:
    n: int  # history size (pairs)
    plain: Tally = field(default_factory=Tally)
    profiled: Tally = field(default_factory=Tally)
    by_area: dict[str, float] = field(default_factory=dict)  # profiled own times, seconds
    top: list[tuple[str, float]] = field(default_factory=list)  # own time, top functions


def _area(func: Func) -> str | None:
    """The area of a function's own time; None for a built-in (charged to its callers)."""
    path, _line, name = func
    if path == "~":
        if "poll" in name and ("epoll" in name or "select" in name):
            return WAIT
        if "_socket.socket" in name and ("send" in name or "recv" in name):
            return SOCKET
        if "_json" in name:
            return JSON
        if "hiredis" in name:
            return REDIS_PY
        return None
    if "/json/" in path:
        return JSON
    if path.endswith("agent_core/runner.py") and name in ("request_body", "_head"):
        return BODY
    if "/redis/" in path:
        return REDIS_PY
    if "/asyncio/" in path or path.endswith("/selectors.py"):
        return ASYNCIO
    if "/agent_core/" in path:
        return OURS_PY
    return OTHER


def _charge(stats: dict[Func, Any]) -> dict[str, float]:
    out = dict.fromkeys(AREAS, 0.0)
    for func, (_cc, _nc, tt, _ct, callers) in stats.items():
        area = _area(func)
        if area is not None:
            out[area] += tt
            continue
        for caller, (_c, _n, ctt, _cct) in callers.items():
            out[_area(caller) or OTHER] += ctt
    return out


def _label(func: Func) -> str:
    path, line, name = func
    if path == "~":
        return name
    for cut in ("/site-packages/", "/lib/python3", "/agent_core/", "/tests/"):
        if cut in path:
            path = path.rsplit(cut, 1)[1]
            if cut in ("/agent_core/", "/tests/"):
                path = cut.strip("/") + "/" + path
            break
    return f"{path}:{line}({name})"


async def profile_cycle(ours: Ours, n: int, reps: int) -> CycleProfile:
    """``reps`` plain and ``reps`` profiled cycles of ``ours`` at ``n`` pairs, alternating."""
    prof = cProfile.Profile()
    result = CycleProfile(n)
    probe, worker, clock = ours.probe, ours.worker, ours.clock
    tally = result.plain
    profiling = False
    opened: ServerStats | None = None  # the server's counters where the window opened
    at = (0, 0.0)  # round trips and CPU where the window opened

    def start() -> None:
        nonlocal at
        ours.worker_traffic.names = ours.bot_traffic.names = tally.sent
        at = (ours.traffic().round_trips, time.process_time())
        if profiling:
            prof.enable()

    def stop() -> None:
        if ours.worker_traffic.names is None:
            return
        if profiling:
            prof.disable()
        tally.cpu += time.process_time() - at[1]
        tally.round_trips += ours.traffic().round_trips - at[0]
        ours.worker_traffic.names = ours.bot_traffic.names = None

    async def close_server() -> None:
        nonlocal opened
        if opened is not None:
            tally.server = tally.server + probe.delta(opened, await probe.snapshot())
        opened = None

    async def before_model() -> None:
        stop()
        await close_server()  # model turn 2: the resume window pauses here

    async def after_model() -> None:
        nonlocal opened
        opened = await probe.snapshot()
        start()

    clock.before, clock.after, worker.after_job = before_model, after_model, stop
    try:
        for i in range(2 * reps):
            profiling = i % 2 == 1
            tally = result.profiled if profiling else result.plain
            run_id = await ours._new_run(n)
            gc.collect()
            t0 = time.perf_counter()
            worker.hold.set()
            t1 = await ours._job_done()
            await close_server()
            gates = await ours.gateway.pending_gates(run_id)
            assert len(gates) == len(GATED_USERS), gates
            opened = await probe.snapshot()
            t2 = time.perf_counter()
            start()
            for gate in gates:
                assert (await ours.gateway.decide(gate, Decision.APPROVE, by="U")).applied
            t4 = await ours._job_done()
            await close_server()
            first, second = clock.within(t0, t1), clock.within(t2, t4)
            assert len(first) == 1 and len(second) == 1, (first, second)
            tally.windows += (t1 - first[0].end) + (t4 - t2 - second[0].seconds)
            tally.reps += 1
            ours.tool.started = None
            run = await ours.gateway.get_run(run_id)
            assert run is not None and run.status is RunStatus.COMPLETED, run
    finally:
        stop()
        clock.before = clock.after = worker.after_job = None
    stats: dict[Func, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    result.by_area = _charge(stats)
    own = sorted(((tt, f) for f, (_c, _n, tt, _ct, _cl) in stats.items()), reverse=True)
    result.top = [(_label(f), tt) for tt, f in own[:8]]
    return result


Table = tuple[str, list[str], list[list[str]]]


def profile_tables(res: PauseResults) -> list[Table]:
    p = res.profile
    if p is None or not p.plain.reps or not p.profiled.reps:
        return []
    plain, prof = p.plain, p.profiled
    per = 1 / plain.reps
    wall, cpu = plain.windows, plain.cpu
    wait = wall - cpu
    lua, direct = plain.lua_usec / 1e6, plain.direct_usec / 1e6
    busy = {a: t for a, t in p.by_area.items() if a != WAIT}  # profiled CPU by area
    busy_total = sum(busy.values())

    def row(label: str, seconds: float, profiled: float | None = None) -> list[str]:
        return [
            label,
            ms(seconds * per),
            f"{seconds / wall * 100:.0f}%" if wall else "n/a",
            ms(profiled / prof.reps) if profiled is not None else "",
        ]

    rows = [
        row("**the windows, wall clock** (pause + resume, model turn 2 cut out)", wall),
        row("waiting: wall clock minus this process's CPU", wait),
        row("… of it, Lua scripts running on the server (`EVALSHA` usec)", lua),
        row("… of it, the commands sent directly, on the server (usec)", direct),
        row(
            "… of it, the rest: loopback, the other side's wake-up, waiting for a CPU",
            wait - lua - direct,
        ),
        row("**this process's CPU** (`process_time`)", cpu, busy_total),
    ]
    for area in AREAS:
        if area != WAIT:
            share = busy[area] / busy_total if busy_total else 0.0
            rows.append(row(f"… {area}", cpu * share, busy[area]))
    sent = ", ".join(f"{k.upper()} {v * per:.0f}" for k, v in plain.sent.most_common())
    rows.append(
        [
            "round trips per cycle (the clients' sends inside the windows; commands sent)",
            f"{plain.round_trips * per:.0f}",
            sent or "n/a",
            "",
        ]
    )
    rows.append(
        [
            "for reference: the measured median cycle above; the profiled cycles' wall clock",
            ms(median([s.cycle for s in res.of(OURS, p.n)])),
            "",
            ms(prof.windows / prof.reps),
        ]
    )
    total = sum(p.by_area.values())
    top = [
        [name, ms(tt / prof.reps), f"{tt / total * 100:.0f}%" if total else ""]
        for name, tt in p.top
    ]
    return [
        (
            f"Where ours' cycle goes at {p.n:,} pairs: {plain.reps} plain cycles (ms per "
            f"cycle, share of the windows), this process's CPU split by {prof.reps} cycles "
            "under cProfile (their shares applied; last column: their own ms, inflated)",
            ["area", "ms per cycle", "share", "under cProfile (ms per cycle)"],
            rows,
        ),
        (
            "The functions with the most own time in the profiled windows (ms per cycle, "
            "under cProfile; the event loop's idle epoll included)",
            ["function", "ms per cycle", "share"],
            top,
        ),
    ]
